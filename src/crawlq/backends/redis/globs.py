"""Glob patterns (fnmatch's dialect: `*`, `?`, `[seq]`, `[!seq]`) as anchored Lua patterns, so
limit rules and group filters match inside Redis scripts exactly as `fnmatchcase` does."""

from __future__ import annotations

_LUA_MAGIC = frozenset("^$()%.[]*+-?")


def _literal(ch: str) -> str:
    return "%" + ch if ch in _LUA_MAGIC else ch


def _char_class(body: str) -> str:
    negate = body.startswith("!")
    if negate:
        body = body[1:]
    out: list[str] = []
    i = 0
    while i < len(body):
        if i + 2 < len(body) and body[i + 1] == "-":
            low, high = body[i], body[i + 2]
            if low > high:  # fnmatch drops empty ranges
                pass
            elif low in _LUA_MAGIC or high in _LUA_MAGIC:
                # Lua reads no range between escaped ends (%%-%^): list the characters.
                out.extend(_literal(chr(c)) for c in range(ord(low), ord(high) + 1))
            else:
                out.append(f"{low}-{high}")
            i += 3
        else:
            out.append(_literal(body[i]))
            i += 1
    if not out:  # empty ranges only: no character (Lua refuses [] and [^] as malformed)
        return "." if negate else "[^%w%W]"
    return ("[^" if negate else "[") + "".join(out) + "]"


def lua_pattern(glob: str) -> str:
    """`glob` as a Lua pattern matching the whole subject."""
    out = ["^"]
    i, n = 0, len(glob)
    while i < n:
        ch = glob[i]
        i += 1
        if ch == "*":
            out.append(".*")
        elif ch == "?":
            out.append(".")
        elif ch == "[":
            # As fnmatch: a leading ! or ] belongs to the set; without a closing ] it is literal.
            j = i
            if j < n and glob[j] == "!":
                j += 1
            if j < n and glob[j] == "]":
                j += 1
            while j < n and glob[j] != "]":
                j += 1
            if j >= n:
                out.append("%[")
            else:
                body = glob[i:j]
                out.append(_char_class(body) if body not in ("", "!") else "%[" + body + "%]")
                i = j + 1
        else:
            out.append(_literal(ch))
    out.append("$")
    return "".join(out)
