"""`--processes P`: P worker processes under one parent that forwards stop signals.

A child that dies on its own (killed, out of memory) is started again unless the worker runs
in burst mode or is stopping; its leased elements come back when their leases expire.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from types import FrameType

log = logging.getLogger("crawlq.supervisor")

RESTART_PAUSE = 1.0


def supervise(child_args: Sequence[str], processes: int, *, restart: bool) -> int:
    """Runs `python -m crawlq worker ...child_args` P times; returns the worst exit code."""
    command = [sys.executable, "-m", "crawlq", "worker", *child_args]
    children: dict[int, subprocess.Popen[bytes]] = {}
    stopping = False

    def spawn(slot: int) -> None:
        children[slot] = subprocess.Popen(command, env={**os.environ, "CRAWLQ_CHILD": str(slot)})

    def forward(signum: int, _frame: FrameType | None) -> None:
        nonlocal stopping
        stopping = True
        for child in children.values():
            if child.poll() is None:
                child.send_signal(signum)

    previous = {sig: signal.signal(sig, forward) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        for slot in range(processes):
            spawn(slot)
        codes: dict[int, int] = {}
        while len(codes) < processes:
            pid, status = os.wait()
            found = next((s for s, c in children.items() if c.pid == pid), None)
            if found is None:
                continue
            slot = found
            code = os.waitstatus_to_exitcode(status)
            children[slot].returncode = code
            if restart and not stopping and code != 0:
                log.warning("worker process %d exited with %d; starting it again", pid, code)
                time.sleep(RESTART_PAUSE)
                spawn(slot)
                continue
            codes[slot] = code
        return max(codes.values(), key=abs)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        for child in children.values():
            if child.poll() is None:
                child.kill()
                child.wait()
