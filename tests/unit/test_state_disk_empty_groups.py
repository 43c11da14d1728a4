"""A disk store ingests a key group's SST file only into a group it holds nothing of, and knows
which those are without asking the store (``DiskState._empty``): a seek into a group just dropped
by range stepped over each of its deleted keys (30-79 ms at 78,000 keys, in the PE's turn). A
drop's range deletes leave the memtable in RocksDB's thread, so the group given back later (a
Release after a Replicate) is ingested, not written key by key in the turn."""

from __future__ import annotations

import functools
import os
import pickle

import pytest
from keyed_stores import disk_stores  # noqa: F401  (a fixture)

from pescheduler.state import disk
from pescheduler.state.groups import loads_prepared, take_groups
from pescheduler.wire import KEY_GROUPS, key_group

CACHE = 64 << 20


@pytest.fixture
def stores(disk_stores, monkeypatch):
    monkeypatch.setattr(disk, "INGEST_KEYS", 64)        # a group of 100 keys goes as an SST file
    return disk_stores


class Ingests:
    """The store's RocksDB, its ingests counted (taken, refused) and everything else passed on."""

    def __init__(self, db) -> None:
        self.db, self.taken, self.refused = db, 0, 0

    def __getattr__(self, name):
        return getattr(self.db, name)

    def ingest_external_file(self, *args):
        try:
            self.db.ingest_external_file(*args)
        except Exception:
            self.refused += 1
            raise
        self.taken += 1


def _counting(state) -> Ingests:
    state._db = Ingests(state._db)
    return state._db


def _keys_of(group: int, n: int, offset: int = 0) -> list[int]:
    out, k = [], offset
    while len(out) < n:
        if key_group(k) == group:
            out.append(k)
        k += 1
    return out


def _prepared(state, group: int, entries: dict) -> disk.PreparedGroup:
    prepared = disk.prepare_group(group, entries, where=state.path, cache_bytes=CACHE)
    assert prepared.sst is not None
    return prepared


def _group(state, group: int) -> dict:
    return dict(state.items(group))


def _flushed(state, within_s: float = 30.0) -> None:
    """Until the drop's flush, asked of the stores' background thread, has ended (bounded)."""
    assert state._flushing, "no flush was asked"
    state._flushing[0].result(within_s)


def test_groups_given_away_and_back_are_ingested_not_written_in_the_turn(stores):
    src, dst = stores("src"), stores("dst")
    model = {k: ("row", k) for k in range(40_000)}         # about 312 keys a group
    src.write_many(model)
    mine = frozenset(range(0, KEY_GROUPS, 2))
    away = loads_prepared(pickle.dumps({"groups": take_groups(src, mine)}),
                          functools.partial(disk.prepare_group, where=dst.path, cache_bytes=CACHE))
    dst.import_groups({g: data for g, (_key, data) in away["groups"].items()})
    src.write_many({k: ("later", k) for k in range(40_000, 41_000) if key_group(k) not in mine})
    _flushed(src)
    back = loads_prepared(pickle.dumps({"groups": take_groups(dst, mine)}),
                          functools.partial(disk.prepare_group, where=src.path, cache_bytes=CACHE))
    counted = _counting(src)
    src.import_groups({g: data for g, (_key, data) in back["groups"].items()})
    assert (counted.taken, counted.refused) == (len(mine), 0)      # every group back as its file
    expected = {**model, **{k: ("later", k) for k in range(40_000, 41_000) if key_group(k) not in mine}}
    assert {k: v for g in range(KEY_GROUPS) for k, v in src.items(g)} == expected
    assert all(src.get(k) == v for k, v in expected.items())


@pytest.mark.parametrize("written", ["flushed", "buffered"])
def test_a_group_written_into_is_replaced_never_overlaid(stores, written):
    state = stores("s")
    old = {k: "old" for k in _keys_of(4, 10)}
    state.write_many(old)
    if written == "flushed":
        state._flush()
    new = {k: "new" for k in _keys_of(4, 100, offset=10**6)}
    counted = _counting(state)
    state.import_groups({4: _prepared(state, 4, new)})
    assert counted.taken == 0                   # written as a batch replacing the group
    assert _group(state, 4) == new              # none of the old keys left beside the file's
    assert all(state.get(k) is None for k in old)


