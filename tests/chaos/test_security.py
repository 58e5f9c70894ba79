"""Security: no pickle or eval anywhere, the dashboard's defaults and guard, and credentials
that never reach a log line, a command's output or a dashboard page.

- The code is read with `ast` (src/crawlq, benchmarks/, examples/): no import of pickle and its
  kin, no eval/exec/compile builtins, no yaml.load without SafeLoader, no shell=True.
- `crawlq dashboard` listens on 127.0.0.1 unless told otherwise; with a token, every page,
  API, static file and action answers 401 without it, and an action needs its CSRF token and
  a same-origin request. What tests/dashboard/ already proves (the pages and /dead/purge
  refused without the token, CSRF and a foreign Origin on /dead/purge) is not repeated here.
- A password-protected Redis, an element URL with a password, a proxy URL with one, the
  dashboard token: a worker (text and JSON logs), `crawlq stats`, `crawlq dead list`, failed
  commands, the crawler and every dashboard page are captured, and no secret is in them.
- Redis passwords and TLS are honored: tests/test_redis.py (test_password_and_tls_are_honored,
  test_a_wrong_password_is_a_clear_error_without_the_password,
  test_plain_text_to_a_tls_server_is_refused). The SSRF guard: tests/chaos/test_ssrf.py.
"""

from __future__ import annotations

import ast
import json
import logging
import os
import re
import socket
import subprocess
import sys
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

import crawlq
from crawlq.cli.dashboard import dashboard
from crawlq.testing.redis_server import RedisServer

ROOT = Path(__file__).resolve().parents[2]
TIMEOUT = 60.0

# -- no pickle, no eval ---------------------------------------------------------------------

SCANNED = [ROOT / "src" / "crawlq", ROOT / "benchmarks", ROOT / "examples"]
UNSAFE_MODULES = {"pickle", "cPickle", "_pickle", "marshal", "shelve", "dill", "cloudpickle"}
CODE_BUILTINS = {"eval", "exec", "compile"}
SAFE_LOADERS = {"SafeLoader", "CSafeLoader", "BaseLoader"}
SHELLS = {"os.system", "os.popen", "subprocess.getoutput", "subprocess.getstatusoutput"}


