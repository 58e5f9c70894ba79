"""Reading pages for their links without holding the event loop, and giving up on a page
whose parse runs away.

lexbor's parse grows with the square of the depth of nested blocks (5,000 nested `<div>`
take it 37 ms, 40,000, 200 KB, 4 s, a 10 MB page of them hours) and with the square of the
attributes of one tag (20,000, 129 KB: 0.66 s). Neither can be told from the text cheaply:
attributes need no "<" and quotes hide "<" and ">". So the size decides:
- up to INLINE_CHARS, on the event loop: 40 ms at worst;
- up to THREAD_CHARS, in a thread: lexbor lets go of the GIL while it parses, so the loop
  goes on, and the worst such page costs its thread about half a second;
- larger, in a child process (page_child.py; at most `processes` of them, each reading one
  page at a time), as a thread could not be stopped: a parse past `timeout` seconds has its
  child killed, the page is recorded with reason `timeout` and no links, and the next page
  starts a new child. A page read by a child costs the machine about 0.2 ms more than read
  here (a 35 KB page: 0.31 ms here; 0.15 ms of the loop's and 0.35 of the child's).
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from .errors import FetchError, Reason
from .links import PageLinks, extract

#: Pages of at most this many characters are read on the event loop, of at most
#: THREAD_CHARS in a thread, larger ones in a child process.
INLINE_CHARS = 16 * 1024
THREAD_CHARS = 64 * 1024
PARSE_TIMEOUT = 30.0
PROCESSES = 2

#: What the child runs: page_child.py with the modules it needs (links.py, urls.py) but
#: not crawlq's package imports, which would cost it 0.6 s to start and 50 MB more.
_BOOTSTRAP = """
import sys, types
for name, path in {packages!r}:
    package = types.ModuleType(name)
    package.__path__ = [path]
    sys.modules[name] = package
from crawlq.crawl.page_child import main
main(int(sys.argv[1]))  # says "ready" once it can read pages
"""


def inline(html: str) -> bool:
    """Whether the page is read on the event loop."""
    return len(html) <= INLINE_CHARS


class PageReader:
    """A worker's reader of pages, shared by its tasks."""

    def __init__(self, *, processes: int = PROCESSES, timeout: float | None = None) -> None:
        self.timeout = PARSE_TIMEOUT if timeout is None else timeout
        self._free = asyncio.Semaphore(processes)
        self._idle: list[_Child] = []
        self._threads = ThreadPoolExecutor(processes, thread_name_prefix="crawlq-links")
        self._closed = False

    async def links(self, html: str, url: str) -> PageLinks:
        """The page's title and links; FetchError(TIMEOUT) if reading them took too long."""
        if inline(html):
            return extract(html, url)
        if len(html) <= THREAD_CHARS:
            return await asyncio.get_running_loop().run_in_executor(
                self._threads, extract, html, url
            )
        async with self._free:
            child = self._idle.pop() if self._idle else await _Child.start(self.timeout)
            try:
                page = await asyncio.wait_for(child.read(html, url), self.timeout)
            except TimeoutError:
                await child.kill()
                what = f"links not read: parsing the page took over {self.timeout:g}s"
                raise FetchError(Reason.TIMEOUT, url, what) from None
            except BaseException:  # cancelled, or the child died: its state is unknown
                await child.kill()
                raise
            if self._closed:
                await child.kill()
            else:
                self._idle.append(child)
            return page

    async def aclose(self) -> None:
        """Ends the idle children; a busy one ends with its page."""
        self._closed = True
        self._threads.shutdown(wait=False)
        idle, self._idle = self._idle, []
        for child in idle:
            await child.kill()


class _Child:
    def __init__(self, process: asyncio.subprocess.Process) -> None:
        self.process = process

    @classmethod
    async def start(cls, timeout: float) -> _Child:
        """A child ready to read pages (it took under `timeout` seconds to start)."""
        crawl = Path(__file__).parent
        packages = [("crawlq", str(crawl.parent)), ("crawlq.crawl", str(crawl))]
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-P",  # not the worker's working directory on sys.path: a json.py there
            "-c",
            _BOOTSTRAP.format(packages=packages),
            str(os.getpid()),
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            # Not in the worker's process group: a Ctrl-C meant for the worker, which then
            # finishes its pages, would kill the child reading one (PDEATHSIG ends it).
            start_new_session=True,
        )
        child = cls(process)
        assert process.stdout is not None
        try:
            ready = await asyncio.wait_for(process.stdout.readline(), timeout)
        except BaseException:
            await child.kill()
            raise
        if ready != b"ready\n":
            raise RuntimeError(f"the process to read pages did not start: {await child.ended()}")
        return child

    async def read(self, html: str, url: str) -> PageLinks:
        requests, replies = self.process.stdin, self.process.stdout
        assert requests is not None and replies is not None
        address, body = url.encode(), html.encode("utf-8", "surrogatepass")
        requests.write(b"%d %d\n%b%b" % (len(address), len(body), address, body))
        try:
            await requests.drain()
            head = await replies.readline()
            reply = json.loads(await replies.readexactly(int(head)))
        except (OSError, ValueError, asyncio.IncompleteReadError) as exc:
            raise RuntimeError(f"reading the links of {url}: {await self.ended()}") from exc
        if "error" in reply:
            raise RuntimeError(f"reading the links of {url}: {reply['error']}")
        return PageLinks(
            title=reply["title"],
            links=reply["links"],
            nofollow=reply["nofollow"],
            dropped=reply["dropped"],
        )

    async def kill(self) -> None:
        if self.process.returncode is None:
            self.process.kill()
        await self.process.wait()

    async def ended(self) -> str:
        """Why the child stopped answering (it is killed, if it is still running)."""
        await self.kill()
        return f"its process ended (exit code {self.process.returncode})"
