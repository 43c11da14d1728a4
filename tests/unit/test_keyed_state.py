"""The keyed-state backends (pescheduler/state/): one contract, checked on memory and on disk."""

from __future__ import annotations

import os

import dask.config
import pytest

from pescheduler.operator import OperatorContext
from pescheduler.state import KEY_GROUPS, key_group, keyed_state, open_state, pack_group


@pytest.fixture(params=["memory", "disk"])
def state(request, tmp_path):
    with dask.config.set({"pescheduler.state.dir": str(tmp_path), "pescheduler.state.cache": "8MB"}):
        st = open_state(request.param, owner="test")
    yield st
    st.close()


def _keys_by_group(n: int) -> dict[int, list]:
    by: dict[int, list] = {}
    for i in range(n):
        by.setdefault(key_group(f"k{i}"), []).append(f"k{i}")
    return by


def test_get_put_delete(state):
    assert state.get("a") is None and state.get("a", 0) == 0
    state.put("a", [1, 2])
    state.put(7, {"x": 1})
    state.put(("car", 3), 2.5)
    assert (state.get("a"), state.get(7), state.get(("car", 3))) == ([1, 2], {"x": 1}, 2.5)
    state.delete("a")
    state.delete("never")                       # absent: no error
    assert state.get("a") is None and len(state) == 2


def test_a_key_group_iterates_exactly_its_keys(state):
    for i in range(500):
        state.put(f"k{i}", i)
    by = _keys_by_group(500)
    assert state.groups() == sorted(by)
    for g, keys in by.items():
        assert dict(state.items(g)) == {k: int(k[1:]) for k in keys}


def test_a_snapshot_is_consistent_while_writes_go_on(state):
    for i in range(200):
        state.put(f"k{i}", i)
    view = state.snapshot()
    before = {g: dict(view.items(g)) for g in view.groups()}
    for i in range(0, 200, 2):
        state.put(f"k{i}", -i)
    state.delete("k1")
    state.put("new", 1)
    assert {g: dict(view.items(g)) for g in view.groups()} == before
    assert state.get("k2") == -2 and state.get("k1") is None
    view.release()


def test_changed_names_the_key_groups_written_since_the_snapshot(state):
    for i in range(300):
        state.put(f"k{i}", i)
    state.snapshot().release()
    assert state.changed() == set()
    state.put("k5", 0)
    state.delete("k6")
    assert state.changed() == {key_group("k5"), key_group("k6")}


