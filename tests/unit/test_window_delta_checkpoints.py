"""A memory time window's checkpoints write what changed, as deltas of its key groups
(operators/pane_layers.py: the tops a snapshot pushes are the keys changed since the one before).

The worker's side is the real ChainWriter through CheckpointFiles into a ``memory://`` storage; the
restore the real CheckpointStore, ``load_snapshot`` and ``resolve_restore``, then ``Window.restore``.
"""

from __future__ import annotations

import random
import uuid

import cloudpickle
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from keyed_stores import restored_state
from test_window_checkpoint_layers import SIZE, SLIDE, VALUES, opened, panes_now

from pescheduler.checkpoint import CheckpointStore
from pescheduler.errors import CheckpointDamaged
from pescheduler.operator import MAX_WATERMARK, Emitter
from pescheduler.operators.pane_layers import PanesView
from pescheduler.operators.window import Window
from pescheduler.state.groups import DELTA_SET, unpack_namespaced
from pescheduler.state.incremental import pickle_snapshot
from pescheduler.worker.ckpt_files import CheckpointFiles

KEY = b"k" * 32


def hold(files: CheckpointFiles, window: Window, checkpoint_id: int) -> None:
    """The barrier's part of a checkpoint: the snapshot taken and handed to the worker."""
    blob, views = pickle_snapshot({"op": {"state": window.snapshot(), "progress": None, "driver": None}})
    files.hold("d", checkpoint_id, "pe", {"state": blob, "views": views, "positions": {}})


def write(files: CheckpointFiles, store: CheckpointStore, checkpoint_id: int, complete: bool) -> dict:
    """The worker's part: its files written, the manifest committed (or the checkpoint aborted)."""
    out = files.write("d", checkpoint_id, ["pe"], store.url)["pe"]
    if complete:
        store.commit_manifest(checkpoint_id, {"id": checkpoint_id, "files": out["files"]})
    files.end("d", checkpoint_id, complete=complete)
    return out


def checkpoint(files: CheckpointFiles, store: CheckpointStore, window: Window, checkpoint_id: int,
               complete: bool = True) -> dict:
    """One checkpoint of one PE holding ``window``, as the barrier and the worker take it; its
    manifest committed when ``complete`` (else the checkpoint is aborted after its write)."""
    hold(files, window, checkpoint_id)
    return write(files, store, checkpoint_id, complete)


def written(out: dict, checkpoint_id: int) -> int:
    return sum(f["bytes"] for f in out["files"] if f["chk"] == checkpoint_id)


def restored(store: CheckpointStore, checkpoint_id: int) -> dict:
    """``{pane start: {key: slots}}`` of a fresh window restored from the checkpoint, keys in
    the order the restore gives them."""
    fresh = Window(SIZE, SLIDE, dict(VALUES))
    fresh.restore(restored_state(store, checkpoint_id))
    return {p: dict(d) for p, d in fresh._panes.items() if d}


def ordered(panes: dict) -> dict:
    return {p: list(d.items()) for p, d in sorted(panes.items())}


def rows(keys, ts: int, v: int = 1) -> list[dict]:
    return [{"k": f"k{i:06d}", "v": v, "ts": ts} for i in keys]


def test_after_one_percent_of_a_windows_keys_changed_a_checkpoint_writes_under_five_percent():
    """20,000 keys in an open pane: after the first two checkpoints, one after 1 % of the keys
    changed (and a few new ones) writes under 5 % of the first's bytes, and restores the panes
    exactly, in first-seen order; a fired pane's drop reaches the next checkpoint too."""
    store, files = CheckpointStore(f"memory://win-{uuid.uuid4().hex}", KEY), CheckpointFiles()
    window, out = opened(), Emitter()
    window.process(rows(range(20_000), ts=5), out)
    window.process(rows(range(100), ts=25), out)            # a second pane
    full = written(checkpoint(files, store, window, 1), 1)
    window.process(rows(range(0, 20_000, 50), ts=6), out)
    checkpoint(files, store, window, 2)
    window.process(rows(range(7, 20_000, 100), ts=7, v=3) + rows(range(20_000, 20_010), ts=8), out)
    third = checkpoint(files, store, window, 3)
    assert written(third, 3) <= 0.05 * full, f"a checkpoint after 1 % changed wrote {written(third, 3)} of {full} bytes"
    assert ordered(restored(store, 3)) == ordered(panes_now(window))
    window.on_watermark(SIZE + 1, out)                      # pane 0 fires its last window and goes
    assert 0 not in window._panes
    window.process(rows(range(3), ts=26), out)
    checkpoint(files, store, window, 4)
    assert ordered(restored(store, 4)) == ordered(panes_now(window))


