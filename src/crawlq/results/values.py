"""A record's field values in SQLite columns, and read back as they were written.

A string, number or None is its column's value, so indexes, SQL and exports see it as it
is. What a column value cannot say by itself is noted in the row's `_kinds` column, a JSON
object from field name to kind, NULL when there is nothing to note:

    json    a list or dict, kept as its JSON text (dict keys in their order)
    bool    True or False, kept as 1 or 0
    null    None: the record has the field (a NULL alone is a field the record lacks)

Rows written before `_kinds` existed (or by a crawlq without it) read as they always did:
nested values as their JSON text, booleans as 1 and 0.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from ..types import JSON

KINDS = "_kinds"
Scalar = str | int | float | None

_INT64 = range(-(2**63), 2**63)
_COMPACT = (",", ":")


def value_problem(value: object) -> str | None:
    """Why `value` cannot be a field's value (None if it can): JSON only (str, int, float,
    bool, None, and lists and dicts of them with text keys), no NaN or infinity, top-level
    ints in int64 (SQLite's INTEGER; nested ones are kept in the field's JSON text), text
    that UTF-8 can hold (`text_problem`)."""
    if value is None or isinstance(value, bool):
        return None
    if isinstance(value, str):
        return text_problem(value)
    if isinstance(value, int):
        return None if value in _INT64 else f"{value} does not fit a 64-bit integer"
    if isinstance(value, float):
        return None if math.isfinite(value) else f"{value} is not a JSON number"
    if isinstance(value, dict | list | tuple):
        try:
            text = json.dumps(value, allow_nan=False, ensure_ascii=False)
        except (TypeError, ValueError) as exc:
            return f"not JSON: {exc}"
        return _key_problem(value) or text_problem(text)
    return f"{type(value).__name__} {value!r} is not a JSON value"


def text_problem(text: str) -> str | None:
    """Why `text` cannot be stored (None if it can): a lone surrogate (JSON text cut inside a
    pair, bytes decoded with surrogateescape), which UTF-8, so SQLite and every export, cannot
    hold."""
    if text.isascii():
        return None
    try:
        text.encode()
    except UnicodeEncodeError as exc:
        near = text[max(0, exc.start - 20) : exc.end + 20]
        return f"text {near!r} has a lone surrogate {text[exc.start]!r}, which UTF-8 cannot hold"
    return None


def _key_problem(value: object) -> str | None:
    """A dict key that is not text: JSON would turn it into text, so it would not read back
    as written."""
    inner: Iterable[object]
    if isinstance(value, dict):
        for key in value:
            if not isinstance(key, str):
                return f"not JSON: dict key {key!r} is not a string"
        inner = value.values()
    elif isinstance(value, list | tuple):
        inner = value
    else:
        return None
    return next(filter(None, map(_key_problem, inner)), None)


def encode(data: Mapping[str, JSON]) -> tuple[list[Scalar], str | None]:
    """`data`'s column values, in its order, and the `_kinds` to store beside them."""
    values: list[Scalar] = []
    kinds: dict[str, str] = {}
    for name, value in data.items():
        if isinstance(value, bool):
            kinds[name] = "bool"
            values.append(int(value))
        elif isinstance(value, dict | list | tuple):
            kinds[name] = "json"
            values.append(json.dumps(value, separators=_COMPACT))
        else:
            if value is None:
                kinds[name] = "null"
            values.append(value)
    return values, json.dumps(kinds, separators=_COMPACT) if kinds else None


Row = Sequence[Any]
_CONVERT: dict[str, Callable[[Any], Any]] = {"json": json.loads, "bool": bool}


def row_reader(
    names: Sequence[str], fields: Sequence[tuple[int, str]], *, lacking: bool
) -> Callable[[Row], dict[str, Any]]:
    """Reads `fields` (column index, name) of rows of columns `names` as they were written.
    Fields a record lacks are None if `lacking`, otherwise left out."""

    def plain(row: Row) -> dict[str, Any]:
        if lacking:
            return {name: row[i] for i, name in fields}
        return {name: row[i] for i, name in fields if row[i] is not None}

    if KINDS not in names:  # a table of a store from before `_kinds`
        return plain
    at = names.index(KINDS)
    # the same few `_kinds` come back row after row: each is parsed once
    plans: dict[str, tuple[list[tuple[str, Callable[[Any], Any]]], frozenset[str]]] = {}

    def read(row: Row) -> dict[str, Any]:
        kinds = row[at]
        if kinds is None:
            return plain(row)
        plan = plans.get(kinds)
        if plan is None:
            noted: dict[str, str] = json.loads(kinds)
            convert = [(name, _CONVERT[kind]) for name, kind in noted.items() if kind in _CONVERT]
            plan = plans[kinds] = (convert, frozenset(n for n, k in noted.items() if k == "null"))
        convert, given_none = plan
        if lacking:
            out = {name: row[i] for i, name in fields}
        else:
            out = {name: row[i] for i, name in fields if row[i] is not None or name in given_none}
        for name, to_value in convert:
            value = out.get(name)
            if value is not None:
                out[name] = to_value(value)
        return out

    return read
