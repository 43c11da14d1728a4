"""The time window's state in the keyed-state backend (operators/window.py, window_store.py): on
``disk`` its panes live in the store, on both backends a rescale moves key groups
(``export_groups``/``import_groups``) and a checkpoint restores, and the output is exactly a
plain-Python computation of the windows."""

import pickle
import random

import cloudpickle
import dask
import pytest

from pescheduler.operator import MAX_WATERMARK, MIN_WATERMARK, Emitter, OperatorContext
from pescheduler.operators.window import Window
from pescheduler.wire import key_group

AGGS = {"n": ("count", "v"), "total": ("sum", "v"), "lo": ("min", "v"), "hi": ("max", "v")}
SIZE, SLIDE, DELAY = 60, 20, 15
rng = random.Random(30)
EVENTS = [{"k": f"k{rng.randrange(40)}", "v": rng.randrange(100), "ts": 2 * i + rng.randrange(DELAY)}
          for i in range(3000)]


def reference(events, size=SIZE, slide=SLIDE) -> list:
    """Every (key, window) by brute force: each tuple counts in every window covering its ts."""
    acc: dict = {}
    for t in events:
        last = t["ts"] - t["ts"] % slide                # the latest window starting at or before ts
        for ws in range(last - size + slide, last + 1, slide):
            acc.setdefault((t["k"], ws, ws + size), []).append(t["v"])
    return sorted((k, ws, we, len(vs), sum(vs), min(vs), max(vs)) for (k, ws, we), vs in acc.items())


def rows(out) -> list:
    return [(r["k"], r["window_start"], r["window_end"], r["n"], r["total"], r["lo"], r["hi"]) for r in out]


def opened(backend, window=None):
    """An opened window; ``disk-spill``: on disk with a write buffer of 16 (key, pane) entries, so
    its panes go through the store (the default buffer holds these tests' panes whole)."""
    window = window or Window(SIZE, SLIDE, AGGS)
    if backend == "disk-spill":
        backend, window.buffer_entries = "disk", 16
    window.open(OperatorContext("w", pe_id="pe1", key_field="k", extra={"state": backend}))
    return window


def drive(windows, batches, clock):
    """Feed each window (owns, window) its keys' tuples as a keyed router would, watermarks to all;
    ``clock`` = [watermark, max ts]."""
    out = Emitter()
    for batch in batches:
        for owns, window in windows:
            window.process([t for t in batch if owns(t["k"])], out)
        clock[1] = max([clock[1]] + [t["ts"] for t in batch])
        if clock[1] - DELAY - 1 > clock[0]:
            clock[0] = clock[1] - DELAY - 1
            for _owns, window in windows:
                window.on_watermark(clock[0], out)
    assert not (out.sides or {}).get("late") and not out.dead, "the driver's watermark lets nothing be late"
    return rows(out)


def by_wire(part):
    """What a hand-over or a checkpoint does to a state: pickled and unpickled (cloudpickle)."""
    return cloudpickle.loads(cloudpickle.dumps(part))


@pytest.fixture(params=["memory", "disk", "disk-spill"])
def backend(request, tmp_path):
    with dask.config.set({"pescheduler.state.dir": str(tmp_path)}):
        yield request.param


def test_a_window_is_exact_across_a_restore_a_replicate_and_a_release(backend):
    """Checkpoint at a third, restore into a new instance; a copy takes the odd key groups
    (export_groups into a new instance, as pescheduler/worker/handover.py builds it); later it
    gives them back to the running original (import_groups). Every row is the reference's."""
    batches = [EVENTS[b:b + 50] for b in range(0, len(EVENTS), 50)]
    everyone = lambda k: True                                   # noqa: E731
    odd = lambda k: key_group(k) % 2 == 1                       # noqa: E731
    even = lambda k: not odd(k)                                 # noqa: E731
    clock = [MIN_WATERMARK, MIN_WATERMARK]
    first = opened(backend)
    got = drive([(everyone, first)], batches[:20], clock)

    original = opened(backend)                                  # restored from a checkpoint
    original.restore(by_wire(first.snapshot()))
    got += drive([(everyone, original)], batches[20:30], clock)

    moving = frozenset(g for g in range(128) if g % 2 == 1)
    part = by_wire(original.export_groups(moving))              # Replicate: the copy gets the odd groups
    copy = Window(SIZE, SLIDE, AGGS)
    copy.restore(part)                                          # restore comes before open
    copy = opened(backend, copy)
    got += drive([(even, original), (odd, copy)], batches[30:45], clock)

    original.import_groups(by_wire(copy.export_groups(moving)))   # Release: the copy's groups come back
    got += drive([(everyone, original)], batches[45:], clock)
    tail = Emitter()
    original.on_watermark(MAX_WATERMARK, tail)
    copy.on_watermark(MAX_WATERMARK, tail)                       # holds nothing any more
    got += rows(tail)
    assert sorted(got) == reference(EVENTS)


def test_a_checkpoint_of_one_backend_restores_into_the_other(tmp_path):
    """A disk snapshot (the store's key groups) restores into a memory window and back."""
    batches = [EVENTS[b:b + 50] for b in range(0, len(EVENTS), 50)]
    with dask.config.set({"pescheduler.state.dir": str(tmp_path)}):
        clock = [MIN_WATERMARK, MIN_WATERMARK]
        disk = opened("disk-spill")
        got = drive([(lambda k: True, disk)], batches[:25], clock)
        saved = by_wire(disk.snapshot())
        assert saved["form"] == "keys"                          # the store's key groups, not dict panes
        memory = Window(SIZE, SLIDE, AGGS)
        memory.restore(saved)
        memory = opened("memory", memory)
        got += drive([(lambda k: True, memory)], batches[25:40], clock)
        back = opened("disk-spill")
        back.restore(by_wire(memory.snapshot()))
        got += drive([(lambda k: True, back)], batches[40:], clock)
        tail = Emitter()
        back.on_watermark(MAX_WATERMARK, tail)
    assert sorted(got + rows(tail)) == reference(EVENTS)


