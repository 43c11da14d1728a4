"""The ``disk`` backend (pescheduler/state/disk.py) against a dict: keys Python holds equal are one
key, through its write-back buffer, its store and its views; a checkpoint its first encoding wrote
restores."""

from __future__ import annotations

import base64
import shutil
import tempfile

import dask.config
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from keyed_stores import written_delta

import pescheduler.state.disk as disk
from pescheduler.state import open_state
from pescheduler.state.files import StateFiles
from pescheduler.state.incremental import GroupRef, read_group
from pescheduler.wire import key_group

# few values, so that equal keys of different types meet often
_atoms = st.one_of(
    st.integers(-3, 3),
    st.sampled_from([0.0, -0.0, 1.0, -1.0, 2.0, 2.5, -0.5, 1e20, float("inf")]),
    st.booleans(),
    st.builds(lambda t, v: t(v), st.sampled_from([np.int8, np.int32, np.int64, np.uint16]), st.integers(0, 3)),
    st.text(alphabet="ab0é", max_size=3),
    st.integers(2**62, 2**62 + 2) | st.integers(-(2**70), -(2**70) + 2),
)
KEYS = st.one_of(_atoms, st.tuples(_atoms, _atoms), st.tuples(st.tuples(_atoms), _atoms))
VALUES = st.one_of(st.integers(), st.text(max_size=4), st.lists(st.integers(), max_size=3))

OPS = st.lists(st.one_of(
    st.tuples(st.just("put"), KEYS, VALUES),
    st.tuples(st.just("get"), KEYS),
    st.tuples(st.just("delete"), KEYS),
    st.tuples(st.just("write_many"), st.lists(st.tuples(KEYS, VALUES), max_size=4), st.lists(KEYS, max_size=2)),
    st.tuples(st.just("get_many"), st.lists(KEYS, max_size=4)),
    st.tuples(st.just("read and write"), st.lists(st.tuples(KEYS, VALUES), max_size=4)),   # an operator's batch
    st.tuples(st.just("snapshot")),
    st.tuples(st.just("entries")),
    st.tuples(st.just("drop"), KEYS),
    st.tuples(st.just("take"), KEYS, st.integers(0, 7)),     # the groups of a key, and of the i-th last written
    st.tuples(st.just("read views")),
), max_size=40)


def _read(view) -> dict:
    """The view's keys and values, group by group; its deltas (the keys written before its
    snapshot, as a checkpoint writes them) agree with them."""
    whole = {k: v for g in view.groups() for k, v in view.items(g)}
    for g, keys in view.by_group(view.changes.keys).items():
        puts, deletes = written_delta(view, g, keys)
        assert all(whole[k] == v for k, v in puts.items()) and not any(k in whole for k in deletes)
    return whole


def _disk(root: str):
    with dask.config.set({"pescheduler.state.dir": root, "pescheduler.state.cache": "8MB"}):
        return open_state("disk", owner="model")


