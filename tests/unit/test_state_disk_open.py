"""Opening a disk store (issue 30: a Replicate's copy and a restore open one inside the pause),
guarded by a count, not a time: the memory a store makes resident when it opens."""

from __future__ import annotations

import dask.config
from dask.utils import parse_bytes

from pescheduler.state import open_state


def _resident_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096


def test_opening_a_store_does_not_zero_its_whole_bitmap(tmp_path) -> None:
    """The "may be stored" bitmap is a 16th of the cache (32 MB at a 512 MB cache). As a
    ``bytearray`` it was zeroed at every open, and all of it stayed resident (13-33 ms quiet, 127 ms
    once under load, in a Replicate's deploy): now it is zero pages given on first touch. Eight
    stores of a 512 MB cache opened (and a few keys written into each) make less than one and a
    half bitmaps of memory resident (RocksDB's own: 14 MB, 33 MB since each memtable has its
    Bloom filter, 1.3 MB), where they made 138 MB."""
    stores, bitmap = [], 512 * 2**20 // 16
    before = _resident_bytes()
    try:
        with dask.config.set({"pescheduler.state.dir": str(tmp_path), "pescheduler.state.cache": "512MB"}):
            for i in range(8):
                state = open_state("disk", owner=f"open-{i}")
                state.write_many([(k, k) for k in range(100)])
                state.groups()                  # the buffer into the store: the bitmap's bits set
                assert [state.get(k) for k in (0, 99, 100)] == [0, 99, None]
                stores.append(state)
        grown = _resident_bytes() - before
        assert grown < 1.5 * bitmap, (f"opening {len(stores)} stores made {grown / 2**20:.0f} MB resident "
                                f"(a bitmap is {bitmap / 2**20:.0f} MB): each zeroed its whole bitmap")
    finally:
        for state in stores:
            state.close()


def _options(path: str) -> dict[str, str]:
    """The options RocksDB wrote into the store's newest OPTIONS file, as ``name: value``."""
    import glob
    import os

    newest = max(glob.glob(os.path.join(path, "db", "OPTIONS-*")), key=os.path.getmtime)
    with open(newest) as f:
        return dict(line.strip().split("=", 1) for line in f if "=" in line and not line.lstrip().startswith("#"))


def test_a_store_uses_its_whole_cache_and_filters_gets_in_its_memtables(tmp_path) -> None:
    """``pescheduler.state.cache`` is the store's RocksDB memory: one block cache of all of it, to
    which the memtables are charged (up to half). A cache of half the budget with the memtables
    charged to it too held half the memory the setting names. And each memtable has a Bloom
    filter of whole keys, so a get of a key it does not hold (most of a steady batch's, at
    10^7 keys) skips its skip list: raw gets 8.3 -> 4.1 us a key at 10^7 keys, with the cache."""
    with dask.config.set({"pescheduler.state.dir": str(tmp_path), "pescheduler.state.cache": "64MB"}):
        state = open_state("disk", owner="options")
    try:
        capacity = int(state._db.property_value("rocksdb.block-cache-capacity"))
        assert capacity == parse_bytes("64MB"), f"a block cache of {capacity / 2**20:.0f} MiB for a 64 MB budget"
        options = _options(state.path)
        assert float(options.get("memtable_prefix_bloom_size_ratio", 0)) > 0, options.get("memtable_prefix_bloom_size_ratio")
        assert options.get("memtable_whole_key_filtering") == "true", options.get("memtable_whole_key_filtering")
        state.write_many([(k, k) for k in range(5000)])
        assert state.get_many([0, 4999, 5000]) == [0, 4999, None]
    finally:
        state.close()
