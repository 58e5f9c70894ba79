"""Every crawlq command starts by importing the CLI; what only some of them need is imported
when first used: redis-py (with cryptography) for Redis URLs, tldextract (with requests) for
domain groups. Checked in a fresh interpreter, whose modules this test process cannot skew."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap


def _run(code: str) -> tuple[list[str], set[str]]:
    """What `code` printed, and the modules loaded after it ran."""
    script = textwrap.dedent(code) + "\nimport sys, json\nprint(json.dumps(sorted(sys.modules)))\n"
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True
    )
    *printed, modules = done.stdout.splitlines()
    return printed, set(json.loads(modules))


def test_the_cli_starts_without_redis_or_tldextract() -> None:
    _, loaded = _run("import crawlq.cli.main")
    assert "crawlq.cli.main" in loaded
    assert not {"redis", "tldextract", "requests", "cryptography"} & loaded


def test_each_is_imported_when_used() -> None:
    printed, loaded = _run(
        """
        from crawlq.backends import open_backend
        from crawlq.grouping import registered_domain
        print(type(open_backend("redis://127.0.0.1:1/0")).__name__)
        print(registered_domain("www.example.co.uk"))
        """
    )
    assert printed == ["RedisBackend", "example.co.uk"]
    assert {"redis", "tldextract"} <= loaded
