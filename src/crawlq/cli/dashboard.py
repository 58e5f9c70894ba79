"""`crawlq dashboard`: the web dashboard and `/metrics`, served by uvicorn."""

from __future__ import annotations

import ipaddress
import os
import socket

import click
from click.core import ParameterSource

from ..checks import seconds, shorten, unicode_error
from ..errors import ConfigError
from ..observe.logs import logger, redact
from ..observe.security import LOGIN_FAILURES, MAKE_TOKEN, TOKEN_RULE, check_token
from .common import backend_option, connected, resolve_url, run

log = logger("crawlq.dashboard")

TOKEN_VARIABLE = "CRAWLQ_DASHBOARD_TOKEN"


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def allowed_hosts(host: str, loopback: list[str]) -> list[str] | None:
    """The names a dashboard listening on `host` answers in the Host header (any port; the
    Host check compares the name only): on loopback, the loopback names and the address it
    listens on (so 127.0.0.2 too), an IPv6 one with and without brackets; elsewhere any
    (None). The check keeps DNS-rebinding pages (evil.test resolving to 127.0.0.1) out."""
    if not is_loopback(host):
        return None
    bare = host.strip("[]").lower()
    own = [bare, f"[{bare}]"] if ":" in bare else [bare]
    return [*loopback, *(name for name in own if name not in loopback)]


def _bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host.strip("[]"), port))
    except (OSError, ValueError, TypeError) as exc:  # TypeError: a NUL in the host
        sock.close()
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise ConfigError(f"cannot listen on {host}:{port}: {reason}") from None
    sock.listen(128)
    sock.set_inheritable(True)
    return sock


def _refuse_blank_variable() -> None:
    """An empty CRAWLQ_DASHBOARD_TOKEN (which click takes for no token at all) or one of
    spaces is almost certainly a deployment's mistake, a secret that did not arrive: the
    dashboard does not start, open to all, on it."""
    given = os.environ.get(TOKEN_VARIABLE)
    source = click.get_current_context().get_parameter_source("token")
    if given is not None and not given.strip() and source is not ParameterSource.COMMANDLINE:
        raise ConfigError(
            f"{TOKEN_VARIABLE} is set but empty: set it to a token (make one with"
            f" {MAKE_TOKEN}), or unset it to serve without one"
        )


@click.command(short_help="Serve the web dashboard and /metrics.")
@click.argument("app_spec", metavar="[MODULE:APP]", required=False)
@backend_option
@click.option(
    "--host",
    default="127.0.0.1",
    show_default=True,
    help="Address to listen on; anything but loopback exposes the dashboard to the network.",
)
@click.option(
    "--port",
    type=click.IntRange(0, 65535),
    default=8080,
    show_default=True,
    help="Port (0: any free port).",
)
@click.option(
    "--token",
    envvar=TOKEN_VARIABLE,
    show_envvar=True,
    default=None,
    help="Require this token on every page, action and /metrics (prefer the env variable):"
    f" {TOKEN_RULE}. Make one with {MAKE_TOKEN}. Wrong tokens from one address are refused"
    f" (429) after {LOGIN_FAILURES} a minute.",
)
@click.option(
    "--cache",
    default=1.0,
    show_default=True,
    help="Seconds a backend read is reused by every page and /metrics (0: none).",
)
@click.option(
    "--metrics-groups",
    type=click.IntRange(0, 10**6),
    default=0,
    show_default=True,
    help="Series of their own in /metrics for the N busiest groups. Every host a crawl meets"
    " is a group, and the busiest change: each becomes a Prometheus series for good.",
)
def dashboard(
    app_spec: str | None,
    backend_url: str | None,
    host: str,
    port: int,
    token: str | None,
    cache: float,
    metrics_groups: int,
) -> None:
    """Serve the web dashboard and /metrics for a backend (or MODULE:APP's)."""
    import uvicorn

    from ..observe.dashboard import LOOPBACK_HOSTS, Dashboard

    _, url = resolve_url(app_spec, backend_url)
    cache = seconds(cache, "--cache")
    if not host or not host.isprintable() or unicode_error(host):
        raise ConfigError(f"--host {shorten(host)} is not an address or a host name")
    if token is None or token.isspace():
        _refuse_blank_variable()
    if token is not None:
        check_token(token)
    if not is_loopback(host) and not token:
        click.echo(
            f"warning: serving on {host} without --token: anyone who can reach it can re-queue "
            "and purge dead letters",
            err=True,
        )
    sock = _bind(host, port)
    bound = sock.getsockname()[1]

    async def main() -> None:
        async with connected(url) as backend:
            board = Dashboard(backend, token=token, ttl=cache, metric_groups=metrics_groups)
            allowed = allowed_hosts(host, LOOPBACK_HOSTS)
            config = uvicorn.Config(
                board.app(allowed_hosts=allowed),
                log_config=None,
                access_log=False,
                lifespan="on",
                timeout_graceful_shutdown=5,
            )
            server = uvicorn.Server(config)
            shown = f"[{host}]" if ":" in host else host
            click.echo(f"crawlq dashboard on http://{shown}:{bound}/")
            log.info("dashboard for %s on %s:%d", redact(backend.url), host, bound)
            await server.serve(sockets=[sock])

    try:
        run(main)
    finally:
        sock.close()