@settings(max_examples=100, deadline=None)
@given(ops=OPS, flush_keys=st.sampled_from([1, 3, 4096]))
def test_the_disk_backend_is_a_dict_under_any_interleaving(ops, flush_keys):
    """Every read agrees with a dict's; equal keys (0, 0.0, False, numpy's 0, tuples of them) are
    one key. ``flush_keys``: writes reach the store at once, every few, or only at a scan. A view
    reads the state as it was at its snapshot, however much was written, flushed or dropped whole
    since (read while it still reads the live store, and after a drop pinned it). A take's groups
    (a rescale's, read when packed) hold their keys as they were at the take, read at any later
    point, and leave the state."""
    root = tempfile.mkdtemp()
    saved, disk.FLUSH_KEYS = disk.FLUSH_KEYS, flush_keys
    state, model, views, takes = _disk(root), {}, [], []
    try:
        for op, *args in ops:
            if op == "put":
                state.put(*args)
                model[args[0]] = args[1]
            elif op == "get":
                assert state.get(args[0], "absent") == model.get(args[0], "absent"), args[0]
            elif op == "delete":
                state.delete(args[0])
                model.pop(args[0], None)
            elif op == "write_many":
                puts, deletes = args
                state.write_many(puts, deletes)
                model.update(puts)
                for key in deletes:
                    model.pop(key, None)
            elif op == "get_many":
                assert state.get_many(args[0]) == [model.get(k) for k in args[0]], args[0]
            elif op == "read and write":        # write_many takes the read's encodings when its keys are the read's
                read = list(dict(args[0]))
                assert state.get_many(read) == [model.get(k) for k in read], read
                state.write_many(args[0])
                model.update(args[0])
            elif op == "snapshot":
                views.append((state.snapshot(), dict(model)))
            elif op == "drop":
                g = key_group(args[0])
                state.drop_groups([g])
                model = {k: v for k, v in model.items() if key_group(k) != g}
            elif op == "take":
                written = [k for k in model]
                groups = {key_group(args[0])} | ({key_group(written[-1 - args[1] % len(written)])} if written else set())
                taken = state.take_groups(groups)
                then = {k: v for k, v in model.items() if key_group(k) in groups}
                assert set(taken) == {key_group(k) for k in then}
                takes.append((taken, then))
                model = {k: v for k, v in model.items() if key_group(k) not in groups}
            elif op == "read views":
                for view, then in views:
                    assert _read(view) == then
                for taken, then in takes:
                    assert {k: v for g in taken.values() for k, v in g.items()} == then
            else:
                assert dict(state.entries()) == model and len(state) == len(model)
        assert dict(state.entries()) == model and len(state) == len(model)
        for view, then in views:                # each view reads the state as it was
            assert _read(view) == then
            view.release()
        for taken, then in takes:
            assert {k: v for g in taken.values() for k, v in g.items()} == then
    finally:
        disk.FLUSH_KEYS = saved
        state.close()
        shutil.rmtree(root, ignore_errors=True)


def test_equal_keys_are_one_key_on_disk(tmp_path):
    state = _disk(str(tmp_path))
    state.put(0, "int")
    state.put(0.0, "float")
    state.put(False, "bool")
    state.put(np.int64(0), "numpy")
    state.put((1, "a"), "tuple")
    state.put((True, "a"), "tuple of an equal")
    view = state.snapshot()
    state.delete(-0.0)
    assert state.get(0) is None and state.get((1.0, "a")) == "tuple of an equal"
    assert len(state) == 1
    assert [(k, v) for g in view.groups() for k, v in view.items(g) if k == 0] == [(0, "numpy")]
    view.release()
    state.close()


def test_equal_tuples_of_shared_and_unshared_strings_are_one_key_on_disk(tmp_path):
    """Pickle's memo wrote ``(s, s)`` with a back-reference and ``(s, a copy of s)`` without: two
    encodings (and key groups) of one key."""
    state, s = _disk(str(tmp_path)), "car-0000042"
    copy = (s + ".")[:-1]
    state.put((s, s), "shared")
    state.write_many([((s, copy), "unshared"), (((s, 1), (s, 1.0)), "nested")])   # encoded anew, not
    state.write_many([(((copy, True), (s, 1)), "nested again"), (np.str_(s), "numpy str")])  # remembered
    assert len(state) == 3
    assert state.get_many([(copy, s), ((s, 1), (copy, 1)), s]) == ["unshared", "nested again", "numpy str"]
    state.close()


# A checkpoint of a PE written by main's disk.py before this encoding (a key was its pickle): one
# full file per key group, then a delta of groups 0 and 93. That store held 1.0 and True as two
# keys (the full file of group 44 took one of them) and False apart from 0.
#   put 0 "int 0", 1.0 "float 1", True "True", np.int64(7) "np 7", (2, 3.0) "tuple",
#   "car-7" "str", 2.5 "float 2.5"; snapshot; put 7 "np 7 changed by int", delete 0,
#   put False "False after 0 went"; snapshot
_OLD_FULL = {
    0: "gAWVDgAAAAAAAAB9lEsAjAVpbnQgMJRzLg==",
    31: "gAWVGQAAAAAAAAB9lEsCR0AIAAAAAAAAhpSMBXR1cGxllHMu",
    36: "gAWVGQAAAAAAAAB9lEdABAAAAAAAAIwJZmxvYXQgMi41lHMu",
    44: "gAWVDwAAAAAAAAB9lIiMB2Zsb2F0IDGUcy4=",
    93: "gAWVdAAAAAAAAAB9lIwWbnVtcHkuX2NvcmUubXVsdGlhcnJheZSMBnNjYWxhcpSTlIwFbnVtcHmUjAVkdHlwZZSTlIwCaTiUiYiHlFKU"
        "KEsDjAE8lE5OTkr/////Sv////9LAHSUYkMIBwAAAAAAAACUhpRSlIwEbnAgN5RzLg==",
    98: "gAWVEgAAAAAAAAB9lIwFY2FyLTeUjANzdHKUcy4=",
}
_OLD_DELTA = {
    0: "gAWVIQAAAAAAAAB9lImMEkZhbHNlIGFmdGVyIDAgd2VudJRzXZRLAGGGlC4=",
    93: "gAWVIAAAAAAAAAB9lEsHjBNucCA3IGNoYW5nZWQgYnkgaW50lHNdlIaULg==",
}


