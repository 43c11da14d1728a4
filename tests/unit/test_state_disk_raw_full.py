"""A disk store's checkpoint writes a key group whole as the store's own bytes (``SnapshotView.full``):
the writer decodes and unpickles nothing, the file is compressed, a lazy restore into a disk store
writes the bytes into its SST file as they are, and every other reader gets the group's dict.
Deltas of a chain are compressed as its full file is, and files of the earlier forms still read."""

from __future__ import annotations

import functools
import threading
import pickle
import zlib

import dask.config
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from keyed_stores import StepCountingStore, disk_stores, filled_mixed  # noqa: F401  (a fixture)
from test_incremental_checkpoint import checkpoint, restored, written

from pescheduler.checkpoint import CheckpointStore
from pescheduler.state import disk, memory, open_state
from pescheduler.state.base import pack_group, unpack_group
from pescheduler.state.groups import snapshot_groups
from pescheduler.state.incremental import (load_snapshot, load_state_file, pack_delta, pickle_snapshot, read_group,
                                           resolve_part, unpack_delta, with_entries)
from pescheduler.state.files import StateFiles
from pescheduler.wire import KEY_GROUPS, key_group
from pescheduler.worker.ckpt_files import CheckpointFiles

KEY = b"k" * 32
KEYS = 30_000           # ~234 keys a group: every full file a file of its own (past PACK_DELTA)


@pytest.fixture
def stores(disk_stores, monkeypatch):
    monkeypatch.setattr(disk, "INGEST_KEYS", 128)      # the restored groups go as SST files
    return disk_stores


def _filled(state) -> dict:
    return filled_mixed(state, KEYS)


def _written(state, store: CheckpointStore) -> tuple[dict, dict]:
    """The state's first checkpoint (every group whole), as the barrier and the worker take it:
    ``({group: (key, GroupRef)} as a restore reads them, the files written)``."""
    files = CheckpointFiles()
    blob, views = pickle_snapshot({"op": {"state": {"groups": snapshot_groups(state)}}})
    files.hold("d", 1, "pe", {"state": blob, "views": views, "positions": {}})
    out = files.write("d", 1, ["pe"], store.url)["pe"]
    store.commit_manifest(1, {"id": 1, "files": out["files"]})
    files.end("d", 1, complete=True)
    manifest = store.manifest(1)
    entry = next(e for e in manifest["files"] if e["role"] == "state")
    saved = load_state_file(store.read(entry, store.run))
    groups = with_entries(saved["groups"], manifest["files"], lambda e: store.read(e, store.run))
    return load_snapshot(saved["ops"], groups)["op"]["state"]["groups"], out


def _no_codec(monkeypatch) -> None:
    """Every decode and encode of a key, and the chunks' read (which unpickles), made to fail."""
    def refused(*_a, **_k):
        pytest.fail("a disk view's checkpoint writer decodes or encodes no key")
    for name in ("_encode", "_decode_all"):
        monkeypatch.setattr(disk, name, refused)
    monkeypatch.setattr(disk.SnapshotView, "chunks", refused)


def _first_key(raw: bytes):
    """``disk._decode`` written out here, for the one key a full file names (its first) while the
    module's own decoders are refused."""
    return pickle.loads(raw[2:]) if raw[1] == disk._PICKLED else int(raw[2:]) if raw[1] == disk._INT \
        else raw[2:].decode()


def test_a_full_file_is_the_stores_bytes_and_a_lazy_restore_installs_them_as_they_are(stores, tmp_path, monkeypatch):
    src, dst = stores("src"), stores("dst")
    model = _filled(src)
    store = CheckpointStore(str(tmp_path / "ckpt"), KEY)
    with monkeypatch.context() as m:
        _no_codec(m)
        m.setattr(disk, "_decode", _first_key)          # the first key of each file only
        refs, out = _written(src, store)
        fulls = [f for f in out["files"] if f["path"].endswith(".full")]
        assert len(fulls) == len(refs) == len({key_group(k) for k in model})
        prepare = functools.partial(disk.prepare_group, where=str(tmp_path / "prepared"), cache_bytes=64 << 20)
        parts = resolve_part({"groups": refs}, store.storage, prepare=prepare)["groups"]
    prepared = {g: part for g, (_key, part) in parts.items()}
    assert all(type(p) is disk.PreparedGroup and p.sst is not None for p in prepared.values())
    dst.import_groups(prepared)
    assert {k: v for g in dst.groups() for k, v in dst.items(g)} == model
    assert dst.get_many(list(model)[:500]) == list(model.values())[:500]      # the filter's bits set


