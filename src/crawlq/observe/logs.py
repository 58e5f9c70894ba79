"""Structured logs: every line logged while a task runs names its queue, element key, attempt,
group and worker, as text or as JSON lines.

The worker enters :func:`task_scope` around each task; a filter on the handler copies the
scope's fields onto every record logged inside it, the task's own log lines included (async
tasks; a sync task sees them when its thread runs in a copy of the task's context).
"""

from __future__ import annotations

import contextvars
import json
import logging
import re
import string
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, TextIO

LEVELS = ("debug", "info", "warning", "error")
FORMATS = ("text", "json")
#: The fields a task's log lines carry, in the order text lines show them.
TASK_FIELDS = ("queue", "key", "attempt", "group", "worker")
KEY_LIMIT = 200

_scope: contextvars.ContextVar[dict[str, Any] | None] = contextvars.ContextVar(
    "crawlq_task_scope", default=None
)


#: user:password@ (or a user alone, often a token) in any URL, however many slashes follow
#: its scheme: the authority ends at the first / ? #, whitespace, quote (a URL inside JSON)
#: or angle bracket (<url> in text), and its userinfo at the last @ in it; the characters
#: no URL should hold raw but a password given to redis-py may ({ } | ^ \ `) do not end
#: it. Found by `redact_userinfo` piece by piece, in time linear in the text: one pattern,
#: `\b scheme : /* info @`, took quadratic time to fail on text like a:a:a:...a: @.
_SCHEME_START = re.compile(r"\b[A-Za-z]")
_SCHEME_REST = re.compile(r"[A-Za-z0-9+.-]*")
_SLASHES = re.compile(r"/*")
_AUTHORITY = re.compile(r"[^/?#\s\"'<>]*")
#: Secrets by name, in query strings and forms (?password=..., &client_secret=...), in
#: keyword arguments (password='...') and in JSON ("token": "..."): a name is matched, then
#: told secret or not by `secret_name` (one pattern of the words would backtrack on long
#: names).
_NAMED_VALUE = re.compile(
    # ?name=value&...: the value runs to & # or whitespace, as a query's does
    r"(?P<qhead>[?&;](?P<qname>[\w.-]+)=)(?P<qvalue>[^&#\s\"'<>]+)"
    # name=value, name='value': the value quoted (escapes kept in), or up to , ; ) too
    r"|(?P<khead>(?:^|[,(\s:])(?P<kname>[\w.-]+)=)"
    r"(?P<kvalue>'(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\"|[^&#\s\"'<>,;)]+)"
    # "name": "value"
    r"|(?P<jhead>(?P<q>[\"'])(?P<jname>[\w.-]+)(?P=q)\s*:\s*)"
    r"(?P<jvalue>\"(?:[^\"\\]|\\.)*\"|'(?:[^'\\]|\\.)*')"
)
_SECRET_WORDS = (
    "password", "passwd", "secret", "token", "apikey", "api_key", "api-key", "credential",
    "session", "sessid", "signature", "passphrase", "passcode", "accesskey", "privatekey",
    "authoriz", "authentic",
)  # fmt: skip
#: Secret as a name, or as one word of a name (X-Auth-Key, access_key, X-Storage-Pass; not
#: author=...).
_SECRET_NAMES = frozenset({"pwd", "pass", "key", "sig", "sid", "auth"})
_NAME_WORDS = re.compile(r"[-_.]")
#: Cookies and API keys in headers written out, to the end of the line (or of the quotes):
#: `Cookie: a=1`, a dict's `'Cookie': 'a=1'`, a pair's `('Cookie', 'a=1')` (a list of headers).
_SECRET_HEADER = re.compile(
    r"(?P<name>\b(?:set-cookie|cookie|x-api-key|api-key|x-auth-token)"
    r"(?P<q>[\"'])?\s*(?(q)[:,]|:)\s*(?(q)[\"']?))"
    r"(?(q)[^\r\n\"']+|[^\r\n]+)",  # a quoted one (a dict's) to its quote
    re.IGNORECASE,
)
#: Any other header written out whose name says it is a secret (`secret_header`):
#: X-Subject-Token: abc, 'X-Session-Id': 'abc'. A name of two words or more, so that prose
#: (key: value) is left alone; the Authorization ones are _AUTH_HEADER's (it keeps the scheme).
_NAMED_HEADER = re.compile(
    r"(?P<name>(?<![\w-])(?P<header>[A-Za-z][A-Za-z0-9]*(?:-[A-Za-z0-9]+)+)"
    r"(?P<q>[\"'])?\s*(?(q)[:,]|:)\s*(?(q)[\"']?))"
    r"(?P<value>(?(q)[^\r\n\"']+|[^\r\n]+))"
)
#: Authorization headers written out: Authorization: Bearer abc, Proxy-Authorization: Basic ...
#: (and as a dict's or a pair's, quoted).
_AUTH_HEADER = re.compile(
    r"(?P<name>authorization(?:[\"']?\s*[:=]|[\"']\s*,)\s*[\"']?"
    r"(?:(?:basic|bearer|digest|token)\s+)?)"
    r"[^\s\"',]+",
    re.IGNORECASE,
)
MASK = "***"


