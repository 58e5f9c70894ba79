"""Glob patterns in fnmatch's dialect (`[!seq]` negates, `^` is a plain character), as
SQLite's GLOB reads them (`[^seq]` negates), so a group filter matches the same groups on
every backend."""

from __future__ import annotations


def sqlite_glob(pattern: str) -> str:
    out: list[str] = []
    i, n = 0, len(pattern)
    while i < n:
        ch = pattern[i]
        i += 1
        if ch != "[":
            out.append(ch)
            continue
        end = i + 1 if i < n and pattern[i] == "!" else i
        if end < n and pattern[end] == "]":
            end += 1
        while end < n and pattern[end] != "]":
            end += 1
        if end >= n:  # no closing bracket: fnmatch reads a plain "["
            out.append("[[]")
            continue
        body, i = pattern[i:end], end + 1
        if body.startswith("!"):
            out.append("[^" + body[1:] + "]")
        elif body == "^":
            out.append("^")
        elif body.startswith("^"):  # a plain "^", kept out of the first place
            out.append("[" + body[1:] + "^]")
        else:
            out.append("[" + body + "]")
    return "".join(out)
