"""A memory time window's checkpoint freezes its panes and packs them off the PE's loop
(operators/pane_layers.py): the snapshot in the PE's turn visits no key, the view packs the panes
as they were at the snapshot however the stream changed them since (slots folded in place, keys
added, panes fired and dropped, a rescale's export), and the window's output is unchanged."""

import copy
import random

import cloudpickle
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pescheduler.operator import MAX_WATERMARK, Emitter, OperatorContext
from pescheduler.operators.pane_layers import merged_items
from pescheduler.operators.window import Window
from pescheduler.state import groups
from pescheduler.state.groups import take_namespaced
from pescheduler.state.incremental import pickle_snapshot
from pescheduler.wire import key_group

SIZE, SLIDE = 60, 20
VALUES = {"n": ("count", "v"), "total": ("sum", "v"), "lo": ("min", "v")}
COLLECTIONS = {"n": ("count", "v"), "seen": ("count_distinct", "v")}     # a set, changed in place


class Key(str):
    """A key that counts how often it is hashed (every dict visit of it)."""

    hashed = 0

    def __hash__(self) -> int:
        Key.hashed += 1
        return str.__hash__(self)


def opened(aggregates=VALUES) -> Window:
    window = Window(SIZE, SLIDE, aggregates)
    window.open(OperatorContext("w", pe_id="pe1", key_field="k", extra={"state": "memory"}))
    return window


def panes_now(window: Window) -> dict:
    """``{pane start: {key: slots}}`` as the window holds them (its layers merged), deep-copied; a
    pane whose every key left with an export holds nothing (as its restore)."""
    older = window._layers.older
    merged = {p: dict(merged_items((d, *older.get(p, ())))) for p, d in window._panes.items()}
    return copy.deepcopy({p: m for p, m in merged.items() if m})


def restored_panes(snapshot: dict) -> dict:
    fresh = Window(SIZE, SLIDE, dict(VALUES) if "min(v)" in snapshot["layout"] else dict(COLLECTIONS))
    fresh.restore(cloudpickle.loads(cloudpickle.dumps(snapshot)))
    return {p: dict(d) for p, d in fresh._panes.items() if d}


def test_the_snapshot_visits_no_key_and_the_writer_packs_the_panes(monkeypatch):
    """20,000 keys in a pane: the snapshot in the PE's turn hashes none of them (it hashed each,
    packing them into key groups there: 1.3-2.0 s at 10^6 keys); its groups are a view the
    checkpoint's writer packs (``pickle_snapshot`` sets it aside), a chunk of keys per pickle
    (16 here), and they restore in the order the keys were first seen."""
    monkeypatch.setattr(groups, "PACK_CHUNK", 16)
    window = opened()
    window.process([{"k": Key(f"k{i}"), "v": i, "ts": 5} for i in range(20_000)], Emitter())
    Key.hashed = 0
    snapshot = window.snapshot()
    in_turn = Key.hashed
    _blob, views = pickle_snapshot(snapshot)
    assert in_turn == 0, f"the snapshot hashed {in_turn} keys in the PE's turn"
    assert len(views) == 1, "the panes were packed in the PE's turn, not set aside for the writer"
    view = views[0].view
    assert sum(view.full(g)[1] for g in view.groups()) == 20_000
    restored = restored_panes(snapshot)
    assert restored == {0: {f"k{i}": [1, i, i] for i in range(20_000)}}
    assert list(restored[0]) == [f"k{i}" for i in range(20_000)]


def test_a_rescales_export_visits_no_key_in_the_turn_and_its_part_is_read_when_pickled():
    """20,000 keys in a pane, a quarter of the key groups exported: the export hashes no key in
    the PE's turn (it took the moving entries in one pass over the pane's keys there: 0.4-0.5 s
    at 10^6 keys); the part's groups are read when it is pickled, and restore exactly those keys;
    the window that gave them fires the others only."""
    window = opened()
    window.process([{"k": Key(f"k{i}"), "v": i, "ts": 5} for i in range(20_000)], Emitter())
    window.snapshot()                   # a layer under the top, as after any checkpoint
    moving = frozenset(range(0, 128, 4))
    Key.hashed = 0
    part = window.export_groups(moving)
    in_turn = Key.hashed
    assert in_turn == 0, f"the export hashed {in_turn} keys in the PE's turn"
    fresh = Window(SIZE, SLIDE, dict(VALUES))
    fresh.restore(cloudpickle.loads(cloudpickle.dumps(part)))
    got = {k: s for d in fresh._panes.values() for k, s in d.items()}
    assert got == {f"k{i}": [1, i, i] for i in range(20_000) if key_group(f"k{i}") in moving}
    out = Emitter()
    window.on_watermark(MAX_WATERMARK, out)
    assert {r["k"] for r in out} == {f"k{i}" for i in range(20_000) if key_group(f"k{i}") not in moving}
    assert len(out) == 3 * len({r["k"] for r in out})            # one pane in three sliding windows


