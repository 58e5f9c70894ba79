"""Canonical values, and the summary by key (report and product) the morning report sums."""

from __future__ import annotations

import re
from collections.abc import Iterable

from crawlq.pipeline import Record

from .parsers import Row


def product_code(raw: str) -> str:
    """ "P-042", "p042", "P 042" -> "P042"."""
    return f"P{int(re.sub(r'[^0-9]', '', raw)):03d}"


def cents(raw: str) -> int:
    """ "1234,50" (decimal comma), "€1,234.50", "1234.50" -> 123450."""
    text = re.sub(r"[^0-9,.]", "", raw)
    if "," in text and ("." not in text or text.rindex(",") > text.rindex(".")):
        text = text.replace(".", "").replace(",", ".")
    else:
        text = text.replace(",", "")
    return round(float(text) * 100)


def summarize(report: str, rows: Iterable[Row]) -> list[Record]:
    """One `sales` record per product of the report: units, revenue and lines summed."""
    totals: dict[str, dict[str, int]] = {}
    for row in rows:
        total = totals.setdefault(
            product_code(row["product"]), {"units": 0, "revenue_cents": 0, "lines": 0}
        )
        total["units"] += int(row["units"])
        total["revenue_cents"] += cents(row["revenue"])
        total["lines"] += 1
    return [
        Record(
            type="sales",
            key=f"{report}/{product}",
            data={"report": report, "product": product, **t},
        )
        for product, t in sorted(totals.items())
    ]