def redact(text: str) -> str:
    """`text` with every credential it carries masked: the user and password of each URL in
    it (``redis://***@host``; a user alone may be a token), secret query parameters
    (``?token=***``) and Authorization headers. The one function for backend URLs, proxy
    URLs, element keys, log lines, error messages and dashboard pages."""
    text = redact_userinfo(text)
    if "=" in text or ":" in text:
        text = _NAMED_VALUE.sub(_masked_value, text)
    if "=" in text or ":" in text or "," in text:
        text = _SECRET_HEADER.sub(lambda m: m.group("name") + MASK, text)
        if "-" in text:
            text = _NAMED_HEADER.sub(_masked_header, text)
    if "uthorization" in text or "UTHORIZATION" in text:
        text = _AUTH_HEADER.sub(lambda m: m.group("name") + MASK, text)
    return text


def _masked_value(match: re.Match[str]) -> str:
    kind = "q" if match.group("qname") else "k" if match.group("kname") else "j"
    if not secret_name(match.group(f"{kind}name")):
        return match.group(0)
    value = match.group(f"{kind}value")
    quote = value[0] if value[0] in "'\"" else ""
    return f"{match.group(f'{kind}head')}{quote}{MASK}{quote}"


def _masked_header(match: re.Match[str]) -> str:
    header = match.group("header").lower()
    if "authorization" in header or not secret_header(header) or match.group("value") == MASK:
        return match.group(0)
    return match.group("name") + MASK


def secret_name(name: str) -> bool:
    """Whether a parameter, field or header called `name` holds a secret by its name."""
    lowered = name.lower()
    return any(word in lowered for word in _SECRET_WORDS) or not _SECRET_NAMES.isdisjoint(
        _NAME_WORDS.split(lowered)
    )


#: Headers whose values are credentials, whatever `secret_name` says of their names.
SECRET_HEADERS = frozenset(
    {"authorization", "proxy-authorization", "cookie", "set-cookie", "set-cookie2"}
)
#: Named like secrets, but no credential: how to log in (a challenge).
_CHALLENGES = frozenset({"www-authenticate", "proxy-authenticate"})


def secret_header(name: str) -> bool:
    """Whether a header called `name` carries a credential: one of SECRET_HEADERS, or named
    as a secret (`secret_name`: X-Api-Key, X-Auth-Token, X-Session-Id); not an Accept-*
    header (it asks for something: Accept-Signature) nor a challenge (WWW-Authenticate)."""
    lowered = name.lower()
    if lowered in SECRET_HEADERS:
        return True
    return not lowered.startswith("accept-") and lowered not in _CHALLENGES and secret_name(lowered)


