"""The disk backend's hot path (issue 30: throughput >= 0.5x memory, stall at a checkpoint <= 20
ms), guarded by counts, not times: the Python calls a batch's write makes per key, and the keys
a full collection of the cyclic GC visits because the state holds them."""

from __future__ import annotations

import gc
import sys

import dask.config

from pescheduler.state import disk, open_state

ROW = {"v": 1, "note": "x" * 20}


def _disk(root: str, owner: str):
    with dask.config.set({"pescheduler.state.dir": root, "pescheduler.state.cache": "64MB"}):
        return open_state("disk", owner=owner)


def test_a_batchs_write_makes_at_most_two_calls_per_key(tmp_path) -> None:
    """``write_many`` (a keyed operator's write of its batch, after reading its keys) encodes and
    pickles each key in one comprehension and updates the write-back buffer and the keys written
    since the snapshot in C: a call to look the key's encoding up and one to pickle its value, not
    a set add per key besides (latest's fill of 10^6 keys in process: 193k -> 266k keys/s)."""
    state = _disk(str(tmp_path), "calls")
    keys = list(range(1000))
    try:
        state.get_many(keys)                    # the operator's read: the keys' encodings are known
        calls = [0]

        def count(frame, event, arg) -> None:
            if event == "c_call":
                calls[0] += 1

        sys.setprofile(count)
        try:
            state.write_many([(k, ROW) for k in keys])
        finally:
            sys.setprofile(None)
        assert calls[0] <= 2 * len(keys) + 20, f"{calls[0]} calls into C for a write of {len(keys)} keys"
        assert state.get_many([0, 999, 1000]) == [ROW, ROW, None]
    finally:
        state.close()


def _visited() -> int:
    """What a full collection visits: the references of every object the cyclic GC tracks."""
    gc.collect()
    return sum(len(gc.get_referents(o)) for o in gc.get_objects())


def test_a_full_collection_visits_none_of_the_keys_written_since_a_snapshot(tmp_path) -> None:
    """The keys written since a snapshot, and a live view's :class:`Changes` of the keys before it,
    are held where the cyclic GC does not look (a dict of bytes is untracked; a set is tracked and
    a full collection visits every key in it, holding the GIL: 300 ms for 10^6 keys, loaded, and
    the PE's stall at 10^7 keys was 2.3 s). Counted, not timed: the references visited grow by far
    less than the keys written."""
    state = _disk(str(tmp_path), "gc")
    n = 20_000
    try:
        before = _visited()
        state.write_many([(k, ROW) for k in range(n)])
        view = state.snapshot()                 # a checkpoint not yet written: its Changes live on
        for k in range(n, 2 * n):
            state.put(k, ROW)
        grown = _visited() - before
        assert grown < n // 10, f"a full collection visits {grown:,} more references with {2 * n:,} keys written"
        assert len(view.changes.keys) == n and len(set().union(*state._written_after(view.changes.seq))) == n
        view.release()
    finally:
        state.close()


