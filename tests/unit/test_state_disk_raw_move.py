"""A rescale's part between two disk stores carries the stores' own bytes (``ViewGroup.packed``):
the receiving store writes them into its SST file as they are, nothing decoded, unpickled,
encoded, pickled or sorted on either side; any other reader gets the group as before."""

from __future__ import annotations

import functools
import pickle

import pytest
from keyed_stores import StepCountingStore, disk_stores, filled_mixed  # noqa: F401  (a fixture)

from pescheduler.state import disk, memory
from pescheduler.state.base import unpack_group
from pescheduler.state.groups import loads_prepared, take_groups
from pescheduler.wire import KEY_GROUPS, key_group

KEYS = 40_000           # a group of ~312 keys: some taken groups large enough to ingest (INGEST_KEYS lowered)


@pytest.fixture
def stores(disk_stores, monkeypatch):
    monkeypatch.setattr(disk, "INGEST_KEYS", 256)      # some groups go as SST files, the rest as write batches
    return disk_stores


def _filled(state) -> dict:
    return filled_mixed(state, KEYS)


def _moved(stores, prepare_of):
    src, dst = stores("src"), stores("dst")
    model = _filled(src)
    mine = frozenset(range(0, KEY_GROUPS, 2))
    blob = pickle.dumps({"groups": take_groups(src, mine)}, pickle.HIGHEST_PROTOCOL)
    expected = {k: v for k, v in model.items() if key_group(k) in mine}
    return src, dst, blob, expected, mine, prepare_of(dst)


def test_a_part_between_disk_stores_is_their_bytes_written_as_they_are(stores, monkeypatch):
    seen = []
    real = disk.prepare_group

    def spy(group, entries, **kw):
        seen.append(type(entries))
        return real(group, entries, **kw)
    src, dst, blob, expected, mine, prepare = _moved(
        stores, lambda dst: functools.partial(spy, where=dst.path, cache_bytes=64 << 20))
    monkeypatch.setattr(disk, "prepare_group", spy)     # the part knows the store's own by this name
    with monkeypatch.context() as m:
        m.setattr(disk, "_encode", lambda key: pytest.fail("a raw part encodes no key"))
        m.setattr(disk, "_decode_all", lambda raws: pytest.fail("a raw part is not decoded"))
        part = loads_prepared(blob, prepare)
        dst.import_groups({g: data for g, (_key, data) in part["groups"].items()})
    assert seen and set(seen) == {disk.RawEntries}
    assert all(type(data) is disk.PreparedGroup for _key, data in part["groups"].values())
    assert any(data.sst for _key, data in part["groups"].values()), "no group went as an SST file"
    got = {k: v for g in range(KEY_GROUPS) for k, v in dst.items(g)}
    assert got == expected
    assert all(dst.get(k) == v for k, v in expected.items())        # the "may be stored" bits are set
    assert not set(src.groups()) & mine                             # the take left the source


def test_a_raw_part_read_without_a_disk_store_is_the_group_as_before(stores):
    _src, _dst, blob, expected, mine, _prepare = _moved(stores, lambda dst: None)
    plain = pickle.loads(blob)["groups"]              # no prepare: the group's dict, as a part may be
    assert {k: v for _key, data in plain.values() for k, v in unpack_group(data).items()} == expected
    into_memory = loads_prepared(blob, memory.prepare_group)["groups"]
    assert all(type(data) is memory.PreparedGroup for _key, data in into_memory.values())
    state = memory.MemoryState()
    state.import_groups({g: data for g, (_key, data) in into_memory.items()})
    assert dict(state.entries()) == expected


def test_a_parts_groups_are_read_as_ranges_of_pairs_not_a_step_a_key(stores):
    """The part packs each taken group from an iterator bounded to it, made with the take's own
    iterator (both before the store drops the groups), ``RANGE_PAIRS`` a call: no Python step a key
    beside the PE, whose stream a move at 10^7 keys stalled up to 150 ms; the part is the group as
    it was, the write-back buffer's keys of it included."""
    src = stores("src")
    model = _filled(src)
    src._db = iterators = StepCountingStore(src._db)
    mine = frozenset(range(0, KEY_GROUPS, 2))
    src.put("in the buffer", "unflushed")              # its group's pairs: the store's and the buffer's
    model["in the buffer"] = "unflushed"
    blob = pickle.dumps({"groups": take_groups(src, mine | {key_group("in the buffer")})}, pickle.HIGHEST_PROTOCOL)
    assert not iterators.steps, f"{len(iterators.steps)} steps of the take's iterator"
    moved = {k: v for _key, data in pickle.loads(blob)["groups"].values() for k, v in unpack_group(data).items()}
    assert moved == {k: v for k, v in model.items() if key_group(k) in mine | {key_group("in the buffer")}}


def test_a_raw_part_of_another_group_is_refused(stores):
    src = stores("src")
    _filled(src)
    g = next(iter(src.groups()))
    pairs = src.take_groups([g])[g].view.raw(g)
    with pytest.raises(ValueError, match=f"not {(g + 1) % KEY_GROUPS}"):
        disk.prepare_group((g + 1) % KEY_GROUPS, disk.RawEntries([k for k, _ in pairs], [v for _, v in pairs]))
