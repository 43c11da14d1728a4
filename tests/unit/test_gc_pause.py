"""What a worker's thread makes to keep is frozen when it is done (pescheduler/worker/gc_pause.py)."""

from __future__ import annotations

import gc

from pescheduler.worker.gc_pause import frozen_after, gc_paused


def _visited(objs) -> list[bool]:
    """Whether each of ``objs`` is in a generation a collection visits (not frozen)."""
    tracked = {id(o) for g in (0, 1, 2) for o in gc.get_objects(generation=g)}
    return [id(o) in tracked for o in objs]


def test_what_a_job_made_to_keep_is_frozen_when_it_is_done_and_the_collector_was_on_meanwhile(
        no_automatic_collection, freezing):
    """Not paused: the collector's switch is the process's, and a paused job's objects were all
    visited at once by the first collection after any other thread's pause ended."""
    on, made = [], None

    def make():
        on.append(gc.isenabled())
        return [[i] for i in range(1000)]
    made = frozen_after(make)
    assert on == [True] and not any(_visited([made, *made]))


def test_inside_a_pause_it_freezes_before_the_collector_goes_on(no_automatic_collection, freezing):
    made = gc_paused(frozen_after, lambda: [[i] for i in range(1000)])
    assert gc.isenabled() and not any(_visited([made, *made]))