def test_any_other_reader_gets_the_groups_dict(stores, tmp_path):
    src = stores("src")
    model = _filled(src)
    store = CheckpointStore(str(tmp_path / "ckpt"), KEY)
    refs, _out = _written(src, store)
    files, got = StateFiles(store.storage), {}
    for g, (key, ref) in refs.items():
        data, _here = read_group(files, ref)
        entries = unpack_group(data)                    # a plain read (a restore that is not lazy)
        assert type(entries) is dict and key_group(key) == g
        got.update(entries)
    assert got == model
    parts = resolve_part({"groups": refs}, store.storage, prepare=memory.prepare_group)["groups"]
    target = open_state("memory")
    target.import_groups({g: part for g, (_key, part) in parts.items()})
    assert {k: v for g in target.groups() for k, v in target.items(g)} == model


def test_a_full_file_is_compressed_and_smaller_than_the_group_pickled(stores, tmp_path):
    src = stores("src")
    model = _filled(src)
    src._flush()
    g = key_group(7)
    mine = [k for k in model if key_group(k) == g][:100]          # stored keys of g put again, and new ones:
    new = [k for k in range(KEYS, KEYS + 60_000) if key_group(k) == g][:300]    # in the buffer, merged in order
    src.write_many({**{k: {"v": -2} for k in mine}, **{k: {"v": k} for k in new}})
    model.update({**{k: {"v": -2} for k in mine}, **{k: {"v": k} for k in new}})
    assert src._pending
    view = src.snapshot()
    try:
        data, count, first = view.full(g)
        raw_keys = [k for k, _ in view.raw(g)]
        assert raw_keys == sorted(raw_keys) and len(set(raw_keys)) == len(raw_keys)    # an SST file's order
        entries = {k: v for k, v in model.items() if key_group(k) == g}
        assert count == len(entries) and first in entries and unpack_group(data) == entries
        assert len(data) < 0.7 * len(pack_group(entries.items())), (len(data), len(pack_group(entries.items())))
        assert data[:64].find(b"_unpickled_raw") > 0                     # the raw form
    finally:
        view.release()
    small = stores("small")
    small.write_many({i: {"v": i} for i in range(1_000)})             # ~8 keys a group: as dicts
    view = small.snapshot()
    try:
        data, count, first = view.full(key_group(7))
        assert b"_unpickled_raw" not in data and unpack_group(data) == {
            k: {"v": k} for k in range(1_000) if key_group(k) == key_group(7)} and count < disk.RAW_FULL_MIN
    finally:
        view.release()


def test_deltas_are_compressed_and_every_earlier_form_still_reads():
    puts = {f"car-{i:07d}": {"v": i, "row": "x" * 40} for i in range(200)}
    data = pack_delta(puts, ["gone"])
    assert data[:1] == b"\x78" and unpack_delta(data) == (puts, ["gone"])
    plain = pickle.dumps((puts, ["gone"]), pickle.HIGHEST_PROTOCOL)       # an earlier version's delta
    assert len(data) < len(plain) / 4 and unpack_delta(plain) == (puts, ["gone"])
    small = pack_delta({"a": 1}, [])
    assert small[:1] != b"\x78" and unpack_delta(small) == ({"a": 1}, ())
    assert unpack_group(pack_group(puts.items())) == puts                  # a full file of the earlier form
    assert zlib.decompress(data)                                           # one zlib stream, nothing else


