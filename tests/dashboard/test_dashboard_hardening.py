"""The dashboard hardened against weak tokens: the real `crawlq dashboard` command."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import pytest

from crawlq.backends import open_backend
from crawlq.errors import ConfigError
from crawlq.observe.dashboard import Dashboard
from crawlq.types import QueueConfig, Schedule

from .conftest import ROOT


async def _fill(url: str) -> None:
    """A queue `pages` with an element in group a.test."""
    backend = open_backend(url, create=True)
    await backend.open()
    try:
        await backend.ensure_queues([QueueConfig(name="pages")])
        key = '"http://a.test/1"'
        element = Schedule(queue="pages", key=key, payload='"x"', group="a.test", due=0)
        await backend.schedule([element])
    finally:
        await backend.close()


# -- 2. weak tokens ------------------------------------------------------------------------------


def test_a_weak_token_is_refused_at_start_saying_how_to_make_one(tmp_path: Path) -> None:
    """16 characters were the only rule: aaaaaaaaaaaaaaaa, 1234567890123456 or
    passwordpassword started a dashboard."""
    environ = {k: v for k, v in os.environ.items() if not k.startswith("CRAWLQ_")}
    environ.update(
        CRAWLQ_BACKEND=f"sqlite:///{tmp_path / 'weak.db'}",
        PYTHONPATH=os.pathsep.join([str(ROOT / "src"), str(ROOT)]),
    )
    asyncio.run(_fill(environ["CRAWLQ_BACKEND"]))
    weak = ["aaaaaaaaaaaaaaaa", "1234567890123456", "abcdefghijklmnopqr", "passwordpassword"]
    for token in weak:
        with pytest.raises(ConfigError, match="make one with"):
            Dashboard(open_backend(environ["CRAWLQ_BACKEND"], create=False), token=token)
    for token in weak:
        ran = subprocess.run(
            [sys.executable, "-m", "crawlq", "dashboard", "--port", "0", "--token", token],
            env=environ,
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=60,
        )
        said = ran.stdout + ran.stderr
        assert ran.returncode == 1, (token, said)
        assert said.startswith("Error: the dashboard token must be") and said.count("\n") == 1
        assert "secrets.token_urlsafe(32)" in said and token not in said
    shown = subprocess.run(
        [sys.executable, "-m", "crawlq", "dashboard", "--help"],
        env={**environ, "COLUMNS": "200"},
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    ).stdout
    assert "6 or more of them different" in " ".join(shown.split())
