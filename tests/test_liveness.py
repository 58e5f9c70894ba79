"""pid_exists: a live process, a dead one, and numbers no process can have (read from file
names others left: a metrics file named with a pid past 2**31 made /metrics answer 500)."""

from __future__ import annotations

import os
import subprocess
import sys

from crawlq.liveness import pid_exists


def test_a_live_process_exists_and_a_reaped_one_does_not() -> None:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    assert pid_exists(os.getpid())
    assert not pid_exists(child.pid)


def test_numbers_no_process_can_have_are_no_process() -> None:
    assert not pid_exists(0)  # os.kill(0, 0) asks about our own process group
    assert not pid_exists(-1)  # and -1 about every process we may signal
    assert not pid_exists(2**31)
    assert not pid_exists(2**70)
