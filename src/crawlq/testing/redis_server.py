"""A throwaway redis-server on 127.0.0.1, for tests, benchmarks and trying crawlq out.

    with redis_server() as url:             # "redis://127.0.0.1:PORT/0"
        ...

    server = RedisServer(appendonly=True, appendfsync="always")
    server.start(); ...; server.restart(); ...; server.stop()

The server runs from its own temporary directory; `restart` keeps the port and the
directory, so with `appendonly` the data comes back as the server reloads its log.
"""

from __future__ import annotations

import contextlib
import shutil
import signal
import socket
import ssl
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

#: Where redis-server 7 keeps its append-only files (its `appenddirname` default).
AOF_DIR = "appendonlydir"
INSTALL_HINT = "run `bash scripts/install-redis.sh` (installs Debian's redis-server)"


class RedisServerError(RuntimeError):
    """redis-server is missing, or did not come up in time."""


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class RedisServer:
    def __init__(
        self,
        *,
        appendonly: bool = False,
        appendfsync: str = "everysec",
        password: str | None = None,
        tls: bool = False,
        executable: str = "redis-server",
        startup_timeout: float = 10.0,
        extra_args: tuple[str, ...] = (),
    ) -> None:
        binary = shutil.which(executable)
        if binary is None:
            raise RedisServerError(f"{executable!r} not found on PATH; {INSTALL_HINT}")
        self.binary = binary
        self.appendonly = appendonly
        self.appendfsync = appendfsync
        self.password = password
        self.tls = tls
        self.startup_timeout = startup_timeout
        self.extra_args = extra_args  # more redis-server options, as "--name", "value"
        self.port = _free_port()
        self.workdir = Path(tempfile.mkdtemp(prefix="redis-"))
        self.log = self.workdir / "redis.log"
        self._proc: subprocess.Popen[bytes] | None = None
        self.ca_file = self.workdir / "ca.pem"
        if tls:
            self._make_certificates()

    def _make_certificates(self) -> None:
        import trustme  # a test dependency: certificates for 127.0.0.1 signed by a fresh CA

        ca = trustme.CA()
        cert = ca.issue_cert("127.0.0.1", "localhost")
        cert.private_key_pem.write_to_path(str(self.workdir / "server.key"))
        cert.cert_chain_pems[0].write_to_path(str(self.workdir / "server.crt"))
        ca.cert_pem.write_to_path(str(self.ca_file))

    @property
    def url(self) -> str:
        auth = f":{self.password}@" if self.password else ""
        if self.tls:
            return f"rediss://{auth}127.0.0.1:{self.port}/0?ssl_ca_certs={self.ca_file}"
        return f"redis://{auth}127.0.0.1:{self.port}/0"

    def start(self) -> str:
        args = [self.binary, "--bind", "127.0.0.1"]
        if self.tls:
            args += ["--port", "0", "--tls-port", str(self.port), "--tls-auth-clients", "no"]
            args += ["--tls-cert-file", str(self.workdir / "server.crt")]
            args += ["--tls-key-file", str(self.workdir / "server.key")]
            args += ["--tls-ca-cert-file", str(self.ca_file)]
        else:
            args += ["--port", str(self.port)]
        args += ["--dir", str(self.workdir), "--save", "", "--daemonize", "no"]
        args += ["--appendonly", "yes" if self.appendonly else "no"]
        args += ["--appendfsync", self.appendfsync]
        if self.password:
            args += ["--requirepass", self.password]
        args += self.extra_args
        with self.log.open("ab") as out:
            # Own session: a Ctrl-C aimed at the caller must not kill the server under it.
            self._proc = subprocess.Popen(
                args, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )
        self._wait_for_ping()
        return self.url

    def _wait_for_ping(self) -> None:
        assert self._proc is not None
        deadline = time.monotonic() + self.startup_timeout
        while not self._answers():
            if self._proc.poll() is not None:
                raise RedisServerError(
                    f"redis-server exited with code {self._proc.returncode} before answering "
                    f"on port {self.port}:\n{self.log.read_text(errors='replace')[-2000:]}"
                )
            if time.monotonic() > deadline:
                raise RedisServerError(
                    f"redis-server did not answer on port {self.port} in {self.startup_timeout}s"
                )
            time.sleep(0.01)

    def _answers(self) -> bool:
        # An unauthenticated PING is refused with -NOAUTH, which also proves the server is up.
        expected = b"-NOAUTH" if self.password else b"+PONG"
        try:
            sock = socket.create_connection(("127.0.0.1", self.port), timeout=0.5)
            with contextlib.ExitStack() as stack:
                stack.callback(sock.close)
                if self.tls:
                    context = ssl.create_default_context(cafile=str(self.ca_file))
                    sock = context.wrap_socket(sock, server_hostname="127.0.0.1")
                    stack.callback(sock.close)
                sock.sendall(b"PING\r\n")
                return sock.recv(64).startswith(expected)
        except OSError:
            return False

    def pause(self) -> None:
        """SIGSTOP: the server's socket stays open, the kernel acknowledges what is sent to
        it, and nothing answers (as a wedged server or a hung proxy), until `resume`."""
        assert self._proc is not None
        self._proc.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        assert self._proc is not None
        self._proc.send_signal(signal.SIGCONT)

    def stop(self, *, kill: bool = False, timeout: float = 10.0) -> None:
        """SIGTERM (a clean shutdown) or SIGKILL (a crash: only what the log had survives)."""
        proc, self._proc = self._proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGCONT)  # a paused server would not act on SIGTERM
        proc.send_signal(signal.SIGKILL if kill else signal.SIGTERM)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout)

    def restart(self, *, kill: bool = False) -> None:
        self.stop(kill=kill)
        self.start()

    def snapshot(self) -> Path:
        """A copy of the append-only files as they are now: with `appendfsync always`, every
        write confirmed so far."""
        copy = Path(tempfile.mkdtemp(prefix="aof-", dir=self.workdir))
        shutil.copytree(self.workdir / AOF_DIR, copy / AOF_DIR)
        return copy

    def crash_back_to(self, snapshot: Path) -> None:
        """SIGKILLs the server and starts it again on `snapshot`'s files: a crash that lost
        every write confirmed since, as `appendfsync everysec` can lose its last ones."""
        self.stop(kill=True)
        shutil.rmtree(self.workdir / AOF_DIR)
        shutil.copytree(snapshot / AOF_DIR, self.workdir / AOF_DIR)
        self.start()

    def remove(self) -> None:
        self.stop()
        shutil.rmtree(self.workdir, ignore_errors=True)


@contextmanager
def redis_server(startup_timeout: float = 10.0, executable: str = "redis-server") -> Iterator[str]:
    """Start a private redis-server on a free loopback port; yield its URL."""
    server = RedisServer(executable=executable, startup_timeout=startup_timeout)
    try:
        yield server.start()
    finally:
        server.remove()
