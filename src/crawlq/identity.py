"""An element's identity inside a queue: its canonical JSON, or a key derived by the task.

What an element may be (anything else is refused with InvalidElement, naming the problem):

- plain JSON: None, bools, ints, finite floats, str, lists (tuples are stored as lists) and
  dicts whose keys are all str; a claim returns exactly what was scheduled;
- at most MAX_ELEMENT_BYTES of canonical JSON in UTF-8 (elements are references: a URL, a few
  ids; store documents elsewhere and queue their address), nested at most MAX_DEPTH deep;
- valid Unicode (no lone surrogates); ints of at most 4,300 digits (Python's own limit).

A key derived by a task's `key=` function follows the same rules of size and Unicode.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from .checks import shorten, unicode_error
from .errors import InvalidElement
from .types import JSON

_ENCODER = json.JSONEncoder(
    sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
)

_CONTAINERS = (dict, list, tuple)
#: Elements are small references (a URL, a few ids), not documents.
MAX_ELEMENT_BYTES = 64 * 1024
#: Lists and dicts nest at most this deep (JSON parsers, Python's included, have a limit).
MAX_DEPTH = 100


def canonical_json(element: Any, *, queue: str | None = None) -> str:
    """Sorted keys, no insignificant whitespace; rejects anything that is not plain JSON."""
    if isinstance(element, _CONTAINERS):
        _check_structure(element, queue)
    try:
        text = _ENCODER.encode(element)
    except ValueError as exc:
        reason = "a float is infinite or NaN" if "float" in str(exc) else str(exc)
        raise InvalidElement(f"not JSON: {reason}", queue=queue) from None
    except TypeError as exc:
        raise InvalidElement(f"not JSON: {exc}", queue=queue) from None
    _check_text(text, "JSON", queue)
    return text


def check_key(key: str, *, queue: str | None = None) -> str:
    """A key derived by a task's `key=` function, refused if it could not be stored."""
    _check_text(key, "key", queue)
    return key


def _check_text(text: str, what: str, queue: str | None) -> None:
    if text.isascii():
        size = len(text)
    else:
        problem = unicode_error(text)
        if problem:
            raise InvalidElement(f"{what} is {problem}", queue=queue)
        size = len(text.encode())
    if size > MAX_ELEMENT_BYTES:
        raise InvalidElement(
            f"{size} bytes of {what}, more than the {MAX_ELEMENT_BYTES} an element may have"
            " (queue a reference to large data, not the data)",
            queue=queue,
        )


def _check_structure(
    element: dict[Any, Any] | list[Any] | tuple[Any, ...], queue: str | None
) -> None:
    """Dict keys are str and nesting stays within MAX_DEPTH; walks without recursion, and
    stops once it has seen more values than an element of the largest size can hold."""
    level: list[Any] = [element]
    depth = seen = 0
    while level:
        depth += 1
        if depth > MAX_DEPTH:
            raise InvalidElement(f"nested more than {MAX_DEPTH} levels deep", queue=queue)
        inner: list[Any] = []
        for value in level:
            seen += len(value)
            if type(value) is dict or isinstance(value, dict):
                for key in value:
                    if type(key) is not str and not isinstance(key, str):
                        raise InvalidElement(
                            f"dict key {repr(key)[:40]} is a {type(key).__name__}, not a string",
                            queue=queue,
                        )
                value = value.values()
            inner += [child for child in value if isinstance(child, _CONTAINERS)]
        if seen > MAX_ELEMENT_BYTES:
            raise InvalidElement(
                f"more than {MAX_ELEMENT_BYTES} values, more than an element may have",
                queue=queue,
            )
        level = inner


def parse_json(text: str, *, what: str = "element") -> JSON:
    """Parses JSON given by a person (CLI), with an error that says where it broke."""
    try:
        value: JSON = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InvalidElement(
            f"{what} is not JSON ({exc.msg} at position {exc.pos}): {shorten(text)}"
        ) from None
    except RecursionError:
        raise InvalidElement(f"{what} is nested more than {MAX_DEPTH} levels deep") from None
    except ValueError as exc:  # an int of more than 4,300 digits
        raise InvalidElement(f"{what} is not usable JSON: {exc}") from None
    return value


def key_hash(key: str) -> int:
    """A signed 64-bit digest of a key, for the bounded "seen" memory."""
    return int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest(), "big", signed=True)
