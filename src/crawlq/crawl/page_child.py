"""The child process of page_reader.py: reads pages for their links, one at a time, until its
input ends or its parent dies. It says `ready` first, once it can.

It imports only links.py and urls.py (page_reader starts it without crawlq's package
imports). Each request on stdin is a line `<url bytes> <html bytes>` then those bytes, the
HTML in UTF-8 (lone surrogates passed through); each reply on stdout a line `<bytes>` then a
JSON object: `title`, `links`, `nofollow`, `dropped`, or `error` if reading the page raised.
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import sys

from .links import extract

PR_SET_PDEATHSIG = 1


def main(parent: int) -> None:
    """Serves requests until stdin ends; `parent` is the pid of the process that started it."""
    _die_with_parent(parent)
    requests, replies = sys.stdin.buffer, sys.stdout.buffer
    replies.write(b"ready\n")
    replies.flush()
    while head := requests.readline():
        url_size, html_size = (int(size) for size in head.split())
        url = requests.read(url_size).decode()
        html = requests.read(html_size).decode("utf-8", "surrogatepass")
        try:
            page = extract(html, url)
            reply = {
                "title": page.title,
                "links": page.links,
                "nofollow": page.nofollow,
                "dropped": page.dropped,
            }
        except Exception as exc:  # told to the parent, which raises it for its page
            reply = {"error": f"{type(exc).__name__}: {exc}"}
        data = json.dumps(reply).encode()
        replies.write(b"%d\n%b" % (len(data), data))
        replies.flush()


def _die_with_parent(parent: int) -> None:
    """A parse can run for hours: the child must not outlive a worker killed meanwhile."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent:  # it died before prctl
        sys.exit(0)