def redact_userinfo(text: str) -> str:
    """`text` with the user and password of each URL in it masked (``http://***@host/``),
    and nothing else changed: what a URL may become and still be told apart from others.
    Without the two slashes of an authority, only a user:password is masked (so
    ``mailto:bob@example.org`` stays as it is)."""
    if "@" not in text:
        return text
    kept: list[str] = []
    done = pos = 0
    while (start := _SCHEME_START.search(text, pos)) is not None:
        scheme = start.start()
        colon = _end(_SCHEME_REST, text, scheme + 1)
        if text[colon : colon + 1] != ":":
            pos = colon + 1  # no scheme starts later in this run either
            continue
        info = _end(_SLASHES, text, colon + 1)
        end = _end(_AUTHORITY, text, info)
        at = text.rfind("@", info, end)
        if at < 0:
            # Nothing later in this authority has an @ after it either; only a scheme that
            # ends it, right before slashes, starts another.
            pos = end
            if text[end - 1 : end + 1] == ":/" and end - 1 >= info:
                pos = _run_start(text, info, end - 1)
            continue
        if info - colon == 3 or ":" in text[info:at]:  # two slashes, or a password
            kept += (text[done:info], MASK, "@")
            done = at + 1
        pos = at + 1
    kept.append(text[done:])
    return "".join(kept)


def _end(pattern: re.Pattern[str], text: str, pos: int) -> int:
    """Where `pattern` (one that matches the empty string too) stops, from `pos`."""
    match = pattern.match(text, pos)
    assert match is not None
    return match.end()


def _run_start(text: str, floor: int, end: int) -> int:
    """Where the run of scheme characters that ends at `end` starts (not before `floor`)."""
    start = end
    while start > floor and text[start - 1] in _SCHEME_CHARACTERS:
        start -= 1
    return start


_SCHEME_CHARACTERS = frozenset(string.ascii_letters + string.digits + "+.-")


def safe_key(key: str) -> str:
    """An element key fit for a log: its credentials masked (:func:`redact`), length capped."""
    key = redact(key)
    return key if len(key) <= KEY_LIMIT else key[: KEY_LIMIT - 1] + "…"


def task_fields(*, queue: str, key: str, attempt: int, group: str, worker: str) -> dict[str, Any]:
    """A task's fields for its log records; its `key` as it is, masked only when a record is
    logged (`TaskFieldsFilter`): most tasks log nothing, and masking cost every one."""
    return {
        "queue": queue,
        "key": key,
        "attempt": attempt,
        "group": group or None,
        "worker": worker,
    }


@contextmanager
def task_scope(fields: dict[str, Any]) -> Iterator[None]:
    """Every record logged inside carries `fields` (see :func:`task_fields`)."""
    token = _scope.set(fields)
    try:
        yield
    finally:
        _scope.reset(token)


class RedactFilter(logging.Filter):
    """Masks the credentials of a record in place (:func:`redact`), its message, traceback
    and stack, before any handler sees it: the handlers of a program that runs crawlq, or a
    test's, get it masked as well as crawlq's own (whose formatters mask again). A record
    whose message cannot be built is left for the handler to report."""

    _traceback = logging.Formatter()

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:
            return True
        masked = redact(message)
        if masked != message:
            record.msg, record.args = masked, None
        if record.exc_info and not record.exc_text:
            record.exc_text = redact(self._traceback.formatException(record.exc_info))
        elif record.exc_text:
            record.exc_text = redact(record.exc_text)
        if record.stack_info:
            record.stack_info = redact(record.stack_info)
        return True


_REDACT = RedactFilter()


def logger(name: str) -> logging.Logger:
    """The logger called `name`, whose records are masked (:class:`RedactFilter`): what each
    of crawlq's modules logs to, and a task's `ctx.log`."""
    found = logging.getLogger(name)
    if _REDACT not in found.filters:
        found.addFilter(_REDACT)
    return found


