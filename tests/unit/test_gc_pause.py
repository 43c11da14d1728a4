"""The collector held off while a worker's thread makes what will live on, and that frozen when it
is done (pescheduler/worker/gc_pause.py)."""

from __future__ import annotations

import gc
import threading

from pescheduler.worker.gc_pause import gc_held, gc_paused

BOUND_S = 10.0


def _visited(objs) -> list[bool]:
    """Whether each of ``objs`` is in a generation a collection visits (not frozen)."""
    tracked = {id(o) for g in (0, 1, 2) for o in gc.get_objects(generation=g)}
    return [id(o) in tracked for o in objs]


def _batch_in_another_thread():
    """A PE's batch, paused, begun in another thread: ``(end, thread)``; set ``end`` to end it."""
    began, end = threading.Event(), threading.Event()
    thread = threading.Thread(target=gc_paused, args=(lambda: began.set() or end.wait(BOUND_S),))
    thread.start()
    assert began.wait(BOUND_S)
    return end, thread


def test_a_batch_ending_while_a_job_holds_the_collector_off_leaves_it_off(no_automatic_collection, freezing):
    """A part made ready in a thread while the PE's batches begin and end: a batch begun before the
    job and ended during it turned the collector on, and the next collection (in the PE's turn)
    visited what the job had made so far: 10-48 ms at a time at 10^7 keys on ``disk``. Held, it
    stays off until the job is done, and what the job made is frozen then."""
    end, batch = _batch_in_another_thread()
    seen = []

    def job():
        end.set()
        batch.join(BOUND_S)
        seen.append((batch.is_alive(), gc.isenabled()))
        return [[i] for i in range(1000)]
    made = gc_held(job)
    assert seen == [(False, False)], "the batch's end turned the collector on during the job"
    assert gc.isenabled() and not any(_visited([made, *made]))


def test_batches_overlapping_in_two_threads_leave_the_collector_to_the_first_that_ends():
    """A batch's pause stays a toggle: counted, a threaded PE's batches and its loop's decodes
    overlapping kept the collector off for long stretches (a collection after visited all that came
    meanwhile)."""
    end, batch = _batch_in_another_thread()
    seen = []
    gc_paused(lambda: end.set() or batch.join(BOUND_S) or seen.append(gc.isenabled()))
    assert seen == [True] and gc.isenabled()


def test_inside_a_pause_what_a_read_made_is_frozen_before_the_collector_goes_on(no_automatic_collection, freezing):
    """A memory window's view read for a checkpoint inside a batch's pause (in a PE's turn)."""
    made = gc_paused(gc_held, lambda: [[i] for i in range(1000)])
    assert gc.isenabled() and not any(_visited([made, *made]))