def test_a_checkpoint_after_one_aborted_before_its_write_is_written_whole_and_restores_exactly():
    """A delta holds the changes since the snapshot before only (``Changes.one_step``): after a
    checkpoint aborted before its write (its snapshot's changes in no file) the next writes every
    group whole; after one aborted once written, the next builds on its files. Each restores
    exactly."""
    store, files = CheckpointStore(f"memory://win-{uuid.uuid4().hex}", KEY), CheckpointFiles()
    window, out = opened(), Emitter()
    window.process(rows(range(5_000), ts=5), out)
    full = written(checkpoint(files, store, window, 1), 1)
    window.process(rows(range(5_000, 5_050), ts=5), out)
    checkpoint(files, store, window, 2)
    window.process(rows(range(5_050, 5_100), ts=5) + rows(range(0, 5_000, 100), ts=5), out)
    hold(files, window, 3)
    files.end("d", 3, complete=False)                       # aborted before the worker wrote it
    window.process(rows(range(1, 5_000, 100), ts=5), out)
    fourth = checkpoint(files, store, window, 4)
    assert written(fourth, 4) >= full, "a delta left out the changes of a snapshot no file holds"
    assert ordered(restored(store, 4)) == ordered(panes_now(window))
    window.process(rows(range(2, 5_000, 100), ts=5), out)
    checkpoint(files, store, window, 5, complete=False)     # aborted once written: built on
    window.process(rows(range(3, 5_000, 100), ts=5) + rows(range(5_100, 5_110), ts=5), out)
    sixth = checkpoint(files, store, window, 6)
    assert written(sixth, 6) <= 0.05 * full
    assert ordered(restored(store, 6)) == ordered(panes_now(window))


def test_a_delta_that_changes_a_key_its_chain_lacks_is_refused_loudly():
    from pescheduler.state.groups import _per_ns

    with pytest.raises(CheckpointDamaged, match="do not hold"):
        _per_ns({0: ([0], {"a": [1]}), (0, DELTA_SET, "b"): [2]})


@settings(max_examples=100, deadline=None)
# Found by a loaded suite (session 56) while the harness imported the exported part as it was, unpickled: its
# slots were the frozen view's own objects, and the fold after the import changed them in place before the
# write. A part always crosses pickled (handover.py), as the harness now passes it.
@example(steps=["batch", "snapshot", "export", "import", "batch", "write"], busy=False, seed=39)
@given(steps=st.lists(st.sampled_from(["batch", "batch", "batch", "watermark", "snapshot", "snapshot", "write",
                                       "write", "abort", "drop", "export", "import"]), min_size=5, max_size=50),
       busy=st.booleans(),
       seed=st.integers(0, 10**6))
def test_every_complete_checkpoint_restores_the_panes_it_was_taken_of_in_order(steps, seed, busy):
    """Random batches (keys seen before and new ones), watermarks that fire and drop panes, a
    snapshot at a barrier and its write later (batches folded in between, and with ``busy`` one
    more as soon as the writer has read the view, as the PE's thread folds beside it), complete,
    aborted once written, or let go before it (``drop``), a rescale's export and import: every
    complete checkpoint, full files and deltas, restores the panes as they were at its barrier,
    keys in first-seen order, and the window fires exactly what one never checkpointed fires."""
    rng = random.Random(seed)
    store, files = CheckpointStore(f"memory://win-{uuid.uuid4().hex}", KEY), CheckpointFiles()
    checked, reference = opened(), opened()
    out, ref_out = Emitter(), Emitter()
    ts, wm, part, cid, pending = 0, -1, None, 0, None

    def fold() -> None:
        nonlocal ts
        batch = []
        for _ in range(rng.randrange(1, 60)):
            ts += rng.randrange(0, 4)
            batch.append({"k": f"k{rng.randrange(80)}", "v": rng.randrange(5),
                          "ts": max(ts - rng.randrange(8), wm + SIZE)})
        checked.process([dict(t) for t in batch], out)
        reference.process([dict(t) for t in batch], ref_out)

    read = PanesView._groups

    def read_then_fold(view):           # the PE's thread folds as soon as the writer has read the view
        first = view._packed is None
        packed = read(view)
        if first and busy:
            fold()
        return packed

    PanesView._groups = read_then_fold
    try:
        for step in steps:
            if step == "batch":
                fold()
            elif step == "watermark" and ts - 10 > wm:
                wm = ts - 10
                checked.on_watermark(wm, out)
                reference.on_watermark(wm, ref_out)
            elif step == "snapshot" and pending is None:
                cid += 1
                pending = cid, ordered(panes_now(checked))
                hold(files, checked, cid)
            elif step in ("write", "abort") and pending is not None:
                write(files, store, pending[0], complete=step == "write")
                if step == "write":
                    assert ordered(restored(store, pending[0])) == pending[1]
                pending = None
            elif step == "drop" and pending is not None:
                files.end("d", pending[0], complete=False)
                pending = None
            elif step == "export" and part is None:
                moving = frozenset(rng.sample(range(128), 16))
                part = checked.export_groups(moving), reference.export_groups(moving)
            elif step == "import" and part is not None:     # a part crosses a process, pickled
                checked.import_groups(cloudpickle.loads(cloudpickle.dumps(part[0])))    # (handover.py)
                reference.import_groups(cloudpickle.loads(cloudpickle.dumps(part[1])))
                part = None
    finally:
        PanesView._groups = read
    checked.on_watermark(MAX_WATERMARK, out)
    reference.on_watermark(MAX_WATERMARK, ref_out)
    assert list(out) == list(ref_out)