def test_on_disk_the_panes_are_in_the_store_not_in_memory(tmp_path):
    """20,000 keys in one pane: the window's dicts hold at most its write buffer, the store every
    key (each with its pane); the result is still exact."""
    events = [{"k": i, "v": i % 7, "ts": 1_000 + i % 50} for i in range(20_000)]
    with dask.config.set({"pescheduler.state.dir": str(tmp_path)}):
        window = Window(SIZE, SLIDE, AGGS)
        window.buffer_entries = 5000
        window = opened("disk", window)
        out = Emitter()
        for b in range(0, len(events), 500):
            window.process(events[b:b + 500], out)
        held_in_dicts = sum(len(d) for d in window._panes.values())
        assert held_in_dicts <= window.buffer_entries < len(events)
        snap = window.snapshot()
        stored = {k: v for g in snap["groups"] for k, v in pickle.loads(snap["groups"][g][1]).items()}
        assert len(stored) == len(events) and set(stored[7]) == {1000} and set(stored[37]) == {1020}
        window.on_watermark(MAX_WATERMARK, out)
    got = [(r["k"], r["window_start"], r["window_end"], r["n"], r["total"], r["lo"], r["hi"]) for r in out]
    want = reference([{**t, "k": t["k"]} for t in events])
    assert sorted(got) == want


def test_arrow_panes_move_by_key_groups_too(backend):
    """Arrow batches (the columnar window's panes on memory, rows into the store on disk): a copy
    takes the odd key groups mid-stream and gives them back; the rows are still the reference's."""
    import pyarrow as pa

    batches = [pa.RecordBatch.from_pylist(EVENTS[b:b + 100]) for b in range(0, len(EVENTS), 100)]
    clock = [MIN_WATERMARK, MIN_WATERMARK]
    odd = lambda k: key_group(k) % 2 == 1                       # noqa: E731
    moving = frozenset(g for g in range(128) if g % 2 == 1)
    original, out = opened(backend), Emitter()

    def push(pairs, batch):
        rows_of = batch.to_pylist()
        for owns, window in pairs:
            mine = [i for i, t in enumerate(rows_of) if owns(t["k"])]
            window.process(batch.take(pa.array(mine, pa.int64())), out)
        clock[1] = max([clock[1]] + [t["ts"] for t in rows_of])
        if clock[1] - DELAY - 1 > clock[0]:
            clock[0] = clock[1] - DELAY - 1
            for _owns, window in pairs:
                window.on_watermark(clock[0], out)

    for batch in batches[:10]:
        push([(lambda k: True, original)], batch)
    assert (original._cols is not None) == (backend == "memory")     # Arrow panes in memory, the store on disk
    copy = Window(SIZE, SLIDE, AGGS)
    copy.restore(by_wire(original.export_groups(moving)))
    copy = opened(backend, copy)
    for batch in batches[10:20]:
        push([(lambda k: not odd(k), original), (odd, copy)], batch)
    original.import_groups(by_wire(copy.export_groups(moving)))
    for batch in batches[20:]:
        push([(lambda k: True, original)], batch)
    original.on_watermark(MAX_WATERMARK, out)
    got = [r for b in (out.batches or []) for r in b.to_pylist()] + list(out)
    assert sorted(rows(got)) == reference(EVENTS)


def test_a_disk_windows_export_writes_nothing_its_buffer_moves_with_the_groups(tmp_path):
    """The export in the PE's turn takes the moving groups out of the store (a view) and their
    entries out of the write buffer; it reads and writes no key (before, it spilled the whole
    buffer first: up to ``buffer_entries`` keys read and written, 95-103 ms of a Replicate's
    pause at 10^5 keys, bench/rescale_ops.py). The buffered entries go with the part and join the
    receiver's buffer; the rows are the reference's."""
    batches = [EVENTS[b:b + 50] for b in range(0, len(EVENTS), 50)]
    moving = frozenset(g for g in range(128) if g % 2 == 1)
    odd = lambda k: key_group(k) % 2 == 1                       # noqa: E731
    with dask.config.set({"pescheduler.state.dir": str(tmp_path)}):
        clock = [MIN_WATERMARK, MIN_WATERMARK]
        window = Window(SIZE, SLIDE, AGGS)
        window.buffer_entries = 200                             # some panes stored, some buffered
        original = opened("disk", window)
        got = drive([(lambda k: True, original)], batches[:30], clock)
        buffered = {k for t in original._panes.values() for k in t}
        assert any(odd(k) for k in buffered) and any(not odd(k) for k in buffered)
        store, calls = original._store, []
        for name in ("write_many", "get_many", "put", "get"):
            real = getattr(store, name)
            setattr(store, name, lambda *a, _n=name, _r=real: calls.append(_n) or _r(*a))
        part = original.export_groups(moving)
        assert calls == [], calls
        assert {k for t in original._panes.values() for k in t} == {k for k in buffered if not odd(k)}
        copy = opened("disk")
        copy.restore(by_wire(part))
        assert {k for t in copy._panes.values() for k in t} == {k for k in buffered if odd(k)}
        got += drive([(lambda k: not odd(k), original), (odd, copy)], batches[30:], clock)
        tail = Emitter()
        original.on_watermark(MAX_WATERMARK, tail)
        copy.on_watermark(MAX_WATERMARK, tail)
    assert sorted(got + rows(tail)) == reference(EVENTS)