def test_a_steady_checkpoints_deltas_carry_the_stores_pickled_values_and_restore(stores, tmp_path, monkeypatch):
    """After a first checkpoint, a tenth of the keys put again or deleted (the last of them still in
    the write-back buffer): the second checkpoint's deltas are written with every unpickle and key
    encode refused in the disk module (a group rewritten whole decodes its first key only), and
    the state restored from it is the model's."""
    src = stores("src")
    model = _filled(src)
    store, files = CheckpointStore(str(tmp_path / "ckpt"), KEY), CheckpointFiles()
    checkpoint(files, store, src, 1)
    changed = list(model)[::10]
    src.write_many({k: {"v": -1, "name": "changed"} for k in changed[::2]}, deletes=changed[1::2])
    model.update({k: {"v": -1, "name": "changed"} for k in changed[::2]})
    for k in changed[1::2]:
        del model[k]
    # the last of them again, fewer than a flush: whatever the buffer's size, they are in it
    src.write_many({k: {"v": -1, "name": "changed"} for k in changed[::2][-50:]}, deletes=changed[1::2][-50:])
    assert src._pending

    class NoLoads:                                      # the disk module's pickle, loads refused
        def __getattr__(self, name):
            if name in ("loads", "load"):
                pytest.fail("a disk view's checkpoint writer unpickles no value")
            return getattr(pickle, name)

    deltas = []
    with monkeypatch.context() as m:
        m.setattr(disk, "_encode", lambda *_a: pytest.fail("a disk view's checkpoint writer encodes no key"))
        m.setattr(disk.SnapshotView, "chunks", lambda *_a, **_k: pytest.fail("nor reads a group's chunks"))
        m.setattr(disk, "pickle", NoLoads())
        m.setattr(disk, "_decode", _first_key)          # a rewritten group's first key only
        delta = disk.SnapshotView.delta
        m.setattr(disk.SnapshotView, "delta", lambda self, g, keys: deltas.append(g) or delta(self, g, keys))
        checkpoint(files, store, src, 2)
    assert len(deltas) > 100                          # most groups written as a delta
    assert restored(store, 2) == model


class MultiGets:
    """A disk state's store, its multi-gets counted (the calls RocksDB reads with the GIL let go)."""

    def __init__(self, db) -> None:
        self.db, self.sizes = db, []

    def get(self, keys, *args, **kwargs):
        if isinstance(keys, list):
            self.sizes.append(len(keys))
        return self.db.get(keys, *args, **kwargs)

    def __getattr__(self, name):
        return getattr(self.db, name)


def _group_five(count: int = 3_000) -> list:
    """``count`` int keys of key group 5."""
    keys = list(range(400_000))
    return [k for k, g in zip(keys, disk.key_groups(keys)) if g == 5][:count]


def _delta_reads(src, view, keys: list, monkeypatch) -> tuple[dict, list, list, list]:
    """``view``'s delta of ``keys`` (group 5), its puts and deleted keys, and how it read them: the
    multi-gets' sizes, and the keys read at the snapshot a ``map`` call at a time."""
    snapshot_reads, builtin_map = [], map

    def counted(func, *iterables):
        if getattr(func, "__self__", None) is view._snap:
            snapshot_reads.append(len(iterables[0]))
        return builtin_map(func, *iterables)

    monkeypatch.setattr(disk, "map", counted, raising=False)
    src._db = gets = MultiGets(src._db)
    try:
        puts, deletes = unpack_delta(pack_delta(*view.delta(5, [disk._encode(k) for k in keys])))
    finally:
        view.release()
    return puts, list(deletes), gets.sizes, snapshot_reads


def test_a_deltas_reads_are_multi_gets_of_at_most_1024_keys_and_at_the_snapshot_only_those_written_since(
        stores, monkeypatch):
    """A disk view's delta of keys an earlier snapshot closed reads them in the live store,
    ``PACK_CHUNK`` keys a multi-get (RocksDB reads them with the GIL let go; a snapshot read a
    key held it for each 1,024, 5-7 ms at 10^7 keys beside the PE's thread), and only the keys
    written since the snapshot at the snapshot, one read each: the live store has them as they
    are now."""
    monkeypatch.setattr(disk, "FLUSH_KEYS", 1)          # every write reaches the store at once
    src = stores("src")
    one = _group_five()
    src.write_many({k: {"v": k} for k in one})
    src.snapshot().release()                            # their interval closed by an earlier snapshot
    view = src.snapshot()
    src.write_many({k: {"v": "after"} for k in one[::100]})     # 30 keys newer in the live store
    puts, deletes, sizes, snapshot_reads = _delta_reads(src, view, one, monkeypatch)
    assert puts == {k: {"v": k} for k in one} and not deletes
    assert sum(sizes) == 3_000 and max(sizes) <= 1_024, f"multi-gets of {sizes} keys"
    assert not snapshot_reads, f"{sum(snapshot_reads)} keys read at the snapshot a map call at a time"