def test_a_restored_group_applies_a_delta_in_the_order_its_files_were_written():
    """Unit of the reader (``groups._per_ns``): a key changed twice takes the later slots, a key
    new in one delta and changed in the next keeps its place, new keys go after the held ones
    by place, a dropped pane goes."""
    from pescheduler.state.groups import DELTA_DROP, DELTA_NEW

    read = {0: ([0, 2], {"a": [1], "c": [1]}), 1: ([0], {"z": [1]}),
            (0, DELTA_NEW, "d"): (5, [1]), (0, DELTA_SET, "a"): [2], (0, DELTA_NEW, "b"): (4, [1]),
            (1, DELTA_DROP): None}
    read[(0, DELTA_SET, "d")] = [3]       # a later delta's (the dict keeps the first place: applied in order)
    got = unpack_namespaced({7: ("a", read)})
    assert {p: list(d.items()) for p, d in got.items()} == {0: [("a", [2]), ("c", [1]), ("b", [1]), ("d", [3])]}


def test_a_checkpoint_of_deltas_packs_only_the_groups_it_rewrites_whole(monkeypatch):
    """The writer names the groups it may rewrite whole before reading the view
    (``ChainWriter._may_rewrite``, ``StateView.reads_full``): a window's checkpoint of deltas packs
    those (their turn: a few of the 128), not every group of its panes, and restores exactly."""
    import pescheduler.operators.pane_layers as pane_layers

    store, files = CheckpointStore(f"memory://win-{uuid.uuid4().hex}", KEY), CheckpointFiles()
    window, out = opened(), Emitter()
    packed, pack = [], pane_layers.pack_namespaced_chunks
    monkeypatch.setattr(pane_layers, "pack_namespaced_chunks", lambda per_ns: packed.append(1) or pack(per_ns))
    window.process(rows(range(20_000), ts=5), out)
    checkpoint(files, store, window, 1)
    assert len(packed) == 128                               # the first: every group whole
    for cid in (2, 3, 4):
        packed.clear()
        window.process(rows(range(cid, 20_000, 100), ts=5, v=cid), out)
        done = checkpoint(files, store, window, cid)
        fulls = sum(1 for f in done["files"] if f["chk"] == cid and f["path"].endswith(".full"))
        assert len(packed) == fulls <= 16, f"checkpoint {cid} packed {len(packed)} groups, wrote {fulls} whole"
        assert ordered(restored(store, cid)) == ordered(panes_now(window))


def test_groups_whose_deltas_outgrow_their_full_files_are_named_and_written_whole():
    """2,000 keys, then 60 % of them changed before each checkpoint: a chain's deltas soon hold
    more keys than its full file, and such a group is rewritten whole before its turn. The writer
    names it to the view before its first file (``_may_rewrite``: the keys changed standing for
    the delta's length; a group not named and asked for whole raises); each restore is exact."""
    store, files = CheckpointStore(f"memory://win-{uuid.uuid4().hex}", KEY), CheckpointFiles()
    window, out = opened(), Emitter()
    window.process(rows(range(2_000), ts=5), out)
    checkpoint(files, store, window, 1)
    for cid in range(2, 7):
        window.process(rows([i for i in range(2_000) if (i * 7 + cid) % 10 < 6], ts=5, v=cid), out)
        checkpoint(files, store, window, cid)
        assert ordered(restored(store, cid)) == ordered(panes_now(window))


def test_a_windows_view_lets_its_packed_groups_go_when_released():
    """A view's packed groups are let go when the writer releases it, one at a time (freed
    together at the write's end, 128 of 2.7 MB at 10^7 keys held the GIL 15-31 ms in ``munmap``
    on glibc's malloc): the view holds none of them after, taken by the writer or not."""
    import sys

    window = opened()
    window.process(rows(range(5_000), ts=5), Emitter())
    _blob, views = pickle_snapshot({"op": {"state": window.snapshot()}})
    (view,) = [v.view for v in views if isinstance(v.view, PanesView)]
    groups = view.groups()
    view.reads_full(groups)
    data, count, _first = view.full(groups[0])
    _first, left = view.group_snapshot(groups[1])
    assert count > 0 and sys.getrefcount(data) == 3 == sys.getrefcount(left)   # (the view's, ours, the call's)
    view.release()
    assert sys.getrefcount(data) == 2, "a group the writer took outlived the view's release"
    assert sys.getrefcount(left) == 2, "a group not taken outlived the view's release"
