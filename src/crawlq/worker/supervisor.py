"""`--processes P`: P worker processes under one parent that forwards stop signals.

Each child runs in a session of its own, outside the terminal's process group: a Ctrl-C
reaches the parent alone, which forwards it, so each child gets it once (a graceful stop)
and a second Ctrl-C is each child's second stop (hurry), never the first one doubled. A
Ctrl-Z stops the children too (each between its write turns), and `fg` or `bg` continues
them with the parent.

A child that dies on its own (killed, out of memory) is started again unless the worker runs
in burst mode or is stopping; its leased elements come back when their leases expire. A
parent that dies outright (SIGKILL) takes its children with it: each asks Linux, as it starts,
for a SIGTERM (its graceful stop) when its parent goes (`end_with_parent`).
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
import signal
import sys
from collections.abc import AsyncIterator, Sequence

from ..observe.logs import logger

log = logger("crawlq.supervisor")

RESTART_PAUSE = 1.0
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
#: The parent's pid, in each child's environment.
PARENT_ENV = "CRAWLQ_PARENT_PID"
PR_SET_PDEATHSIG = 1  # linux/prctl.h


class Children:
    """The child processes of one parent, numbered by slot (in `env_name`), and the stop
    signals the parent received, each forwarded to every child, in order."""

    def __init__(self, command: Sequence[str], *, env_name: str, stdout: int | None = None) -> None:
        self.command = list(command)
        self.env_name = env_name
        self.stdout = stdout
        self.running: dict[int, asyncio.subprocess.Process] = {}
        self.stops: list[int] = []
        self._stopped = asyncio.Event()

    @property
    def stopping(self) -> bool:
        return bool(self.stops)

    def forward(self, signum: int) -> None:
        # Children in sessions of their own no longer get the hang-up of the terminal.
        sent = signal.SIGTERM if signum == signal.SIGHUP else signum
        self.stops.append(sent)
        self._stopped.set()
        self._send_all(sent)

    async def spawn(self, slot: int) -> asyncio.subprocess.Process | None:
        """Starts the child of `slot`; None once stopping. A stop signal that came while it
        was starting is sent to it too."""
        if self.stopping:
            return None
        seen = len(self.stops)
        child = await asyncio.create_subprocess_exec(
            *self.command,
            env={**os.environ, self.env_name: str(slot), PARENT_ENV: str(os.getpid())},
            stdout=self.stdout,
            start_new_session=True,
        )
        self.running[slot] = child
        for signum in self.stops[seen:]:
            _send(child, signum)
        return child

    def _suspend(self) -> None:
        """Ctrl-Z: the children stop (once out of their write turns), then the parent; its
        SIGCONT, from the shell's `fg` or `bg`, goes on to them."""
        self._send_all(signal.SIGTSTP)
        os.kill(os.getpid(), signal.SIGSTOP)

    def _send_all(self, signum: int) -> None:
        for child in self.running.values():
            _send(child, signum)

    async def pause(self, seconds: float) -> None:
        """Waits `seconds`, or less if a stop signal comes."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stopped.wait(), seconds)

    @contextlib.asynccontextmanager
    async def forwarding(self) -> AsyncIterator[Children]:
        """Forwards the stop signals to the children while open; on leaving it (an error),
        kills those still running, which out of the terminal's reach would run on."""
        loop = asyncio.get_running_loop()
        for sig in STOP_SIGNALS:
            loop.add_signal_handler(sig, self.forward, sig)
        loop.add_signal_handler(signal.SIGTSTP, self._suspend)
        loop.add_signal_handler(signal.SIGCONT, self._send_all, signal.SIGCONT)
        try:
            yield self
        finally:
            for sig in (*STOP_SIGNALS, signal.SIGTSTP, signal.SIGCONT):
                loop.remove_signal_handler(sig)
            for child in self.running.values():
                if child.returncode is None:
                    _send(child, signal.SIGKILL)
                    await child.wait()


def end_with_parent() -> None:
    """In a child (once its stop signals are handled): a SIGTERM when its parent dies, as it
    runs in a session of its own, out of the terminal's reach. At once if it died already."""
    parent = os.environ.get(PARENT_ENV)
    if parent is None:
        return
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    except (OSError, AttributeError):  # not Linux: the parent's own stop must do
        return
    if os.getppid() != int(parent):
        os.kill(os.getpid(), signal.SIGTERM)


def _send(child: asyncio.subprocess.Process, signum: int) -> None:
    if child.returncode is None:
        with contextlib.suppress(ProcessLookupError):  # it ended, not yet reaped
            child.send_signal(signum)


def supervise(child_args: Sequence[str], processes: int, *, restart: bool) -> int:
    """Runs `python -m crawlq worker ...child_args` P times; returns the worst exit code."""
    command = [sys.executable, "-m", "crawlq", "worker", *child_args]
    return asyncio.run(_supervise(Children(command, env_name="CRAWLQ_CHILD"), processes, restart))


async def _supervise(children: Children, processes: int, restart: bool) -> int:
    async with children.forwarding():
        codes = await asyncio.gather(
            *(_keep_running(children, slot, restart) for slot in range(processes))
        )
    return max(codes, key=abs)


async def _keep_running(children: Children, slot: int, restart: bool) -> int:
    """Runs the child of `slot`, again after a failure if `restart`, until it ends well or
    the parent is stopping; its last exit code (0 if it never started)."""
    code = 0
    while (child := await children.spawn(slot)) is not None:
        code = await child.wait()
        if not restart or code == 0 or children.stopping:
            break
        log.warning("worker process %d exited with %d; starting it again", child.pid, code)
        await children.pause(RESTART_PAUSE)
    return code