def test_a_checkpoint_of_the_first_encoding_restores_and_equal_keys_find_its_keys(tmp_path):
    files = StateFiles(str(tmp_path / "storage"))
    restored = {}
    for g, full in _OLD_FULL.items():
        chain = [files.put(1, f"pe.0.g{g:03d}.full", base64.b64decode(full))]
        if g in _OLD_DELTA:
            chain.append(files.put(2, f"pe.0.g{g:03d}.delta", base64.b64decode(_OLD_DELTA[g])))
        data, _here = read_group(files, GroupRef("", "pe.0", g, (), tuple(chain)))
        restored[g] = data
    state = _disk(str(tmp_path / "stores"))
    state.import_groups(restored)
    for keys, value in [((0, 0.0, False, np.int32(0)), "False after 0 went"),
                        ((1, 1.0, True, np.uint8(1)), "float 1"),
                        ((7, 7.0, np.int64(7)), "np 7 changed by int"),
                        (((2, 3), (2.0, 3.0), (np.int16(2), 3)), "tuple"),
                        (("car-7",), "str"), ((2.5,), "float 2.5")]:
        assert [state.get(k) for k in keys] == [value] * len(keys), keys
    assert len(state) == 6
    state.close()


@pytest.mark.parametrize("key", [0, -5, 2**80, "car-7", "", "é", 2.5, None, (1, "a"), ((1,), 2.5), b"raw"])
def test_a_key_of_the_first_encoding_still_reads(key):
    """A store key written as the group byte and the key's pickle decodes to the key."""
    import pickle

    raw = disk._prefix(disk.key_group(key)) + pickle.dumps(key, pickle.HIGHEST_PROTOCOL)
    assert disk._decode(raw) == key and disk._decode(disk._encode(key)) == key


def test_a_view_read_in_another_thread_while_the_state_is_written_and_dropped_reads_it_as_it_was(tmp_path):
    """The view of a barrier is read by the worker's writer thread while the PE writes on: in
    the live store corrected by the keys written since, then (after a drop) a checkpoint."""
    import threading

    state, keys = _disk(str(tmp_path)), list(range(3000))
    state.write_many((k, ("before", k)) for k in keys)
    state.groups()                                  # into the store (a scan flushes the buffer)
    for k in keys[::3]:
        state.put(k, ("at the snapshot", k))         # in the write-back buffer at the snapshot
    then = {k: ("at the snapshot" if k % 3 == 0 else "before", k) for k in keys}
    view, reads, rng = state.snapshot(), [], np.random.default_rng(5)
    reader = threading.Thread(target=lambda: reads.extend(_read(view) for _ in range(4)))
    reader.start()
    for i in range(10_000):
        if not reader.is_alive():
            break
        for k in rng.choice(3000, 50):
            state.put(int(k), ("after", i))
        state.delete(int(rng.integers(3000)))
        if i % 20 == 0:
            state.snapshot().release()
        if i == 5:
            state.drop_groups([key_group(0), key_group(1)])
    reader.join(timeout=120)
    assert not reader.is_alive() and len(reads) == 4
    assert all(read == then for read in reads)
    view.release()
    state.close()