def test_reading_a_views_group_makes_no_python_call_per_key_but_its_own_step(tmp_path) -> None:
    """A checkpoint's full file reads every key of a group through the view (in the writer's
    thread, sharing the GIL with the PE): one loop over the store's iterator, an int key decoded
    inline, not three generators and a decoding call per key (in process, 200,000 keys: 1.08 ->
    0.96 us a key). Keys written since the snapshot are still read at it."""
    from pescheduler.wire import key_group

    state = _disk(str(tmp_path), "view")
    try:
        state.write_many([(k, {"v": k}) for k in range(20_000)])
        state.groups()                          # the write-back buffer into the store
        view = state.snapshot()
        group = key_group(0)
        others = [k for k in range(0, 20_000, 3) if key_group(k) != group]
        state.write_many([(k, {"v": -k}) for k in others], deletes=[k + 1 for k in others if key_group(k + 1) != group])
        state.groups()
        calls = [0]

        def count(frame, event, arg) -> None:
            if event == "call":                 # a Python function called or a generator resumed
                calls[0] += 1

        sys.setprofile(count)
        try:
            read = dict(view.items(group))
        finally:
            sys.setprofile(None)
        assert read == {k: {"v": k} for k in range(20_000) if key_group(k) == group}
        slices = -(-2 * len(others) // disk.MERGE_KEYS)     # the keys written since, sorted by group a slice at a time
        assert calls[0] <= 1.2 * len(read) + 20 + 16 * slices, f"{calls[0]} Python calls to read {len(read)} keys of a view's group"
        later = view.groups()                   # keys written since the snapshot: read at it
        assert all(dict(view.items(g)) == {k: {"v": k} for k in range(20_000) if key_group(k) == g} for g in later[:8])
        view.release()
    finally:
        state.close()


class _CountingStore:
    """A store's binding, counting the keys its ``get`` is asked for (and passing every call on)."""

    def __init__(self, db) -> None:
        self.db, self.asked = db, 0

    def get(self, key, *args, **kwargs):
        self.asked += len(key) if isinstance(key, list) else 1
        return self.db.get(key, *args, **kwargs)

    def __getattr__(self, name):
        return getattr(self.db, name)


def test_a_new_key_reads_the_store_about_once_in_10000_gets(tmp_path) -> None:
    """A get of a key the store never had is answered by the "may be stored" filter, without a
    call into RocksDB, which lets the GIL go and waits for it beside a checkpoint's writer (a
    fill's every key is new). With one bit per key, a new key read the store with a chance of the
    share of bits set: 0.3 % at 10^5 keys in the 4 MB of a 64 MB cache; two bits a key in one
    block: under 0.01 %. Counted through ``get_many`` and ``get``, both paths of the filter."""
    state = _disk(str(tmp_path), "filter")
    try:
        held = list(range(100_000))
        for start in range(0, len(held), 1000):
            state.write_many([(k, ROW) for k in held[start:start + 1000]])
        state.groups()                              # the write-back buffer into the store
        counting = state._db = _CountingStore(state._db)
        new = list(range(10**7, 10**7 + 100_000))
        for start in range(0, len(new), 1000):
            assert state.get_many(new[start:start + 1000]) == [None] * 1000
        assert all(state.get(k) is None for k in new[:20_000])
        assert counting.asked <= 40, f"{counting.asked} of 120,000 gets of new keys read the store"
        assert state.get_many(held[:1000:7]) == [ROW] * len(held[:1000:7])     # no key held is missed
        assert all(state.get(k) == ROW for k in held[-1000::13])
    finally:
        state.close()


def test_the_filters_bits_are_one_set_in_numpy_in_python_and_from_a_prepared_group(tmp_path) -> None:
    """The three ways a key's bits are set (a flush's batch in numpy, a few keys in Python, a
    restored group's offsets computed in its loader's thread) set the same bits, and a key that
    was added tests present through both reads."""
    from pescheduler.state.disk import MayBeStored, _encode, prepare_group

    keys = [_encode(k) for k in range(5000)]
    in_numpy, in_python, prepared = (MayBeStored(64 << 20) for _ in range(3))
    in_numpy.add(keys)
    in_python.add_hashes(map(hash, keys))
    group = prepare_group(7, {k: ROW for k in range(100_000) if _encode(k)[0] == 7}, str(tmp_path), 64 << 20)
    assert group.marks is not None
    prepared.add_marks(group.marks, group.hashes)
    assert bytes(in_numpy.bits) == bytes(in_python.bits)
    assert all(k in in_numpy for k in keys) and in_numpy.among(keys, None) == list(range(len(keys)))
    again = MayBeStored(64 << 20)
    again.add_hashes(group.hashes)
    assert bytes(prepared.bits) == bytes(again.bits)
    group.discard()


def test_a_flushs_bits_are_all_set_where_many_share_a_byte() -> None:
    """:meth:`MayBeStored.add` sets bits by a scatter in numpy, where two bits of one batch in the
    same byte leave only the last one's: it looks for the bits missing and sets them again. In the
    smallest map (64 KiB) a batch of 50,000 keys has thousands of bytes holding two of its bits;
    every bit is set, as one key at a time in Python sets them."""
    from pescheduler.state.disk import MayBeStored, _encode

    keys = [_encode(k) for k in range(50_000)]
    in_numpy, in_python = MayBeStored(1 << 20), MayBeStored(1 << 20)
    assert len(in_numpy.bits) == 1 << 16
    in_numpy.add(keys)
    in_python.add_hashes(map(hash, keys))
    assert bytes(in_numpy.bits) == bytes(in_python.bits)
    assert in_numpy.among(keys, None) == list(range(len(keys)))


def test_a_batch_read_then_written_is_hashed_once_and_every_key_written_reads_back(tmp_path, monkeypatch) -> None:
    """An operator's batch is read (``get_many``) and then written (``write_many``) with the same
    keys: the write takes the read's encodings and "may be stored" bits (``MayBeStored.places``
    once, not at the read and again at the flush: 0.1 us of a fill's 2.9 us a key on disk, in
    process). The bits are set at the write, or at the flush for keys put one at a time; either
    way every key written reads back once the buffer is in the store, also when the caller
    changed its list of keys between the two calls, or wrote other keys than it read."""
    from pescheduler.state import disk

    state = _disk(str(tmp_path), "handoff")
    places, asked = disk.MayBeStored.places, [0]

    def counted(np, hashes, mask):
        asked[0] += 1
        return places(np, hashes, mask)

    monkeypatch.setattr(disk.MayBeStored, "places", staticmethod(counted))
    try:
        keys = list(range(2000))                    # past FLUSH_KEYS: the write flushes
        assert state.get_many(keys) == [None] * 2000
        state.write_many({k: ROW for k in keys})
        assert asked[0] == 1, f"the keys' places in the filter made {asked[0]} times for one read and write"
        changed = list(range(2000, 2100))           # the caller's list changed after the read
        state.get_many(changed)
        changed[:] = range(3000, 3100)
        state.write_many({k: ROW for k in changed})
        state.get_many(list(range(4000, 4100)))     # other keys read than written
        state.write_many({k: ROW for k in range(5000, 5100)})
        for k in range(6000, 6100):                 # one at a time: marked at the flush
            state.put(k, ROW)
        state.groups()                              # the write-back buffer into the store
        assert state._pending == {}
        written = [*range(2000), *range(3000, 3100), *range(5000, 5100), *range(6000, 6100)]
        assert state.get_many(written) == [ROW] * len(written)
        assert [state.get(k) for k in (0, 3050, 5099, 6000)] == [ROW] * 4
        assert state.get_many([2050, 4050]) == [None, None]
    finally:
        state.close()
