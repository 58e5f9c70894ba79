"""Whether a process of this machine is still alive: for what a process leaves behind when it
dies (a worker's registration, an export's part file, a metrics file) and others clean up."""

from __future__ import annotations

import os


def pid_exists(pid: int) -> bool:
    """Whether a process `pid` runs on this machine (one of another user's counts). Numbers
    no process can have (read from a file name: 0, negative, past the kernel's range) are
    none: 0 and negative ones would ask about process groups."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, OverflowError):
        return False
    except PermissionError:  # another user's
        return True
    return True
