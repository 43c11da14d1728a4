"""Opening a disk store (issue 30: a Replicate's copy and a restore open one inside the pause),
guarded by a count, not a time: the memory a store makes resident when it opens."""

from __future__ import annotations

import dask.config

from pescheduler.state import open_state


def _resident_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096


def test_opening_a_store_does_not_zero_its_whole_bitmap(tmp_path) -> None:
    """The "may be stored" bitmap is a 16th of the cache (32 MB at a 512 MB cache). As a
    ``bytearray`` it was zeroed at every open, and all of it stayed resident (13-33 ms quiet, 127 ms
    once under load, in a Replicate's deploy): now it is zero pages given on first touch. Eight
    stores of a 512 MB cache opened (and a few keys written into each) make less than one bitmap
    of memory resident (14 MB, RocksDB's own), where they made 138 MB."""
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
        assert grown < bitmap, (f"opening {len(stores)} stores made {grown / 2**20:.0f} MB resident "
                                f"(a bitmap is {bitmap / 2**20:.0f} MB): each zeroed its whole bitmap")
    finally:
        for state in stores:
            state.close()
