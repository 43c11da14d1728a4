"""The collector paused around allocation-heavy work in any of a worker's threads
(pescheduler/worker/gc_pause.py): its switch is the process's, so it goes on again only once no
thread's pause is going on."""

from __future__ import annotations

import gc
import threading

from pescheduler.worker.gc_pause import gc_paused, gc_paused_kept

BOUND_S = 10.0


def _pausing(started: threading.Event, release: threading.Event, seen: list) -> threading.Thread:
    """A thread whose pause goes on until ``release``; ``seen`` gets whether the collector was on
    at the end of its work."""
    def work():
        started.set()
        assert release.wait(BOUND_S)
        seen.append(gc.isenabled())
    return threading.Thread(target=gc_paused, args=(work,))


def test_a_short_pause_ending_in_a_long_one_of_another_thread_leaves_the_collector_off():
    """A PE's batch (a short pause) ends while a part is made ready in another thread (a long
    one): the collector stays off until the long one ends. Turned on there, the next collection,
    in the PE's turn, visited what the long one had made so far: 10-48 ms at a time at 10^7 keys."""
    assert gc.isenabled()
    first_in, first_out, long_in, long_out = (threading.Event() for _ in range(4))
    seen = []
    short = _pausing(first_in, first_out, [])
    long = _pausing(long_in, long_out, seen)
    short.start()
    assert first_in.wait(BOUND_S)
    long.start()                                # its pause begins inside the short one's
    assert long_in.wait(BOUND_S)
    first_out.set()
    short.join(BOUND_S)
    on_between = gc.isenabled()                 # the short one is over, the long one goes on
    long_out.set()
    long.join(BOUND_S)
    assert not short.is_alive() and not long.is_alive()
    assert not on_between, "the collector went on while another thread's pause went on"
    assert seen == [False] and gc.isenabled()


def test_the_collector_left_off_by_someone_else_stays_off():
    gc.disable()
    try:
        assert gc_paused(gc.isenabled) is False
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_what_a_kept_pause_made_is_frozen_before_the_collector_goes_on(no_automatic_collection, freezing):
    made = gc_paused_kept(lambda: [[i] for i in range(1000)])
    tracked = {id(o) for g in (0, 1, 2) for o in gc.get_objects(generation=g)}
    assert not any(id(o) in tracked for o in (made, *made)) and gc.isenabled()