class TaskFieldsFilter(logging.Filter):
    """Copies the running task's fields onto a record that does not carry them already, its
    key masked (:func:`safe_key`)."""

    def filter(self, record: logging.LogRecord) -> bool:
        fields = _scope.get()
        if fields:
            for name, value in fields.items():
                if not hasattr(record, name):
                    setattr(record, name, safe_key(value) if name == "key" else value)
        return True


#: C0 controls but tab and newline, DEL, and C1 controls: what a terminal acts on (ESC starts
#: clear-screen, cursor moves, colors, OSC 8 links; a lone C1 CSI does in some terminals);
#: and the line and paragraph separators (str.splitlines splits there) and the bidirectional
#: overrides, which make a line read as other text.
_OTHER_CONTROLS = r"\x0b-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069"
_CONTROLS = re.compile(rf"[\x00-\x08{_OTHER_CONTROLS}]")
#: The same and newline: for cells and fields shown on one line.
_LINE_CONTROLS = re.compile(rf"[\x00-\x08\n{_OTHER_CONTROLS}]")
_NAMED = {"\n": "\\n", "\r": "\\r"}


def _visible(match: re.Match[str]) -> str:
    char = match.group()
    code = ord(char)
    return _NAMED.get(char) or (f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}")


def printable(text: str, *, one_line: bool = False) -> str:
    """`text` as a terminal may show it: each control character but tab and newline (with
    `one_line`, newline too) replaced by its escape, ``\\x1b`` for ESC, ``\\r``, ``\\n``.
    For human-readable output of text others chose (error messages, URLs, group names of
    crawled sites): JSON output escapes them already."""
    pattern = _LINE_CONTROLS if one_line else _CONTROLS
    return pattern.sub(_visible, text) if pattern.search(text) else text


class TextFormatter(logging.Formatter):
    """One line a record (and its traceback): credentials masked, the task fields appended,
    control characters escaped (a message cannot forge a line, nor drive a terminal)."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s")

    def formatMessage(self, record: logging.LogRecord) -> str:
        record.message = printable(record.message, one_line=True)
        return super().formatMessage(record)

    def format(self, record: logging.LogRecord) -> str:
        # A traceback's lines are indented: an exception's message, which may come from a
        # site, cannot start a line that reads as a log line of its own.
        line = printable(redact(super().format(record))).replace("\n", "\n  ")
        named = [
            f"{n}={printable(str(getattr(record, n)), one_line=True)}"
            for n in TASK_FIELDS
            if hasattr(record, n)
        ]
        if not named:
            return line
        head, sep, rest = line.partition("\n")
        return f"{head} [{' '.join(named)}]{sep}{rest}"


class JsonFormatter(logging.Formatter):
    """One JSON object a line: time, level, logger, message, the task fields, any traceback;
    credentials masked."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": redact(record.getMessage()),
        }
        for name in TASK_FIELDS:
            if hasattr(record, name):
                entry[name] = getattr(record, name)
        if record.exc_info:
            entry["traceback"] = redact(self.formatException(record.exc_info))
        return json.dumps(entry, ensure_ascii=False, default=str)


def configure(level: str = "warning", fmt: str = "text", stream: TextIO | None = None) -> None:
    """Sets up the root logger once per process: the level, and text or JSON-lines output."""
    if fmt not in FORMATS:
        raise ValueError(f"log format must be one of {', '.join(FORMATS)}, got {fmt!r}")
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    handler.addFilter(TaskFieldsFilter())
    root = logging.getLogger()
    for old in [h for h in root.handlers if getattr(h, "_crawlq", False)]:
        root.removeHandler(old)
    handler._crawlq = True  # type: ignore[attr-defined]
    root.addHandler(handler)
    root.setLevel(level.upper())