def test_a_group_written_into_after_its_drop_is_replaced_never_overlaid(stores):
    state = stores("s")
    state.write_many({k: "first" for k in _keys_of(4, 200)})
    state.drop_groups([4])
    again = {k: "again" for k in _keys_of(4, 10, offset=10**6)}
    state.write_many(again)
    state._flush()
    _flushed(state)
    new = {k: "new" for k in _keys_of(4, 100, offset=2 * 10**6)}
    state.import_groups({4: _prepared(state, 4, new)})
    assert _group(state, 4) == new


def test_groups_between_those_written_stay_empty_and_are_ingested(stores):
    state = stores("s")
    written = {k: "w" for g in (2, 4, 6) for k in _keys_of(g, 20)}
    state.write_many(written)
    state._flush()                              # one sorted batch of groups 2, 4 and 6: 3 and 5 in its span
    counted = _counting(state)
    fresh = {g: {k: g for k in _keys_of(g, 100)} for g in (3, 5)}
    state.import_groups({g: _prepared(state, g, entries) for g, entries in fresh.items()})
    assert (counted.taken, counted.refused) == (2, 0)
    state.import_groups({4: _prepared(state, 4, {k: "n" for k in _keys_of(4, 100, offset=10**6)})})
    assert counted.taken == 2                   # 4 holds keys: a batch replaced it
    assert _group(state, 3) == fresh[3] and _group(state, 5) == fresh[5]
    assert set(_group(state, 4).values()) == {"n"}
    assert _group(state, 2) == {k: "w" for k in _keys_of(2, 20)}


def test_an_installed_groups_file_directory_is_removed_off_the_turn(stores, monkeypatch):
    """The SST file's directory goes in the stores' background thread (17 ms in the turn beside
    RocksDB's flushes at 10^7 keys), ingested or not."""
    import threading

    state, removed = stores("s"), []
    done = threading.Event()
    real = disk.PreparedGroup.discard

    def discard(self):
        real(self)
        removed.append((threading.current_thread().name, os.path.exists(os.path.dirname(self.sst))))
        if len(removed) == 2:
            done.set()
    monkeypatch.setattr(disk.PreparedGroup, "discard", discard)
    state.write_many({k: "w" for k in _keys_of(5, 10)})
    state._flush()
    state.import_groups({g: _prepared(state, g, {k: g for k in _keys_of(g, 100)}) for g in (3, 5)})
    assert done.wait(30)
    assert [(name.startswith(disk.BACKGROUND), there) for name, there in removed] == [(True, False)] * 2
    assert set(_group(state, 3).values()) == {3} and set(_group(state, 5).values()) == {5}


def test_a_drops_flush_is_asked_of_the_background_thread_and_a_close_waits_for_it(stores, monkeypatch):
    """rocksdict's ``flush(False)`` waits until a flush would not stall writes (109 ms in process
    right after a fill, 321 ms on a worker's loop for a retired copy at 10^7 keys): a take in a
    PE's turn and a retire on the loop only ask for it. A store closed right after its drop
    closes once that flush has ended, and leaves nothing behind."""
    import threading

    flushed, real = [], disk._flush

    def flush(db, path):
        flushed.append(threading.current_thread().name)
        real(db, path)
    monkeypatch.setattr(disk, "_flush", flush)
    states = [stores(f"s{i}") for i in range(6)]
    for state in states:
        state.write_many({k: ("row", k) for k in range(5_000)})
        state._flush()
    take_groups(states[0], range(0, KEY_GROUPS, 2))
    states[1].drop_groups(range(4))
    for state in states[2:]:
        state.retire()
    paths = [state.path for state in states]
    for state in states:
        state.close()
    assert len(flushed) == len(states) and all(name.startswith(disk.BACKGROUND) for name in flushed), flushed
    assert not any(os.path.exists(p) for p in paths)