def test_a_first_checkpoint_reads_its_groups_as_ranges_of_pairs_not_a_step_a_key(stores, tmp_path):
    """A checkpoint that writes every group whole (nothing earlier to build on) has the view read
    each group from an iterator bounded to it (``reads_whole``), ``RANGE_PAIRS`` a call: a Python loop
    of ``key``, ``value``, ``next`` and an append a key was 37 % of the writer's time in a
    fill's whole checkpoints (py-spy)."""
    src = stores("src")
    model = _filled(src)
    src._db = iterators = StepCountingStore(src._db)
    store = CheckpointStore(str(tmp_path / "ckpt"), KEY)
    refs, _out = _written(src, store)
    # (the view's groups() steps into a group holding keys written since the snapshot: is it empty?)
    assert len(iterators.steps) <= KEY_GROUPS, \
        f"{len(iterators.steps)} steps of the view's iterator for {len(model)} keys"
    files = StateFiles(store.storage)
    assert {k: v for _key, ref in refs.values() for k, v in unpack_group(read_group(files, ref)[0]).items()} == model


def test_a_whole_groups_read_takes_ranges_of_pairs_and_the_keys_written_since_at_the_snapshot(
        stores, monkeypatch):
    """After ``reads_whole`` a group's read (``SnapshotView.raw``) takes its pairs from an
    iterator bounded to the group, made with the view's first cursor, ``RANGE_PAIRS`` a call; the keys
    written since the snapshot (put, deleted, new) are read at it, as the cursor's are. A second
    read of the group goes through the cursor."""
    monkeypatch.setattr(disk, "FLUSH_KEYS", 1)          # every write reaches the store at once
    src = stores("src")
    *one, new = _group_five(3_001)
    src.write_many({k: {"v": k} for k in one})
    view = src.snapshot()
    src.write_many({k: {"v": "after"} for k in one[::100]})     # newer in the live store
    src.delete(one[1])
    src.put(new, {"v": "new"})
    src._db = iterators = StepCountingStore(src._db)
    calls, islice = [], disk.islice
    monkeypatch.setattr(disk, "islice", lambda it, n: calls.append(n) or islice(it, n))
    view.reads_whole()
    try:
        first = view.raw(5)
        steps = len(iterators.steps)
        again = view.raw(5)
    finally:
        view.release()
    assert {disk._decode(k): pickle.loads(v) for k, v in first} == {k: {"v": k} for k in one}
    assert [k for k, _ in first] == sorted(k for k, _ in first) and again == first
    assert not steps, f"{steps} steps of the cursor's iterator for a group of {len(one)} keys"
    # a call at a time holds the GIL: a group of 78 k keys (10^7) in one held it 40-50 ms beside the PE
    assert calls == [disk.RANGE_PAIRS] * (len(one) // disk.RANGE_PAIRS + 1), f"calls of {calls} pairs"
    assert len(iterators.steps) >= len(one), "the second read did not go through the cursor"


def test_a_group_a_steady_checkpoint_writes_whole_is_read_as_ranges_of_pairs_after_the_views_first_read(
        stores, monkeypatch):
    """The writer names the groups it may write whole (``reads_full``) after its first read of the
    view (its groups): the cursor made by that read is let go, and the next one comes with an
    iterator bounded to each named group, ``RANGE_PAIRS`` a call, no step of the cursor a key (at
    10^7 keys a steady checkpoint rewrote its groups' 78,000 keys a key at a time, three calls into
    the iterator each). The keys written after the snapshot, before and after that first read, are
    read at the snapshot."""
    monkeypatch.setattr(disk, "FLUSH_KEYS", 1)          # every write reaches the store at once
    src = stores("src")
    *one, new, later = _group_five(3_002)
    src.write_many({k: {"v": k} for k in one})
    view = src.snapshot()
    src.write_many({k: {"v": "after"} for k in one[::100]})     # before the view's first read
    src._db = iterators = StepCountingStore(src._db)
    calls, islice = [], disk.islice
    monkeypatch.setattr(disk, "islice", lambda it, n: calls.append(n) or islice(it, n))
    try:
        assert 5 in view.groups()                       # the writer's first read: a cursor made
        src.write_many({k: {"v": "later"} for k in one[1::100]})    # after it, before the ranges
        src.delete(one[2])
        src.put(new, {"v": "new"})
        view.reads_full([5])
        src.put(later, {"v": "later"})                  # after the ranges are made
        steps = len(iterators.steps)
        first = view.raw(5)
        steps = len(iterators.steps) - steps
    finally:
        view.release()
    assert {disk._decode(k): pickle.loads(v) for k, v in first} == {k: {"v": k} for k in one}
    assert [k for k, _ in first] == sorted(k for k, _ in first)
    assert not steps, f"{steps} steps of the cursor's iterator for a group of {len(one)} keys written whole"
    assert calls == [disk.RANGE_PAIRS] * (len(one) // disk.RANGE_PAIRS + 1), f"calls of {calls} pairs"


def test_a_steady_checkpoint_writes_its_turns_groups_whole_from_ranges_and_restores(stores, tmp_path, monkeypatch):
    """Through the writer: after a first checkpoint a key in 97 is put again, and a key in 89
    after the second; the third is the turn of group four (and of every seventh after it) to be
    written whole (``checkpoint.max-deltas`` 7), deltas for the others: those groups are read from
    ranges (the cursor steps at most once a group, for the view's groups), and the state restored
    from the third checkpoint is the model's."""
    src = stores("src")
    model = _filled(src)
    store, files = CheckpointStore(str(tmp_path / "ckpt"), KEY), CheckpointFiles()
    checkpoint(files, store, src, 1)
    whole, full = [], disk.SnapshotView.full
    monkeypatch.setattr(disk.SnapshotView, "full", lambda self, g: whole.append(g) or full(self, g))
    with dask.config.set({"pescheduler.checkpoint.max-deltas": 7}):
        for checkpoint_id, step in ((2, 97), (3, 89)):
            again = {k: {"v": -checkpoint_id, "name": "again"} for k in list(model)[::step]}
            model.update(again)
            src.write_many(again)
            src._db = iterators = StepCountingStore(getattr(src._db, "db", src._db))
            checkpoint(files, store, src, checkpoint_id)
    assert 4 in whole and len(whole) < KEY_GROUPS // 2, f"groups written whole: {whole}"
    assert len(iterators.steps) <= KEY_GROUPS, \
        f"{len(iterators.steps)} steps of the view's iterator for {len(whole)} groups written whole"
    assert restored(store, 3) == model


def test_a_delta_of_the_keys_its_own_snapshot_closed_reads_nothing_from_the_store(stores, monkeypatch):
    """The keys written in the interval a snapshot closes (a steady checkpoint's every delta key)
    carry their last value in its :class:`Changes`: the delta reads neither the store nor the
    snapshot (at 10^7 keys, 2 x 10^5 keys changed, the multi-gets were 1.15 s of a checkpoint's
    4.1 s in the writer beside the PE)."""
    monkeypatch.setattr(disk, "FLUSH_KEYS", 1)
    src = stores("src")
    one = _group_five()
    src.write_many({k: {"v": k} for k in one})
    src.put(one[0], {"v": "put last"})
    src.delete(one[1])
    view = src.snapshot()
    src.write_many({k: {"v": "after"} for k in one[::100]})     # after the snapshot: not in the delta
    puts, deletes, sizes, snapshot_reads = _delta_reads(src, view, one, monkeypatch)
    assert puts == {one[0]: {"v": "put last"}, **{k: {"v": k} for k in one[2:]}} and deletes == [one[1]]
    assert not sizes and not snapshot_reads, f"multi-gets {sizes}, snapshot reads {snapshot_reads}"


def test_past_a_sixteenth_of_the_cache_an_interval_the_values_written_are_read_back_not_kept(stores, monkeypatch):
    """The values a disk state keeps for the next checkpoint's deltas are bounded (a sixteenth of
    the cache an interval, past it a batch at most): a run without checkpoints, whose snapshots
    never come, would hold every value it wrote. The delta reads the rest back, exact."""
    monkeypatch.setattr(disk, "FLUSH_KEYS", 1)
    src = stores("src")
    src._keep = 1 << 20                                 # 1 MB
    one, big = _group_five(), "x" * 1_000
    for i in range(0, len(one), 250):                   # a PE's slices: 250 keys a call
        src.write_many({k: {"v": k, "pad": big} for k in one[i:i + 250]})
    kept = sum(len(v) for v in src._dirty.values() if type(v) is bytes)
    assert kept <= (1 << 20) + 250 * 1_100, f"{kept} bytes of values kept"
    view = src.snapshot()
    puts, deletes, sizes, snapshot_reads = _delta_reads(src, view, one, monkeypatch)
    assert puts == {k: {"v": k, "pad": big} for k in one} and not deletes
    assert sum(sizes) >= 1_500 and not snapshot_reads, f"multi-gets {sizes}"


def test_keys_written_with_no_snapshot_to_come_are_not_kept_without_bound(stores, monkeypatch):
    """Past ``DIRTY_KEYS`` keys written since the last snapshot, with no view reading the live
    store, a disk state stops naming them (let go in the stores' background thread: 2^20 keys
    held the PE's turn 40 ms) and the next checkpoint writes every group whole, exact; a view
    still reading the live store keeps them named (its reads are corrected by them)."""
    monkeypatch.setattr(disk, "FLUSH_KEYS", 1)
    monkeypatch.setattr(disk, "DIRTY_KEYS", 100)
    let_go, real = [], disk.Written.let_go
    monkeypatch.setattr(disk.Written, "let_go", lambda w: (let_go.append((len(w), threading.current_thread().name)), real(w)))
    src = stores("src")
    src._look = 100                                     # (set at its open, before the patch)
    model = {k: {"v": k} for k in range(300)}
    src.write_many(model)
    src._merging[1].result(10)                          # its keys counted in the background
    src.put(0, {"v": "last"})                           # the next flush looks at the count
    model[0] = {"v": "last"}
    assert len(src._dirty) <= 100, f"{len(src._dirty)} keys named"
    disk._background().submit(int).result(10)          # (its one thread: what was asked before is done)
    assert let_go == [(300, disk.BACKGROUND + "_0")], let_go
    store, files = CheckpointStore(f"memory://dirty-{id(src)}", b"k" * 32), CheckpointFiles()
    checkpoint(files, store, src, 1)
    assert restored(store, 1) == model
    view = src.snapshot()                               # unreleased, unread: it reads the live store later
    src._look = 100
    src.write_many({k: {"v": -k} for k in range(300)})
    src._merging[1].result(10)
    src.put(1, {"v": -1})
    assert len(src._dirty) == 300 and not src._whole
    assert dict(kv for g in view.groups() for kv in view.items(g)) == model
    view.release()


def test_a_few_keys_written_again_and_again_stay_named_past_dirty_keys_writes(stores, monkeypatch):
    """The keys written since the snapshot are counted as written (a batch appended, not a dict
    updated, in the PE's turn: :class:`disk.Written`), but a state stops naming them only past
    ``DIRTY_KEYS`` distinct keys, counted in the background: ten keys written 600 times stay named,
    and the next checkpoint writes deltas of them, not every group whole."""
    monkeypatch.setattr(disk, "FLUSH_KEYS", 1)
    monkeypatch.setattr(disk, "DIRTY_KEYS", 100)
    src = stores("src")
    src._look = 100
    store, files = CheckpointStore(f"memory://hot-{id(src)}", b"k" * 32), CheckpointFiles()
    model = {k: {"v": k} for k in range(1000)}
    src.write_many(model)
    first = written(checkpoint(files, store, src, 1), 1)
    for n in range(60):                                 # 600 writes of ten keys: six looks at the count
        src.write_many({k: {"v": n} for k in range(10)})
        if src._merging is not None:
            src._merging[1].result(10)
    model.update({k: {"v": 59} for k in range(10)})
    assert src._dirty.most == 600 and len(src._dirty) == 10 and not src._whole, \
        "ten keys written again and again made whole groups"
    second = written(checkpoint(files, store, src, 2), 2)
    assert restored(store, 2) == model
    assert second < first / 5, f"{second} bytes written for ten keys changed, {first} for the whole state"


@settings(max_examples=200, deadline=None)
@given(keys=st.lists(st.binary(max_size=3), unique=True), cut=st.randoms())
def test_keys_written_since_a_snapshot_merge_into_a_groups_order(keys, cut):
    """:func:`disk._merged`: what a group's raw read met in the store and what it read at the
    snapshot instead (no key in both), one list in key order."""
    pairs = sorted((k, b"v" + k) for k in keys)
    at = [p for p in pairs if cut.random() < 0.3]
    rest = [p for p in pairs if p not in at]
    assert disk._merged(rest, at) == pairs
