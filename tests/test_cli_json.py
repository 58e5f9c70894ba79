"""Every `--json` of the CLI writes standard JSON, which jq and JSON.parse read: no Infinity
nor NaN. `crawlq stats --json` writes its one infinity, a block for good, as
`blocked_for_good` (tests/test_stats_json.py); `dead list --json` and `limits list --json`
went through an encoder that wrote Infinity and NaN as Python does. No value they print can
be one (limits and Crawl-delays are finite, Limit refuses others; times are clock readings),
so the encoder is made strict, and these tests show that a queue at its extremes (the
longest interval, the largest concurrency, none, a Crawl-delay of 100 years, a group blocked
for good) still gives documents a strict parser reads, unchanged."""

from __future__ import annotations

import asyncio
import json
import math
from typing import Any

import pytest

from crawlq.backends import open_backend
from crawlq.checks import EXACT_INT, MAX_SECONDS
from crawlq.cli.common import echo_json
from crawlq.types import Failure, Limit, LimitRule, QueueConfig, Schedule

from .test_cli import Cli, cli

__all__ = ["cli"]  # test_cli's fixture, used here too


def strict(text: str) -> Any:
    def refuse(constant: str) -> Any:
        raise AssertionError(f"{constant} is no JSON")

    return json.loads(text, parse_constant=refuse)


async def extremes(url: str) -> None:
    """Limits at their bounds, a Crawl-delay of 100 years, a group blocked for good holding
    a queued element, and a dead letter."""
    backend = open_backend(url, create=True)
    await backend.open()
    try:
        await backend.ensure_queues([QueueConfig(name="pages")])
        await backend.set_limits(
            [
                LimitRule(pattern="*", limit=Limit(concurrency=EXACT_INT, interval=MAX_SECONDS)),
                LimitRule(pattern="*.free.test", limit=Limit(), origin="operator"),
            ]
        )
        await backend.raise_crawl_delays({"slow.test": MAX_SECONDS})
        now = backend.now()
        await backend.schedule(
            [
                Schedule(queue="pages", key='"dead"', payload='"dead"', group="", due=now),
                Schedule(queue="pages", key='"held"', payload='"held"', group="gone.test", due=now),
            ]
        )
        await backend.block_group("gone.test", math.inf, "refused us for good")
        [element] = (await backend.claim(["pages"], worker="w", limit=5, lease=60.0)).elements
        await backend.fail([Failure(element=element, error="boom", traceback="tb")])
    finally:
        await backend.close()


def test_every_json_output_is_standard_json_at_the_queue_s_extremes(cli: Cli) -> None:
    asyncio.run(extremes(cli.url))
    outputs = {
        "limits": cli.ok("limits", "list", "--json").out,
        "dead": cli.ok("dead", "list", "pages", "--json").out,
        "stats": cli.ok("stats", "--json").out,
    }
    read = {name: strict(out) for name, out in outputs.items()}
    rules = {rule["pattern"]: rule for rule in read["limits"]["rules"]}
    assert rules["*"]["limit"] == {"concurrency": EXACT_INT, "interval": MAX_SECONDS}
    assert rules["*.free.test"]["limit"] == {"concurrency": None, "interval": 0.0}
    assert read["limits"]["crawl_delays"] == {"slow.test": MAX_SECONDS}
    [letter] = read["dead"]
    assert (letter["key"], letter["error"], letter["attempts"]) == ('"dead"', "boom", 1)
    assert math.isfinite(letter["died_at"])
    [group] = [g for g in read["stats"]["groups"] if g["name"] == "gone.test"]
    assert (group["blocked_for_good"], group["blocked_until"]) == (True, None)
    # The strict encoder wrote what the lenient one did.
    for name in ("limits", "dead"):
        assert outputs[name] == json.dumps(read[name], indent=2, sort_keys=True) + "\n", name


@pytest.mark.parametrize("number", [math.inf, -math.inf, math.nan])
def test_the_cli_s_json_encoder_refuses_what_json_cannot_spell(
    number: float, capsys: pytest.CaptureFixture[str]
) -> None:
    """A value JSON has no spelling for is an error, never a document that jq refuses."""
    with pytest.raises(ValueError, match="not JSON compliant"):
        echo_json({"rules": [{"interval": number}]})
    assert capsys.readouterr().out == ""
    echo_json({"interval": MAX_SECONDS, "concurrency": None})
    assert strict(capsys.readouterr().out) == {"interval": MAX_SECONDS, "concurrency": None}