def test_whole_key_groups_move_between_backends(state, tmp_path):
    for i in range(400):
        state.put(f"k{i}", [i])
    by = _keys_by_group(400)
    moving = sorted(by)[: len(by) // 2]
    exported = state.export_groups(moving)
    assert sorted(exported) == moving
    for other_backend in ("memory", "disk"):
        with dask.config.set({"pescheduler.state.dir": str(tmp_path)}):
            other = open_state(other_backend, owner="other")
        other.put(by[moving[0]][0], "stale")         # replaced by the import, not merged
        other.import_groups(exported)
        assert other.groups() == moving
        assert {k: v for g in moving for k, v in other.items(g)} == {k: [int(k[1:])] for g in moving for k in by[g]}
        other.close()
    state.drop_groups(moving)
    assert state.groups() == sorted(set(by) - set(moving))


def test_a_view_exports_what_it_saw(state):
    state.put("a", 1)
    view = state.snapshot()
    state.put("a", 2)
    other = open_state("memory")
    other.import_groups(view.export())
    assert other.get("a") == 1


def test_an_import_refuses_a_group_out_of_range_or_a_key_in_the_wrong_group(state):
    with pytest.raises(ValueError, match="outside 0..127"):
        state.import_groups({KEY_GROUPS: b""})
    g = key_group("a")
    from pescheduler.state import pack_group

    if state.backend == "disk":
        with pytest.raises(ValueError, match="not in key group|is in key group"):
            state.import_groups({(g + 1) % KEY_GROUPS: pack_group([("a", 1)])})


def test_an_unknown_backend_names_the_known_ones():
    with pytest.raises(ValueError, match="'rocks' is unknown; choose one of memory, disk"):
        open_state("rocks")
    with dask.config.set({"pescheduler.state.cache": "lots"}), pytest.raises(ValueError, match="256MB"):
        open_state("disk")


def test_an_operator_gets_its_deployments_backend_in_a_directory_of_its_own(tmp_path):
    with dask.config.set({"pescheduler.state.dir": str(tmp_path)}):
        ctx = OperatorContext(op_id="win", pe_id="pe1", extra={"state": "disk"})
        a, b = keyed_state(ctx), keyed_state(ctx)
        assert a.backend == "disk" and a.path != b.path and a.path.startswith(str(tmp_path))
        a.put("x", 1)
        assert b.get("x") is None
        a.close()
        assert not os.path.exists(a.path)
        b.close()
        assert keyed_state(OperatorContext(op_id="win")).backend == "memory"     # pescheduler.state.backend


def test_the_disk_backend_holds_more_than_its_cache(tmp_path):
    """4 MB of values through a 2 MB cache: everything reads back (the rest is in SST files)."""
    with dask.config.set({"pescheduler.state.dir": str(tmp_path), "pescheduler.state.cache": "2MB"}):
        st = open_state("disk")
    blob = os.urandom(1000)
    for i in range(4000):
        st.put(i, blob + i.to_bytes(4, "big"))
    assert all(st.get(i)[-4:] == i.to_bytes(4, "big") for i in range(0, 4000, 7))
    st.close()


def test_a_disk_store_outlives_nothing_but_its_owner(tmp_path):
    """Not closed, it stays usable (a finished PE may still be snapshotted); collected, it is gone."""
    import gc

    with dask.config.set({"pescheduler.state.dir": str(tmp_path)}):
        st = open_state("disk")
    st.put("a", 1)
    path = st.path
    view = st.snapshot()
    assert os.path.isdir(path) and dict(view.items(key_group("a"))) == {"a": 1}
    del st, view
    gc.collect()
    assert not os.path.exists(path)


def test_writable_holds_exactly_the_keys_put_since_the_snapshot_as_the_state_holds_them(state):
    """An operator changes a value of writable() in place with no put: that must be a value the state
    holds, in a group no view shares and already marked changed; anything else leaves it."""
    if state.writable() is None:                # disk: values are copies, every change is put back
        assert state.backend == "disk"
        return
    written = state.writable()
    state.put("a", [1])
    state.put("b", [2])
    state.put("c", [3])
    assert written == {"a": [1], "b": [2], "c": [3]} and written["a"] is state.get("a")
    view = state.snapshot()
    assert state.writable() == {}               # a view may share every group now
    assert written == {"a": [1], "b": [2], "c": [3]}    # (the view's changed keys: not the state's any more)
    written = state.writable()                  # asked for again after a snapshot, as operators do per batch
    state.put("a", [10])
    written["a"].append(11)                     # the operator's in-place change: in the state, not the view
    assert state.get("a") == [10, 11] and dict(view.items(key_group("a")))["a"] == [1]
    assert key_group("a") in state.changed()
    state.delete("a")
    assert "a" not in written
    state.put("b", [20])
    state.drop_groups([key_group("b")])
    assert "b" not in written
    state.put("c", [30])
    state.import_groups({key_group("c"): pack_group([("c", [31])])})
    assert "c" not in written and state.get("c") == [31]
    view.release()


def test_keys_python_holds_equal_share_a_key_group():
    """0 == 0.0 == False (and numpy's ints, and tuples of them) are one key to a dict, so to a
    keyed operator's state: a router must send them to one copy and the memory backend must file
    them in one group (an int key column joined with a float one lost its pairs: 0 and 0.0 were
    in groups 0 and 91)."""
    import numpy as np

    from pescheduler.state import MemoryState, key_group
    from pescheduler.state.groups import key_groups

    for same in ([0, 0.0, False, np.int64(0)], [7, 7.0, np.int32(7)], [(1, 2), (1, 2.0), (True, 2)]):
        assert len({key_group(k) for k in same}) == 1, same
        assert len(set(key_groups(same * 32))) == 1, same

    state = MemoryState()
    state.put(0.0, "a")
    state.groups()                      # folds the write into its group
    state.delete(0)                     # the same key, written as an int
    assert [dict(state.items(g)) for g in state.groups()] == [] and state.get(0.0) is None


def test_items_parted_by_their_keys_groups_keep_their_order_on_each_side():
    """``groups.parted`` (a rescale's ``export_groups`` of waiting tuples): each side as the two
    comprehensions computing ``key_group`` per item gave, for every kind of key, batched or not."""
    from pescheduler.state.groups import parted

    keys = [f"car-{i}" for i in range(300)] + list(range(300)) + [(i, "x") for i in range(50)] + [2.0, None]
    items = [(n, k) for n, k in enumerate(keys)]
    for groups in (frozenset(range(KEY_GROUPS)), frozenset(range(0, KEY_GROUPS, 3)), frozenset()):
        for some in (items, items[:10], items[300:], []):
            inside, outside = parted(some, [k for _n, k in some], groups)
            assert inside == [x for x in some if key_group(x[1]) in groups]
            assert outside == [x for x in some if key_group(x[1]) not in groups]


def test_a_large_group_is_packed_in_chunks_and_unpacks_whole(monkeypatch):
    """A checkpoint's writer packs groups in a thread beside the PE's: one pickle call holds the GIL
    throughout, so a large group (~78,000 entries at 10^7 keys) is packed PACK_CHUNK entries a call."""
    import pickle

    import pescheduler.state.base as base

    monkeypatch.setattr(base, "PACK_CHUNK", 100)
    entries = {f"k{i}": [i, {"n": i}] for i in range(1_050)}
    data = base.pack_group(entries.items())
    assert len(pickle.loads(data)) == 100                   # the first of 11 pickled dicts
    assert base.unpack_group(data) == entries
    small = base.pack_group([("a", 1)])
    assert pickle.loads(small) == {"a": 1} == base.unpack_group(small)      # one dict, as before
    assert base.unpack_group(base.pack_group([])) == {}


def test_a_checkpoint_pickles_a_large_group_at_most_1024_entries_a_call(state, monkeypatch):
    """What the checkpoint's writer does with a group it writes whole (``pack_chunks(view.chunks(g))``,
    state/incremental.py) pickles at most 1,024 entries a call: each call holds the GIL, and in a
    worker holding 10^7 keys a call for 8,192 entries took up to 33 ms beside the PE's thread."""
    import pickle

    from pescheduler.state.base import pack_chunks, unpack_group
    from pescheduler.state.groups import key_groups

    keys = list(range(400_000))
    one = [k for k, g in zip(keys, key_groups(keys)) if g == 5][:3_000]     # 3,000 keys of group 5
    state.write_many({k: {"v": k} for k in one})
    view = state.snapshot()
    sizes, dumps = [], pickle.dumps

    def counted(obj, *args, **kw):
        sizes.append(len(obj) if isinstance(obj, dict) else 0)
        return dumps(obj, *args, **kw)

    monkeypatch.setattr(pickle, "dumps", counted)
    try:
        data, count, first = pack_chunks(view.chunks(5))
    finally:
        view.release()
    assert count == 3_000 and unpack_group(data) == {k: {"v": k} for k in one}
    assert max(sizes) <= 1_024, f"one pickle call held {max(sizes)} entries"
