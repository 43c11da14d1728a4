"""A ``memory`` snapshot leaves no dict of the keys written since in the collector's young generations.

The state notes every key put since the snapshot, with its value, in two dicts (``writable()``'s and
the next fold's), which a snapshot replaces by new ones. New, they were young: a young collection
visits every entry of every young container, and the two grew for seconds before one promoted
them (at 10^7 keys deployed, 21,769-58,152 entries each at a generation-1 collection of 5-23 ms,
inside checkpoints in the rows that missed the stall goal: docs/state-log.md, session 60). The
snapshot now freezes them while they are empty, where the process freezes survivors (a worker
with ``pe.gc-freeze`` on: ``pescheduler/collector.py``).
"""

from __future__ import annotations

import gc

from pescheduler.state import MemoryState


def _young(obj) -> bool:
    return any(o is obj for g in (0, 1) for o in gc.get_objects(generation=g))


def test_a_snapshot_leaves_the_dicts_of_the_keys_written_since_old(no_automatic_collection, freezing):
    state = MemoryState()
    state.write_many({k: {"v": k} for k in range(1000)})
    view = state.snapshot()
    written, unfolded = state.writable(), state._unfolded
    assert not _young(written) and not _young(unfolded), \
        "the snapshot's new dicts of the keys written since are in a young generation"
    state.write_many({k: {"v": -k} for k in range(5000)})
    assert state.writable() is written and len(written) == 5000
    big = [len(o) for g in (0, 1) for o in gc.get_objects(generation=g) if type(o) is dict and len(o) >= 5000]
    assert not big, f"young dicts of {big} entries, which every young collection would visit"
    view.release()
    assert state.read(7) == {"v": -7}


def test_where_the_process_does_not_freeze_a_snapshot_collects_and_freezes_nothing(no_automatic_collection):
    """A process that does not freeze survivors (``pe.gc-freeze`` off, or no worker) is not made to
    collect or freeze, with the collector on or off."""
    state = MemoryState()
    state.put("a", {"v": 1})
    gc.disable()
    try:
        before = gc.get_stats()[1]["collections"]
        state.snapshot().release()
        assert gc.get_stats()[1]["collections"] == before
        assert gc.get_freeze_count() == 0
    finally:
        gc.enable()
    state.snapshot().release()
    assert gc.get_freeze_count() == 0


def test_a_folds_grouping_keeps_no_list_of_the_keys_written_from_the_snapshot_to_the_fold(no_automatic_collection):
    """A snapshot's deferred fold groups the keys written since the last one a slice at a time, in
    the checkpoint's writer, and keeps the groups until the fold is applied. Kept as lists of 8,192
    keys and of their groups, they were young containers, and each young collection visited every
    item (a cache miss per key): at 10^7 keys, 5-18 ms inside the checkpoints of the rows that
    missed the stall goal (docs/state-log.md, session 61). The groups are bytes now, and the keys
    are read again from the fold's dict of them."""
    state = MemoryState()
    state.write_many({k: {"v": k} for k in range(1000)})
    state.snapshot().release()
    state.write_many({k: {"v": -k} for k in range(20_000)})
    view = state.snapshot()
    fold = state._pending
    for _ in fold.paced():
        pass
    assert fold._grouped is not None, "the fold's grouping was not kept"
    lists = [len(o) for g in (0, 1) for o in gc.get_objects(generation=g) if type(o) is list and len(o) >= 1000]
    assert not lists, f"young lists of {lists} items kept from the snapshot to the fold"
    assert {k: v for g in view.groups() for k, v in view.items(g)} == {k: {"v": -k} for k in range(20_000)}
    view.release()
