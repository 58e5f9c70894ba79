"""What every command shares: loading the user's app, opening a backend, clear errors."""

from __future__ import annotations

import asyncio
import importlib
import json
import logging
import os
import sys
from collections.abc import AsyncIterator, Callable, Coroutine
from contextlib import asynccontextmanager
from typing import Any, TypeVar

import click

from ..app import App, check_backend_url
from ..backends import DEFAULT_URL, Backend, open_backend
from ..checks import shorten, unicode_error
from ..errors import ConfigError, CrawlqError
from ..observe.logs import printable, redact

T = TypeVar("T")

backend_option = click.option(
    "--backend",
    "backend_url",
    envvar="CRAWLQ_BACKEND",
    show_envvar=True,
    default=None,
    help=f"Backend URL [default: {DEFAULT_URL}].",
)
app_option = click.option(
    "--app",
    "app_spec",
    default=None,
    metavar="MODULE:APP",
    help="The app whose tasks, queues and backend to use.",
)
log_level_option = click.option(
    "--log-level",
    type=click.Choice(["debug", "info", "warning", "error"], case_sensitive=False),
    default="warning",
    envvar="CRAWLQ_LOG_LEVEL",
    show_envvar=True,
    show_default=True,
    help="How much to log.",
)


class Group(click.Group):
    """Turns every crawlq error into one line on stderr and exit status 1, never a traceback
    nor a terminal escape; refuses arguments that are not UTF-8 (Python hands them over as
    lone surrogates, which no backend can store) before any command runs."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        for arg in args:
            problem = unicode_error(arg)
            if problem:
                raise click.ClickException(
                    f"argument {shorten(redact(arg))} is {problem} (crawlq takes UTF-8)"
                )
        return super().parse_args(ctx, args)

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except CrawlqError as exc:
            # Messages may quote stored text (names, keys): its control characters escaped.
            raise click.ClickException(printable(redact(str(exc)))) from None


def setup_logging(level: str) -> None:
    logging.basicConfig(
        level=level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )


def load_app(spec: str) -> App:
    """Imports MODULE:APP (the current folder is importable, as with `python -m`)."""
    module_name, _, attribute = spec.partition(":")
    if not module_name:
        raise ConfigError(f"expected MODULE:APP, got {spec!r}")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(f"cannot import {module_name!r}: {exc}") from exc
    if attribute:
        app = getattr(module, attribute, None)
    else:
        found = [v for v in vars(module).values() if isinstance(v, App)]
        app = found[0] if len(found) == 1 else None
    if not isinstance(app, App):
        raise ConfigError(f"{spec!r} is not a crawlq App")
    return app


def resolve_url(app_spec: str | None, backend_url: str | None) -> tuple[App | None, str]:
    app = load_app(app_spec) if app_spec else None
    url = backend_url or (app.url if app else None) or DEFAULT_URL
    return app, url


@asynccontextmanager
async def connected(url: str, *, create: bool = False) -> AsyncIterator[Backend]:
    """An open backend; by default refuses to create a database that is not there."""
    backend = open_backend(check_backend_url(url), create=create)
    await backend.open()
    try:
        yield backend
    finally:
        await backend.close()


def run(coro_fn: Callable[[], Coroutine[Any, Any, T]]) -> T:
    return asyncio.run(coro_fn())


def echo_json(value: Any) -> None:
    """`value` in standard JSON, which jq and JSON.parse read: allow_nan=False, so a number
    with no JSON spelling (Infinity, NaN) is a ValueError here, never a document they refuse.
    None can reach it from what the CLI prints: limits and Crawl-delays are finite (Limit
    checks them), times are clock readings; `crawlq stats --json`'s one infinity, a block
    for good, is written as `blocked_for_good` (observe.dashboard.stats_json)."""
    click.echo(json.dumps(value, indent=2, sort_keys=True, default=str, allow_nan=False))