def written(snapshot: dict) -> None:
    """A checkpoint's writer's part: every group's file, then the view released."""
    for g in snapshot["groups"].view.groups():
        snapshot["groups"].view.full(g)
    snapshot["groups"].view.release()


def test_a_pane_keeps_one_layer_under_its_top_while_each_checkpoint_is_written_before_the_next():
    """Ten checkpoints in one pane's life, each written (packed) and released before the next:
    the pane keeps one layer under its top (the keys put since the last snapshot absorbed by it
    in the writer, not at the snapshot: absorbed there it stopped the stream 284-322 ms at 10^7
    keys), and fires exactly."""
    window = opened()
    out = Emitter()
    for c in range(10):
        window.process([{"k": f"k{i}", "v": 1, "ts": 1} for i in range(c, 100 + c)], out)
        snapshot = window.snapshot()
        assert len(window._layers.older[0]) == 1 + (c > 0), "the snapshot absorbed a layer in the PE's turn"
        written(snapshot)
        assert len(window._layers.older[0]) == 1
    live = []
    for c in range(10, 20):                     # each written only after the next began: a layer each
        window.process([{"k": f"k{i}", "v": 1, "ts": 1} for i in range(c, 100 + c)], out)
        live.append(window.snapshot())
    assert len(window._layers.older[0]) == 11
    written(live[0])                            # its writer leaves the layers others still read
    assert len(window._layers.older[0]) == 11
    for snapshot in live[1:-1]:
        snapshot["groups"].view.release()
    written(live[-1])                           # the last written once no other view lives
    assert len(window._layers.older[0]) <= 4
    window.on_watermark(MAX_WATERMARK, out)
    got = {r["k"]: r["n"] for r in out}
    assert got == {f"k{i}": min(i + 1, 20, 119 - i) for i in range(119)}


def test_the_writer_absorbs_no_layer_while_the_window_fires_from_them():
    """The writer absorbs the layers after it has packed them, but not while the PE iterates
    them to fire (a dict that grows under an iterator raises); the next checkpoint's writer
    does, and the output is the same."""
    window = opened()
    out = Emitter()
    window.process([{"k": f"k{i}", "v": 1, "ts": 1} for i in range(100)], out)
    first = window.snapshot()
    window.process([{"k": f"k{i}", "v": 1, "ts": 1} for i in range(10)], out)     # copied: a view lives
    second = window.snapshot()
    first["groups"].view.release()
    assert len(window._layers.older[0]) == 2
    firing = iter(window._layers.items(window._panes, 0))
    next(firing)
    written(second)
    assert len(window._layers.older[0]) == 2, "the writer changed the layers the PE was firing from"
    assert len(list(firing)) == 99
    written(window.snapshot())
    assert len(window._layers.older[0]) == 1
    window.on_watermark(MAX_WATERMARK, out)
    assert {r["k"]: r["n"] for r in out} == {f"k{i}": 1 + (i < 10) for i in range(100)}


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(steps=st.lists(st.sampled_from(["batch", "batch", "batch", "watermark", "snapshot", "write", "release",
                                       "export", "import"]), min_size=5, max_size=40),
       seed=st.integers(0, 10**6), collections=st.booleans())
