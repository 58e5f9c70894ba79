"""One parser per format the partners send, each returning rows of text with the same four
fields: product, region, units, revenue. Plain functions: test them on a saved file."""

from __future__ import annotations

import csv
import io
import json

from selectolax.lexbor import LexborHTMLParser

Row = dict[str, str]


def parse_html(text: str) -> list[Row]:
    table = LexborHTMLParser(text).css_first("table.sales")
    if table is None:
        return []
    cells = [[td.text(strip=True) for td in tr.css("td")] for tr in table.css("tr")]
    return [
        {"product": p, "region": r, "units": u, "revenue": v}
        for p, r, u, v in (row for row in cells if len(row) == 4)
    ]


def parse_csv(text: str) -> list[Row]:
    lines = [line for line in text.splitlines() if line and not line.startswith("#")]
    return [
        {
            "product": row["Product"],
            "region": row["Region"],
            "units": row["Units"],
            "revenue": row["Revenue EUR"],
        }
        for row in csv.DictReader(io.StringIO("\n".join(lines)), delimiter=";")
    ]


def parse_json(text: str) -> list[Row]:
    return [
        {
            "product": str(line["sku"]),
            "region": str(line["area"]),
            "units": str(line["qty"]),
            "revenue": f"{int(line['amount_cents']) / 100:.2f}",
        }
        for line in json.loads(text)["lines"]
    ]


BY_CONTENT_TYPE = {
    "text/html": parse_html,
    "text/csv": parse_csv,
    "application/json": parse_json,
}
