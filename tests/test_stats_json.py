"""`crawlq stats --json` and the dashboard's `/api/stats` write standard JSON, the same
document: a group blocked for good was `"blocked_until": Infinity`, which Python reads but
jq and JavaScript's JSON.parse refuse. The real CLI and the real `crawlq dashboard` in
subprocesses on one real SQLite file (tests/test_cli.py's harness), read by the real jq and
node."""

from __future__ import annotations

import asyncio
import json
import math
import re
import subprocess
import sys
import urllib.request
from typing import Any

from crawlq.backends import open_backend
from crawlq.types import QueueConfig, Schedule

from .test_cli import Cli, cli

__all__ = ["cli"]  # test_cli's fixture, used here too


async def _block(url: str) -> None:
    """forever.test blocked for good, later.test for an hour, free.test not at all."""
    backend = open_backend(url, create=True)
    await backend.open()
    try:
        await backend.ensure_queues([QueueConfig(name="pages")])
        await backend.schedule(
            [
                Schedule(queue="pages", key=f'"{g}"', payload='"x"', group=g, due=0)
                for g in ("forever.test", "later.test", "free.test")
            ]
        )
        await backend.block_group("forever.test", math.inf, "refused us for good")
        await backend.block_group("later.test", backend.now() + 3600, "asked for a pause")
    finally:
        await backend.close()


def _strict(text: str) -> Any:
    def refuse(constant: str) -> Any:
        raise AssertionError(f"{constant} is no JSON")

    return json.loads(text, parse_constant=refuse)


def _api_stats(cli: Cli) -> str:
    """/api/stats of a `crawlq dashboard` (no token) on the same file."""
    with subprocess.Popen(
        [sys.executable, "-m", "crawlq", "dashboard", "--port", "0", "--cache", "0"],
        cwd=cli.cwd,
        env=cli.env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    ) as process:
        try:
            assert process.stdout is not None
            line = process.stdout.readline()  # printed once the socket listens
            match = re.fullmatch(r"crawlq dashboard on (http://\S+?)/\n", line)
            assert match, line
            with urllib.request.urlopen(match.group(1) + "/api/stats", timeout=30) as got:
                assert got.headers["content-type"].startswith("application/json")
                return str(got.read().decode())
        finally:
            process.terminate()
            process.wait(timeout=30)


def test_stats_json_says_blocked_for_good_in_json_jq_and_node_read(cli: Cli) -> None:
    asyncio.run(_block(cli.url))
    out = cli.ok("stats", "--json").out
    assert "Infinity" not in out
    groups = {g["name"]: g for g in _strict(out)["groups"]}
    assert groups["forever.test"]["blocked_for_good"] is True
    assert groups["forever.test"]["blocked_until"] is None
    assert groups["forever.test"]["block_reason"] == "refused us for good"
    assert groups["later.test"]["blocked_for_good"] is False
    assert groups["later.test"]["blocked_until"] > _strict(out)["now"]
    assert groups["free.test"]["blocked_for_good"] is False
    assert groups["free.test"]["blocked_until"] is None

    jq = subprocess.run(
        ["jq", "-r", ".groups[] | select(.blocked_for_good) | .name"],
        input=out,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert jq.returncode == 0 and jq.stdout == "forever.test\n", jq.stderr
    script = "let t='';process.stdin.on('data',d=>t+=d).on('end',()=>{const s=JSON.parse(t);"
    script += "console.log(s.groups.filter(g=>g.blocked_for_good).map(g=>g.name).join())})"
    node = subprocess.run(
        ["node", "-e", script], input=out, capture_output=True, text=True, timeout=30
    )
    assert node.returncode == 0 and node.stdout == "forever.test\n", node.stderr

    api = _strict(_api_stats(cli))
    cli_said = _strict(out)
    for part in ("queues", "groups", "workers"):
        assert api[part] == cli_said[part], part