def test_every_snapshot_restores_the_panes_it_was_taken_of_and_the_output_is_unchanged(steps, seed, collections):
    """Random batches (keys seen before and new ones), watermarks that fire and drop panes,
    snapshots, their views packed ("write") or let go later, in any order; an export takes
    key groups away (the checked window's; the reference, without snapshots, loses the same
    groups by ``take_namespaced``, the export before layers) and an import brings the last
    part back (pickled, to both). Every snapshot, packed whenever, restores to the panes as they
    were at it, and the window emits exactly what the reference does. With a set accumulator too (changed in
    place by its update: copied whole while a view lives)."""
    aggregates = COLLECTIONS if collections else VALUES
    rng = random.Random(seed)
    checked, reference = opened(aggregates), opened(aggregates)
    out, ref_out = Emitter(), Emitter()
    taken = []                                  # (snapshot, the panes at it)
    ts, wm, parts = 0, -1, ()
    for step in steps:
        if step == "batch":
            batch = []
            for _ in range(rng.randrange(1, 40)):
                ts += rng.randrange(0, 4)
                batch.append({"k": f"k{rng.randrange(30)}", "v": rng.randrange(5), "ts": max(ts - rng.randrange(8), wm + SIZE)})
            checked.process([dict(t) for t in batch], out)
            reference.process([dict(t) for t in batch], ref_out)
        elif step == "watermark" and ts - 10 > wm:
            wm = ts - 10
            checked.on_watermark(wm, out)
            reference.on_watermark(wm, ref_out)
        elif step == "snapshot":
            taken.append((checked.snapshot(), panes_now(checked)))
        elif step in ("write", "release") and taken:
            snapshot, panes = taken.pop(rng.randrange(len(taken)))
            if step == "write":                 # as the checkpoint's writer: each group's file
                view = snapshot["groups"].view
                for g in view.groups():
                    view.full(g)                # (the first lets the keys a rescale hid leave)
                assert restored_panes(snapshot) == panes
            else:
                snapshot["groups"].view.release()
        elif step == "export":
            groups = frozenset(rng.sample(range(128), 16))
            parts = (checked.export_groups(groups),
                     {"layout": reference.plan.layout, "size": SIZE, "slide": SLIDE, "watermark": reference._wm,
                      "fired_end": reference._fired_end,
                      "groups": take_namespaced(reference._panes, groups, reference._group_of)})
            parts = tuple(cloudpickle.loads(cloudpickle.dumps(part)) for part in parts)
        elif step == "import" and parts:
            checked.import_groups(parts[0])
            reference.import_groups(parts[1])
            parts = ()
    for snapshot, panes in taken:
        assert restored_panes(snapshot) == panes
    checked.on_watermark(MAX_WATERMARK, out)
    reference.on_watermark(MAX_WATERMARK, ref_out)
    assert not out.dead and not ref_out.dead and not (out.sides or {}).get("late")
    assert list(out) == list(ref_out)


def test_a_query_removed_while_a_checkpoint_is_written_leaves_the_checkpoint_its_slots():
    """Named queries: a checkpoint is taken, and before it is written a query is removed, which
    drops its slots from every slot list in place. The checkpoint still holds the slots as they
    were (the window's lists merged into new ones and copied: the view's are left alone); the
    window goes on with the query left, and both fire exactly."""
    window = Window(SIZE, SLIDE, queries={"a": {"n": ("count", "v")}, "b": {"s": ("sum", "v")}})
    window.open(OperatorContext("w", pe_id="pe1", key_field="k", extra={"state": "memory"}))
    window.process([{"k": f"k{i % 50}", "v": i, "ts": 5} for i in range(200)], Emitter())
    snapshot = window.snapshot()
    window.process([{"k": f"k{i % 70}", "v": 1, "ts": 7} for i in range(70)], Emitter())
    window.remove_query("b")
    packed = cloudpickle.loads(cloudpickle.dumps(snapshot))
    restored = Window(SIZE, SLIDE, queries={"a": {"n": ("count", "v")}, "b": {"s": ("sum", "v")}})
    restored.restore(packed)
    assert {k: s for d in restored._panes.values() for k, s in d.items()} == \
        {f"k{j}": [4, sum(range(j, 200, 50))] for j in range(50)}
    out = Emitter()
    window.on_watermark(MAX_WATERMARK, out)
    assert {(q, r["k"], r["n"]) for q, r in out if r["window_end"] == 60} == \
        {("a", f"k{j}", 5 if j < 50 else 1) for j in range(70)}


def test_the_keys_an_export_hid_leave_their_dicts_once_a_checkpoint_has_read_them():
    """After an export the giving window's layers hide the moving keys (still in the dicts). The
    next checkpoint's writer, once it has read them, pops them (none is popped while another
    reader may be iterating: a second checkpoint not written yet), and the snapshot after reads
    those layers as plain dicts again; the window fires the staying keys only."""
    window = opened()
    window.process([{"k": f"k{i}", "v": i, "ts": 5} for i in range(5_000)], Emitter())
    window.snapshot()["groups"].view.release()
    moving = frozenset(range(0, 128, 2))
    cloudpickle.dumps(window.export_groups(moving))          # the part read (its view released)
    staying = {f"k{i}" for i in range(5_000) if key_group(f"k{i}") not in moving}

    def held():
        return {k for layer in window._layers.older[0] for k in getattr(layer, "layer", layer)}

    assert held() == {f"k{i}" for i in range(5_000)}        # hidden, not gone
    first, second = window.snapshot(), window.snapshot()      # two views live
    for g in first["groups"].view.groups():
        first["groups"].view.full(g)
    assert held() == {f"k{i}" for i in range(5_000)}        # the second may be reading them
    first["groups"].view.release()
    for g in second["groups"].view.groups():
        second["groups"].view.full(g)
    assert held() == staying
    second["groups"].view.release()
    window.snapshot()
    assert all(type(layer) is dict for layer in window._layers.older[0])
    out = Emitter()
    window.on_watermark(MAX_WATERMARK, out)
    assert {r["k"] for r in out} == staying
