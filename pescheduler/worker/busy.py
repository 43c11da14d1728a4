"""The clock busy time is measured on: wall time minus the time the thread waited for a CPU.

Wall time alone is untrue on a shared core: it grows as the PE's share
shrinks, so a rate per busy second falls with contention and a policy asks
for ever more copies (issue 15). CPU time alone (``time.thread_time``) is
untrue for an operator that blocks (a database call, a sleep): copies of it
do help, yet it would look idle. Linux counts both apart per thread in
``/proc/thread-self/schedstat`` (``on-CPU ns, waiting-on-a-runqueue ns,
slices``), so :func:`busy_clock` is ``perf_counter()`` minus that wait:
the operator's processing time, blocking included, contention excluded;
per busy second the rate is the true processing rate DS2 sizes by.
Reading it costs about 4 µs (two ``pread`` on a per-thread descriptor, the
wait read on both sides of the wall clock: :func:`_schedstat_clock`),
taken twice per batch per operator, never per tuple. Without schedstat
(not Linux), it is ``time.thread_time`` (CPU time).

The ``pread`` keeps the GIL (libc's, through ``ctypes.PyDLL``): ``os.pread``
lets it go for the system call, and a thread that lets the GIL go beside one
that runs Python (a checkpoint's writer) gets it back only when that one is
made to yield, up to the switch interval later (5 ms). At two readings per
batch per operator that was most of a PE's time while a writer ran: 100
readings took 77 ms beside a spinning thread, against 0.2 ms holding the GIL
(the PE thread of a 10^7-key checkpoint's stall, sampled, waited there).
"""

from __future__ import annotations

import ctypes
import os
import threading
import time

_SCHEDSTAT = "/proc/thread-self/schedstat"


class _Fd(int):
    """A thread's open schedstat file, closed when the thread ends (its thread-locals go)."""

    def __del__(self) -> None:
        os.close(self)


_stat = threading.local()


def _gil_keeping_pread():
    """libc's ``pread(fd, buffer, 64, 0)`` called with the GIL held (``ctypes.PyDLL``): the bytes
    read, or None where libc cannot be had this way (then ``os.pread``)."""
    try:
        pread = ctypes.PyDLL(None, use_errno=True).pread
    except (OSError, AttributeError):
        return None
    pread.argtypes = (ctypes.c_int, ctypes.c_char_p, ctypes.c_size_t, ctypes.c_long)
    pread.restype = ctypes.c_ssize_t

    def read(fd: int) -> bytes:
        try:
            buffer = _stat.buffer
        except AttributeError:
            buffer = _stat.buffer = ctypes.create_string_buffer(64)
        n = pread(fd, buffer, 64, 0)
        if n < 0:
            raise OSError(ctypes.get_errno(), "pread of schedstat failed")
        return buffer.raw[:n]
    return read


_read = _gil_keeping_pread() or (lambda fd: os.pread(fd, 64, 0))


def _schedstat_clock() -> float:
    """Never earlier than this thread's last reading: the run-queue wait is counted on the
    scheduler's clock, not ``perf_counter``'s, and read back to back the difference went back
    by up to 4 ms (19 times in 15 s of a loaded machine); a batch's busy time came out negative,
    a source's cumulative busy time fell, and the monitor took its PE for a new one and reported
    averages since its start for that window (bench/elastic.py, issue 15)."""
    try:
        fd, last = _stat.fd, _stat.last
    except AttributeError:
        fd = _stat.fd = _Fd(os.open(_SCHEDSTAT, os.O_RDONLY))   # thread-self: this thread's, for good
        last = 0.0
    # The wait read on both sides of the wall clock, again while they differ (at most thrice): a
    # thread preempted between the two reads had its wait counted and not its wall time, and its
    # batch's busy time came out short by that wait (four sleeps of 50 ms measured 156 ms busy in
    # a loaded suite).
    after = _wait(fd)
    for _ in range(3):
        before, wall, after = after, time.perf_counter(), _wait(fd)
        if after == before:
            break
    now = wall - after * 1e-9
    if now < last:
        return last
    _stat.last = now
    return now


def _wait(fd: int) -> int:
    """This thread's time waiting on a runqueue so far, in ns (schedstat's second field)."""
    return int(_read(fd).split()[1])


def _has_schedstat() -> bool:
    try:
        with open(_SCHEDSTAT) as f:
            int(f.read().split()[1])
        return True
    except (OSError, ValueError, IndexError):
        return False


busy_clock = _schedstat_clock if _has_schedstat() else time.thread_time
