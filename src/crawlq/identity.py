"""An element's identity inside a queue: its canonical JSON, or a key derived by the task."""

from __future__ import annotations

import hashlib
import json
from typing import Any

from .errors import InvalidElement
from .types import JSON

_ENCODER = json.JSONEncoder(
    sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
)

#: Elements are small references (a URL, a few ids), not documents.
MAX_ELEMENT_BYTES = 64 * 1024


def canonical_json(element: Any, *, queue: str | None = None) -> str:
    """Sorted keys, no insignificant whitespace; rejects anything that is not plain JSON."""
    try:
        text = _ENCODER.encode(element)
    except (TypeError, ValueError) as exc:
        raise InvalidElement(f"not JSON: {exc}", queue=queue) from exc
    if len(text) > MAX_ELEMENT_BYTES:
        raise InvalidElement(
            f"{len(text)} characters of JSON, more than {MAX_ELEMENT_BYTES}", queue=queue
        )
    return text


def parse_json(text: str, *, what: str = "element") -> JSON:
    """Parses JSON given by a person (CLI), with an error that says where it broke."""
    try:
        value: JSON = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InvalidElement(
            f"{what} is not JSON ({exc.msg} at position {exc.pos}): {text!r}"
        ) from None
    return value


def key_hash(key: str) -> int:
    """A signed 64-bit digest of a key, for the bounded "seen" memory."""
    return int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest(), "big", signed=True)