def _name(node: ast.expr) -> str:
    """`a.b.c` for an attribute chain, `f` for a name, "" otherwise."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        base = _name(node.value)
        return f"{base}.{node.attr}" if base else node.attr
    return ""


def unsafe_code(source: str, path: str) -> list[str]:
    """Every use of pickle-like modules, code-running builtins, unsafe YAML and shells in
    `source`, as "path:line: what"."""
    tree = ast.parse(source, filename=path)
    shadowed = {
        alias.asname or alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom)
        for alias in node.names
    }
    found: list[str] = []

    def flag(node: ast.AST, what: str) -> None:
        found.append(f"{path}:{getattr(node, 'lineno', 0)}: {what}")

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] in UNSAFE_MODULES:
                    flag(node, f"imports {alias.name}")
        elif isinstance(node, ast.ImportFrom):
            if (node.module or "").split(".")[0] in UNSAFE_MODULES:
                flag(node, f"imports from {node.module}")
        elif isinstance(node, ast.Call):
            name = _name(node.func)
            keywords = {k.arg: k.value for k in node.keywords if k.arg}
            if (name in CODE_BUILTINS and name not in shadowed) or name in {
                f"builtins.{b}" for b in CODE_BUILTINS
            }:
                flag(node, f"calls {name}()")
            if name in ("__import__", "importlib.import_module") and node.args:
                first = node.args[0]
                if isinstance(first, ast.Constant) and str(first.value) in UNSAFE_MODULES:
                    flag(node, f"imports {first.value!s} with {name}()")
            if name in ("yaml.unsafe_load", "yaml.full_load", "yaml.load_all") or (
                name == "yaml.load"
                and _name(
                    keywords.get("Loader") or (node.args[1:2] or [ast.Constant(None)])[0]
                ).rpartition(".")[2]
                not in SAFE_LOADERS
            ):
                flag(node, f"{name}() without SafeLoader")
            shell = keywords.get("shell")
            if shell is not None and not (isinstance(shell, ast.Constant) and not shell.value):
                flag(node, f"{name}(shell=...)")
            if name in SHELLS:
                flag(node, f"{name}() runs a shell")
    return found


def test_the_scanner_finds_every_kind_of_unsafe_code() -> None:
    source = "\n".join(
        [
            "import pickle",
            "import os, marshal as m",
            "from shelve import open as shelf",
            "import dill.source",
            "eval('1')",
            "exec('x = 1')",
            "compile('1', 'f', 'eval')",
            "import builtins; builtins.eval('2')",
            "__import__('pickle')",
            "yaml.load(text)",
            "yaml.load(text, Loader=yaml.Loader)",
            "yaml.unsafe_load(text)",
            "subprocess.run('ls', shell=True)",
            "subprocess.Popen(cmd, shell=flag)",
            "os.system('ls')",
        ]
    )
    found = unsafe_code(source, "bad.py")
    assert [int(f.split(":")[1]) for f in found] == list(range(1, 16)), found
    harmless = "\n".join(
        [
            "import re, json, subprocess",
            "re.compile('x')",
            "from re import compile",
            "compile('x')",
            "yaml.load(text, Loader=yaml.SafeLoader)",
            "yaml.safe_load(text)",
            "subprocess.run(['ls'], shell=False)",
            "subprocess.run(['ls'])",
            "json.loads('1')",
            "ast.literal_eval('1')",
        ]
    )
    assert unsafe_code(harmless, "good.py") == []


def test_no_pickle_eval_unsafe_yaml_or_shell_anywhere() -> None:
    files = [path for folder in SCANNED if folder.exists() for path in folder.rglob("*.py")]
    assert len(files) > 50, "the scan reads the package, the benchmarks and the examples"
    found = [
        finding
        for path in sorted(files)
        for finding in unsafe_code(path.read_text(encoding="utf-8"), str(path.relative_to(ROOT)))
    ]
    assert found == [], "unsafe code:\n" + "\n".join(found)


# -- secrets, and an app whose work carries them -------------------------------------------------

REDIS_PASSWORD = "redis-pw-s3cret"
ELEMENT_SECRET = "elem-pw-s3cret"
PROXY_SECRET = "proxy-pw-s3cret"
REASON_SECRET = "reason-s3cret"
TOKEN = "dash-token-s3cret-0123456789"
SECRETS = (REDIS_PASSWORD, ELEMENT_SECRET, PROXY_SECRET, REASON_SECRET, TOKEN)
SECRET_URL = f"http://bob:{ELEMENT_SECRET}@a.test/private"
PROXY_URL = f"http://proxyuser:{PROXY_SECRET}@127.0.0.1:9/"

#: The worker runs this app: `fetch` logs what a careless task logs, then fails with the URL
#: and the proxy in its error, so the dead letter, its traceback and the logs all hold them.
app = crawlq.App(os.environ.get("CRAWLQ_BACKEND", "sqlite:///never-opened.db"))
log = logging.getLogger("tests.security_app")


@app.task(max_attempts=1)
async def fetch(ctx: crawlq.Context, url: str) -> None:
    log.info("fetching %s through %s with Authorization: Bearer %s", url, PROXY_URL, TOKEN)
    raise RuntimeError(f"cannot fetch {url} through {PROXY_URL}")


def leaked(text: str) -> list[str]:
    return [secret for secret in SECRETS if secret in text]


@pytest.fixture(scope="module")
def secured_redis() -> Iterator[RedisServer]:
    server = RedisServer(password=REDIS_PASSWORD)
    server.start()
    try:
        yield server
    finally:
        server.remove()


@dataclass
class Env:
    """The `crawlq` command, run as a subprocess against one backend URL."""

    url: str
    home: Path
    outputs: list[str] = field(default_factory=list)

    @property
    def environ(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("CRAWLQ_")}
        env.update(
            CRAWLQ_BACKEND=self.url,
            PYTHONPATH=os.pathsep.join([str(ROOT / "src"), str(ROOT)]),
            COLUMNS="200",
        )
        return env

    def crawlq(self, *args: str, code: int = 0, **env: str) -> str:
        ran = subprocess.run(
            [sys.executable, "-m", "crawlq", *args],
            env={**self.environ, **env},
            cwd=self.home,
            capture_output=True,
            text=True,
            timeout=TIMEOUT,
            check=False,
        )
        out = ran.stdout + ran.stderr
        self.outputs.append(f"$ crawlq {args[0]} ...\n{out}")  # the arguments hold secrets
        assert ran.returncode == code, out
        return out


@pytest.fixture(params=["sqlite", "redis"])
def env(request: pytest.FixtureRequest, tmp_path: Path) -> Env:
    if request.param == "redis":
        server: RedisServer = request.getfixturevalue("secured_redis")
        url = f"{server.url}?namespace=security-{uuid.uuid4().hex[:12]}"
    else:
        url = f"sqlite:///{tmp_path / 'queue.db'}"
    return Env(url=url, home=tmp_path)


def test_worker_logs_commands_and_errors_never_show_a_credential(env: Env) -> None:
    me = f"{__name__}:app"
    env.crawlq("schedule", "fetch", json.dumps(SECRET_URL), "--app", me)
    for fmt in ("text", "json"):
        env.crawlq("dead", "requeue", "fetch", "--all")  # dead after each run: run it again
        env.crawlq("worker", me, "--burst", "--log-level", "debug", "--log-format", fmt)
    env.crawlq(
        "limits", "block", "a.test", "--for", "600", "--reason", f"http://x:{REASON_SECRET}@y"
    )
    env.crawlq("schedule", "fetch", '"http://a.test/waiting"')  # a blocked group with work
    stats = env.crawlq("stats")
    assert "http://***@y" in stats, stats
    env.crawlq("stats", "--json", "--groups", "5")
    dead = env.crawlq("dead", "list", "fetch")
    assert "http://***@a.test/private" in dead, dead
    env.crawlq("check")
    logs = "\n".join(env.outputs)
    assert "fetching http://***@a.test/private" in logs, "the task's own line, masked"
    assert '"level": "info"' in logs and "RuntimeError: cannot fetch" in logs
    assert leaked(logs) == [], logs
    exact = json.loads(env.crawlq("dead", "list", "fetch", "--json"))
    assert [d["key"] for d in exact] == [json.dumps(SECRET_URL)], "--json keeps the exact key"


def test_failed_commands_never_show_the_backend_password(
    secured_redis: RedisServer, tmp_path: Path
) -> None:
    run = Env(url=secured_redis.url, home=tmp_path)
    wrong = secured_redis.url.replace(REDIS_PASSWORD, "wrong-" + REDIS_PASSWORD)
    for url in (
        wrong,
        f"redis://:{REDIS_PASSWORD}@127.0.0.1:1/0",
        f"rediss://user:{REDIS_PASSWORD}@[::1/0",
        f"redis://:{REDIS_PASSWORD}@127.0.0.1:99999/0",
        f"mysql://root:{REDIS_PASSWORD}@db/x",
    ):
        for command in (["stats"], ["check"], ["dead", "list", "fetch"], ["limits"]):
            out = run.crawlq(*command, "--backend", url, code=1)
            assert out.startswith("Error:") and out.count("\n") == 1, out
    broken = f"{__name__}:app"
    out = run.crawlq("worker", broken, "--burst", code=1, CRAWLQ_BACKEND=wrong)
    assert "Traceback" not in out, out
    assert leaked("\n".join(run.outputs)) == [], run.outputs


def test_a_crawl_through_a_proxy_with_a_password_never_shows_it(tmp_path: Path) -> None:
    run = Env(url=f"sqlite:///{tmp_path / 'crawl.db'}", home=tmp_path)
    run.crawlq(
        "crawl",
        "http://a.test/",
        "--out",
        str(tmp_path / "out"),
        "--proxy",
        PROXY_URL,
        "--resolve",
        "a.test=127.0.0.1",
        "--allow-network",
        "127.0.0.0/8",
        "--max-attempts",
        "1",
        "--timeout",
        "5",
        "--no-progress",
        "--log-level",
        "debug",
        code=0,
    )
    out = "\n".join(run.outputs)
    assert "Cannot connect to host 127.0.0.1:9" in out, "the request went to the proxy"
    assert leaked(out) == [], out


# -- the dashboard ------------------------------------------------------------------------


def test_the_dashboard_listens_on_loopback_by_default() -> None:
    host = next(p for p in dashboard.params if p.name == "host")
    assert host.default == "127.0.0.1"


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


@dataclass
class Board:
    """A `crawlq dashboard` subprocess with a token, and plain HTTP requests to it."""

    process: subprocess.Popen[str]
    base: str
    log: Path

    def request(
        self,
        path: str,
        *,
        data: bytes | None = None,
        method: str | None = None,
        headers: dict[str, str] | None = None,
        token: bool = True,
    ) -> tuple[int, str, dict[str, str]]:
        sent = dict(headers or {})
        if token:
            sent.setdefault("Authorization", f"Bearer {TOKEN}")
        request = urllib.request.Request(self.base + path, data=data, headers=sent, method=method)
        try:
            with urllib.request.build_opener(_NoRedirect).open(request, timeout=30) as response:
                return response.status, response.read().decode(), dict(response.headers)
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode(), dict(exc.headers)


@pytest.fixture
def board(env: Env) -> Iterator[Board]:
    me = f"{__name__}:app"
    env.crawlq("schedule", "fetch", json.dumps(SECRET_URL), '"http://b.test/plain"', "--app", me)
    env.crawlq("worker", me, "--burst")
    env.crawlq(
        "limits", "block", "a.test", "--for", "600", "--reason", f"http://x:{REASON_SECRET}@y"
    )
    log = env.home / "dashboard.log"
    with log.open("w") as err:
        process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "crawlq",
                "dashboard",
                "--port",
                "0",
                "--cache",
                "0",
                "--log-level",
                "debug",
            ],
            env={**env.environ, "CRAWLQ_DASHBOARD_TOKEN": TOKEN},
            cwd=env.home,
            stdout=subprocess.PIPE,
            stderr=err,
            text=True,
        )
    try:
        assert process.stdout is not None
        line = process.stdout.readline()  # printed once the socket listens
        match = re.fullmatch(r"crawlq dashboard on (http://127\.0\.0\.1:(\d+))/\n", line)
        assert match, (line, log.read_text())
        yield Board(process=process, base=match.group(1), log=log)
    finally:
        process.terminate()  # a second time is harmless if a test stopped it already
        try:
            process.communicate(timeout=30)
        except subprocess.TimeoutExpired:  # a failure shown by the test; leave nothing behind
            process.kill()
            process.communicate()


def dead_count(board: Board) -> int:
    stats = json.loads(board.request("/api/stats")[1])
    return sum(q["dead"] for q in stats["queues"])


def test_the_dashboard_is_bound_to_loopback_only(board: Board) -> None:
    port = int(board.base.rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port), timeout=10):
        pass
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.2", port), timeout=10).close()


def test_without_the_token_nothing_is_served_and_nothing_is_done(board: Board) -> None:
    before = dead_count(board)
    assert before == 2
    logged_in = {"Cookie": _login_cookie(board)}  # wrong Bearers below lock the Bearer out
    gets = ["/", "/?fragment=1", "/groups?q=a", "/workers", "/dead?queue=fetch&fragment=1"]
    gets += ["/element?queue=fetch&key=1", "/metrics", "/api/stats", "/static/dashboard.css"]
    gets += ["/static/dashboard.js", "/no/such/page", "/login"]
    wrong = [
        {},
        {"Authorization": "Bearer " + TOKEN[:-1]},
        {"Authorization": f"Basic {TOKEN}"},
        {"Authorization": "Bearer"},
        {"Cookie": f"crawlq_token={TOKEN}x"},
        {"Cookie": "crawlq_token="},
    ]
    for headers in wrong:
        for path in gets:
            for method in ("GET", "HEAD"):
                status, body, _ = board.request(path, headers=headers, method=method, token=False)
                # 429: past 5 wrong tokens a minute from one address (127.0.0.1 here)
                assert status in (401, 429), (method, path, headers)
                assert TOKEN not in body
        for action in ("/dead/requeue", "/dead/purge", f"/dead/purge?token={TOKEN}"):
            form = b"queue=fetch&all=1&confirm=yes"
            status = board.request(action, data=form, headers=headers, token=False)[0]
            assert status in (401, 429)
    assert board.request("/login", data=b"token=wrong&next=/", token=False)[0] in (401, 429)
    stats = board.request("/api/stats", headers=logged_in, token=False)
    assert stats[0] == 200
    assert sum(q["dead"] for q in json.loads(stats[1])["queues"]) == before, "nothing was done"


def _login_cookie(board: Board) -> str:
    """The login cookie (name=value) the right token gets."""
    session = {"Cookie": "crawlq_session=" + "1" * 32}  # so the one cookie set is the login
    status, _, headers = board.request(f"/?token={TOKEN}", headers=session, token=False)
    assert status == 303
    cookies = " ".join(v for k, v in headers.items() if k.lower() == "set-cookie")
    found = re.search(r"crawlq_token=([^;]+)", cookies)
    assert found is not None, headers
    return f"crawlq_token={found.group(1)}"


def test_actions_refuse_other_origins_hosts_and_sessions(board: Board) -> None:
    session = {"Cookie": "crawlq_session=" + "1" * 32}
    _, page, _ = board.request("/dead?queue=fetch", headers=session)
    csrf = re.search(r'name="csrf" value="([0-9a-f]{64})"', page)
    assert csrf is not None
    form = f"queue=fetch&all=1&confirm=yes&csrf={csrf.group(1)}".encode()
    host = board.base.split("//", 1)[1]
    refused = [
        {**session, "Origin": f"http://{host}.evil.test"},
        {**session, "Origin": f"http://evil.test/{host}"},
        {"Cookie": "crawlq_session=" + "2" * 32},
        {},
    ]
    for headers in refused:
        assert board.request("/dead/requeue", data=form, headers=headers)[0] == 403, headers
    rebinding = {**session, "Host": f"evil.test:{host.rsplit(':', 1)[1]}"}
    assert board.request("/", headers=rebinding)[0] == 400, "a DNS-rebound name is refused"
    assert board.request("/dead/requeue", data=form, headers=rebinding)[0] == 400
    assert dead_count(board) == 2
    same = {**session, "Origin": f"http://{host}"}
    assert board.request("/dead/requeue", data=form, headers=same)[0] == 303
    assert dead_count(board) == 0


def test_no_page_shows_a_credential_and_actions_still_find_the_element(board: Board) -> None:
    pages: dict[str, str] = {}
    for path in ["/", "/groups", "/groups?q=a.test", "/workers", "/dead", "/dead?queue=fetch"]:
        pages[path] = board.request(path)[1]
    for path in ["/metrics", "/api/stats", "/dead?queue=fetch&fragment=1"]:
        pages[path] = board.request(path)[1]
    dead = pages["/dead?queue=fetch"]
    assert "http://***@a.test/private" in dead and "http://b.test/plain" in dead
    link = re.search(r'href="(/element\?[^"]*ref=[0-9a-f]+[^"]*)"', dead)
    assert link is not None, "the element with a password is linked by reference"
    path = link.group(1).replace("&amp;", "&")
    pages[path] = board.request(path)[1]
    assert "Dead: 1 attempt" in pages[path], pages[path]
    assert "RuntimeError: cannot fetch http://***@a.test/private" in pages[path]
    session = {"Cookie": "crawlq_session=" + "3" * 32}
    _, dead, _ = board.request("/dead?queue=fetch", headers=session)
    csrf = re.search(r'name="csrf" value="([0-9a-f]{64})"', dead)
    ref = re.search(r'name="ref" value="([0-9a-f]+)"', dead)
    assert csrf is not None and ref is not None
    form = f"queue=fetch&ref={ref.group(1)}&csrf={csrf.group(1)}".encode()
    status, confirm, _ = board.request("/dead/purge", data=form, headers=session)
    assert status == 200 and "Purge?" in confirm
    pages["confirm"] = confirm
    status, _, headers = board.request("/dead/purge", data=form + b"&confirm=yes", headers=session)
    assert status == 303 and headers["location"] == "/dead?queue=fetch&done=purge&count=1"
    said = board.request(headers["location"], headers=session)[1]
    assert "purged 1 dead element of fetch" in said
    forged = "/dead?queue=fetch&message=all+dead+letters+were+re-queued&done=purge&count=x"
    assert 'class="message"' not in board.request(forged, headers=session)[1]  # no text from a link
    assert dead_count(board) == 1
    stale = f"queue=fetch&ref={'0' * 32}&confirm=yes&csrf={csrf.group(1)}".encode()
    assert board.request("/dead/requeue", data=stale, headers=session)[0] == 400
    board.process.terminate()
    board.process.wait(timeout=20)
    pages["log"] = board.log.read_text()
    assert "dashboard for" in pages["log"], "the debug log names the backend, masked"
    assert {name: leaked(text) for name, text in pages.items() if leaked(text)} == {}


def test_a_weak_or_mangled_token_is_refused_in_one_line(env: Env) -> None:
    for token in ("short", "has a space in it!!", 'quote"token-0123456789', "é" * 20):
        out = env.crawlq("dashboard", "--port", "0", code=1, CRAWLQ_DASHBOARD_TOKEN=token)
        assert out.startswith("Error: the dashboard token must be") and out.count("\n") == 1
        assert token not in out
