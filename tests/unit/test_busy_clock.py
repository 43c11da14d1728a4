"""busy_clock never goes back in a thread: the run-queue wait it subtracts is counted on the
scheduler's clock, which can run ahead of ``perf_counter`` by milliseconds (seen 19 times in 15 s
on this loaded machine); a negative busy increment made a source's cumulative busy time fall and
the monitor took its PE for a restarted one."""

from __future__ import annotations

import threading
import time

import pytest

from pescheduler.worker import busy


@pytest.mark.skipif(busy.busy_clock is not busy._schedstat_clock, reason="no /proc/thread-self/schedstat here")
def test_a_wait_counted_ahead_of_the_wall_clock_does_not_take_the_busy_clock_back(monkeypatch):
    seen = []

    def in_a_thread():
        waits = iter([0, 0, 5_000_000, 5_000_000])        # ns of run-queue wait: +5 ms between two reads
        real = busy.os.pread
        monkeypatch.setattr(busy.os, "pread", lambda fd, n, off: f"1 {next(waits)} 1".encode())
        try:
            seen.extend(busy.busy_clock() for _ in range(3))
            time.sleep(0.01)                              # the wall clock catches up with the wait
            seen.append(busy.busy_clock())
        finally:
            monkeypatch.setattr(busy.os, "pread", real)

    t = threading.Thread(target=in_a_thread)            # a fresh thread: its own last reading
    t.start()
    t.join()
    assert seen[2] == seen[1]                  # the wall clock advanced less than the wait: held, not back
    assert all(b >= a for a, b in zip(seen, seen[1:]))
    assert seen[3] > seen[2]                   # and goes on once the wall clock has caught up