def test_two_reads_of_a_view_at_once_across_a_drop_read_it_as_it_was(tmp_path):
    """A read while another holds the view's iterator makes its own: after a drop, of the
    checkpoint the drop pinned the view to."""
    state = _disk(str(tmp_path))
    state.write_many((k, "then") for k in range(1000))
    state.groups()                                  # into the store (a scan flushes the buffer)
    view = state.snapshot()
    state.write_many((k, "after") for k in range(0, 1000, 2))
    g0, g1 = key_group(0), key_group(1)
    first = view.items(g0)
    assert next(first)[1] == "then"             # holds the view's iterator
    state.drop_groups([g1])
    assert dict(view.items(g1)) == {k: "then" for k in range(1000) if key_group(k) == g1}
    assert {v for _k, v in first} <= {"then"}
    assert _read(view) == {k: "then" for k in range(1000)}
    view.release()
    state.close()


def test_a_view_first_read_after_later_snapshots_reads_it_as_it_was(tmp_path, monkeypatch):
    """Keys written between a view's snapshot and a later one are read at the view's snapshot
    (the state's journal), not in the live store, which has them as they are now."""
    monkeypatch.setattr(disk, "FLUSH_KEYS", 1)              # every write reaches the store at once
    state = _disk(str(tmp_path))
    state.write_many((k, "then") for k in range(100))
    view = state.snapshot()
    state.write_many(((k, "after") for k in range(0, 100, 3)), range(1, 100, 3))
    later = state.snapshot()
    state.write_many((k, "later still") for k in range(0, 100, 5))
    assert _read(view) == {k: "then" for k in range(100)}
    assert _read(later) == {k: "after" if k % 3 == 0 else "then" for k in range(100) if k % 3 != 1}
    view.release()
    later.release()
    state.close()


WRITTEN_OPS = st.lists(st.one_of(
    st.tuples(st.just("add"), st.lists(st.integers(0, 20), max_size=9), st.booleans()),   # a batch; values kept?
    st.tuples(st.just("put"), st.integers(0, 20), st.sampled_from([b"p", None])),
    st.tuples(st.just("read")),
), max_size=40)


@settings(max_examples=200, deadline=None)
@given(ops=WRITTEN_OPS)
def test_the_keys_written_since_a_snapshot_read_as_the_dict_of_their_last_writes(ops):
    """``disk.Written``: batches appended and keys put one at a time, in any order, read (at any
    point, in stretches of a few keys: a batch split across them, a dict of keys put one at a
    time read again while it is the last part) as the dict of each key's last value, and its
    ``most`` never under the keys it holds."""
    saved, (disk.MERGE_KEYS, disk.PUT_PART) = (disk.MERGE_KEYS, disk.PUT_PART), (3, 2)
    try:
        written, model = disk.Written(), {}
        for step, (op, *args) in enumerate(ops):
            if op == "add":
                keys = tuple(b"k%d" % k for k in args[0])
                values = tuple(b"v%d" % step for _ in keys) if args[1] else None
                written.add(keys, values)
                model.update(dict.fromkeys(keys, b"v%d" % step if args[1] else disk._MISSING))
            elif op == "put":
                written.put(b"k%d" % args[0], args[1])
                model[b"k%d" % args[0]] = args[1]
            else:
                assert written.merged() == model
        assert written.merged() == model and written.most >= len(written) == len(model)
    finally:
        disk.MERGE_KEYS, disk.PUT_PART = saved


def test_the_keys_written_since_a_snapshot_are_let_go_a_slice_at_a_time_merged_or_not(monkeypatch):
    """``disk.Written.let_go`` (a checkpoint done with an interval's keys, a state that stops
    naming them): the batches never merged (a checkpoint that wrote every group whole read
    none) go ``MERGE_KEYS`` keys at a time too, not in one C call (10^6 of them held the GIL
    54 ms), and nothing of them is left."""
    ways = []
    monkeypatch.setattr(disk, "give_way", lambda: ways.append(1))
    written = disk.Written()
    for b in range(40):
        written.add(tuple(b"k%d.%d" % (b, i) for i in range(500)), tuple(b"v" for _ in range(500)))
    written.put(b"one", b"v")
    written.let_go()
    assert len(ways) >= 40 * 500 // disk.MERGE_KEYS, f"{len(ways)} slices for {40 * 500} keys"
    assert written.merged() == {} and written._parts == []
