"""busy_clock never goes back in a thread: the run-queue wait it subtracts is counted on the
scheduler's clock, which can run ahead of ``perf_counter`` by milliseconds (seen 19 times in 15 s
on this loaded machine); a negative busy increment made a source's cumulative busy time fall and
the monitor took its PE for a restarted one."""

from __future__ import annotations

import sys
import threading

from pescheduler.worker import busy


def test_a_wait_counted_ahead_of_the_wall_clock_does_not_take_the_busy_clock_back(monkeypatch):
    """The schedstat clock, with its file and both clocks given: it runs on any platform."""
    waits = iter([0, 0, 0, 0, 5_000_000, 5_000_000, 5_000_000, 5_000_000])  # ns of run-queue wait, read
    #                                                    # each side of the wall clock: +5 ms between two readings
    walls = iter([1.000, 1.001, 1.002, 1.010])            # s of perf_counter: 1 ms, 1 ms, then 8 ms on
    monkeypatch.setattr(busy.os, "open", lambda path, flags: -1)
    monkeypatch.setattr(busy, "_read", lambda fd: f"1 {next(waits)} 1".encode())
    monkeypatch.setattr(busy.time, "perf_counter", lambda: next(walls))
    monkeypatch.setattr(busy._Fd, "__del__", lambda self: None)   # no real descriptor to close
    seen = []
    t = threading.Thread(target=lambda: seen.extend(busy._schedstat_clock() for _ in range(4)))
    t.start()                                            # a fresh thread: its own last reading
    t.join()
    assert seen[2] == seen[1]                  # the wall clock advanced less than the wait: held, not back
    assert all(b >= a for a, b in zip(seen, seen[1:]))
    assert seen[3] > seen[2]                   # and goes on once the wall clock has caught up


def test_a_thread_preempted_between_reading_the_wall_clock_and_its_wait_reads_its_busy_clock_true(monkeypatch):
    """The wall clock read, then the thread preempted 40 ms, then its wait read: the reading took
    the wait and not the wall time, 40 ms short, and a batch ending there lost 40 ms of busy time
    (four sleeps of 50 ms measured 156 ms busy in a loaded suite). The wait is read on both sides
    of the wall clock, again while they differ: the reading is wall minus wait at one instant."""
    kernel = {"wall": 1.000, "wait_ns": 0, "preempted": False}

    def perf_counter() -> float:
        wall = kernel["wall"]
        if not kernel["preempted"]:                      # right after this call returns: 40 ms on a runqueue
            kernel.update(wall=wall + 0.040, wait_ns=kernel["wait_ns"] + 40_000_000, preempted=True)
        return wall
    monkeypatch.setattr(busy.os, "open", lambda path, flags: -1)
    monkeypatch.setattr(busy, "_read", lambda fd: f"1 {kernel['wait_ns']} 1".encode())
    monkeypatch.setattr(busy.time, "perf_counter", perf_counter)
    monkeypatch.setattr(busy._Fd, "__del__", lambda self: None)
    seen = []
    t = threading.Thread(target=lambda: seen.append(busy._schedstat_clock()))
    t.start()
    t.join()
    assert abs(seen[0] - 1.000) < 1e-9, f"read {seen[0]:.3f}: the wall clock minus a wait it did not see"


def test_reading_the_busy_clock_keeps_the_gil_beside_a_thread_running_python():
    """``os.pread`` let the GIL go for its system call, and beside a thread running Python (a
    checkpoint's writer) the PE got it back only when that one was made to yield, up to the
    switch interval later: 100 readings took 77 ms, and a checkpoint of 10^7 keys stalled the
    operator's output 146 ms. Counted, not timed: with the switch interval made long, a spinning
    thread can only run while the reader lets the GIL go (or once, at a switch it asked for before
    the interval changed); on the old clock it ran during three readings, here during one at most."""
    if busy.busy_clock is not busy._schedstat_clock:
        return                                  # no schedstat here: thread_time keeps the GIL anyway
    stop, spins = threading.Event(), [0]

    def spin() -> None:
        while not stop.is_set():
            spins[0] += 1
    spinner = threading.Thread(target=spin, daemon=True)
    interval = sys.getswitchinterval()
    spinner.start()
    try:
        while spins[0] == 0:                    # it runs: it wants the GIL from now on
            busy.busy_clock()
        sys.setswitchinterval(1.0)              # no forced switch within the readings below but one: the
        ran_during = 0                          # spinner may have asked for it on the old interval already
        for _ in range(1000):
            before = spins[0]
            busy.busy_clock()
            if spins[0] != before:
                ran_during += 1
                if ran_during > 2:
                    break                       # the old clock: each costs up to the interval, enough
    finally:
        sys.setswitchinterval(interval)
        stop.set()
        spinner.join(5)
    assert ran_during <= 1
