"""A process's identity that outlives PID reuse and does not move with the wall clock.

A PID alone names another process once the first one is gone, so an owner is
recorded as its PID and its start. psutil's ``create_time`` is that start in
wall-clock seconds (the start since boot plus the boot time read from the
kernel), and the kernel's boot time moves when the wall clock is stepped: a
step of a second made every live owner look gone (a loaded test suite removed
three live PostgreSQL servers' dirs; lab_net's ledgers are named the same way).
The start in clock ticks since boot (``/proc/<pid>/stat``'s 22nd field) does
not move; where there is no procfs, ``create_time`` to the hundredth.
"""

from __future__ import annotations

import psutil


def started(pid: int) -> str | None:
    """Process ``pid``'s start as a string to compare for equality; None when it does not run."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f"t{int(f.read().rsplit(')', 1)[1].split()[19])}"
    except FileNotFoundError:
        return None
    except (OSError, ValueError, IndexError):
        pass
    try:
        return f"{psutil.Process(pid).create_time():.2f}"
    except psutil.Error:
        return None
