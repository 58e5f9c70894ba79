"""A throwaway redis-server on 127.0.0.1, for benchmarks and Redis test fixtures.

    with redis_server() as url:   # "redis://127.0.0.1:PORT/0"
        ...

The server runs from a temporary directory with persistence off, and is shut down
(and the directory removed) when the block exits, whatever happened inside it.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

INSTALL_HINT = "run `bash scripts/install-redis.sh` (installs Debian's redis-server)"


class RedisServerError(RuntimeError):
    """redis-server is missing, or did not come up in time."""


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _answers_ping(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5) as sock:
            sock.sendall(b"PING\r\n")
            return sock.recv(64).startswith(b"+PONG")
    except OSError:
        return False


def _wait_for_ping(proc: subprocess.Popen[bytes], port: int, log: Path, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not _answers_ping(port):
        if proc.poll() is not None:
            raise RedisServerError(
                f"redis-server exited with code {proc.returncode} before answering PING "
                f"on port {port}:\n{log.read_text(errors='replace')[-2000:]}"
            )
        if time.monotonic() > deadline:
            raise RedisServerError(f"redis-server did not answer PING on port {port} in {timeout}s")
        time.sleep(0.01)


def _stop(proc: subprocess.Popen[bytes], timeout: float = 5.0) -> None:
    if proc.poll() is None:
        proc.terminate()  # SIGTERM: redis shuts down cleanly (no save configured)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout)


@contextmanager
def redis_server(startup_timeout: float = 10.0, executable: str = "redis-server") -> Iterator[str]:
    """Start a private redis-server on a free loopback port; yield its URL."""
    binary = shutil.which(executable)
    if binary is None:
        raise RedisServerError(f"{executable!r} not found on PATH; {INSTALL_HINT}")
    workdir = Path(tempfile.mkdtemp(prefix="redis-"))
    proc: subprocess.Popen[bytes] | None = None
    try:
        port = _free_port()
        log = workdir / "redis.log"
        args = [binary, "--port", str(port), "--bind", "127.0.0.1", "--dir", str(workdir)]
        args += ["--save", "", "--appendonly", "no", "--daemonize", "no"]
        with log.open("wb") as out:
            # Own session: a Ctrl-C aimed at the caller must not kill the server under it.
            proc = subprocess.Popen(
                args, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )
        _wait_for_ping(proc, port, log, startup_timeout)
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        if proc is not None:
            _stop(proc)
        shutil.rmtree(workdir, ignore_errors=True)
