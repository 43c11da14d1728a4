"""The ``disk`` backend: an embedded RocksDB (through ``rocksdict``) per operator instance.

Layout: one store per operator instance in a directory of its own under
``pescheduler.state.dir``; a key is stored as one byte of key group followed
by its canonical encoding (:func:`_encode`), a value as its pickle. A key group
is therefore one contiguous key range: iterating, exporting or dropping a group
is a seek and a range (``delete_range``), never a scan of the others.

Keys Python holds equal are one key here, as in a dict (the ``memory`` backend)
and in ``wire.key_group``: 0, 0.0, False and ``numpy.int64(0)`` are stored as
the int 0 (and read back as it), tuples of them likewise. A plain int or str
key is a tag byte and its digits or UTF-8 (no pickle: the hot path); anything
else is the pickle of its canonical form. Keys of the first encoding (a pickle
right after the group byte) still read.

Writes are held in a write-back buffer in front of the store (a dict of encoded
key -> pickled value, None for a delete; reads look there first) and go in one
``WriteBatch`` when it holds ``FLUSH_KEYS`` keys, or before anything reads the
store as a whole (a scan, a drop, an import; a snapshot and a take copy it
instead): a put through the binding cost a call, a memtable insert and a WAL
append each. The WAL is off,
as in Flink's RocksDB backend: a store is never reopened after a crash, the
checkpoint is the durability (a RocksDB checkpoint flushes the memtable first).

Memory is bounded by ``pescheduler.state.cache``: one RocksDB block cache of
all of it (recently read blocks), to which a write buffer manager charges the
memtables (recent writes, up to half of it). What does not fit is in
SST files on the worker's disk, so an instance may hold several times the
worker's memory. Outside that budget: the keys written since the last snapshot,
each with its pickled value (an interval's writes, until a checkpoint has
written them as deltas; values up to a sixteenth of the cache an interval), so
that a steady checkpoint reads nothing back. A snapshot (a checkpoint's barrier,
on the PE's loop) is a RocksDB snapshot and a copy of the write-back buffer, O(1)
(:class:`SnapshotView`: its reads, in the checkpoint writer's thread, work around rocksdict 0.3.29's
snapshot iterators, which read the live store). A rescale's take (in the PE's
turn) is the same kind of view with its iterator made at once, before the store
drops the taken groups by range: O(taken groups + write-back buffer), whatever
was written since anything; their keys are read when the part is packed, off
the turn (:meth:`DiskState.take_groups`).

Why RocksDB through rocksdict: a maintained binding shipping wheels with the
store built in (no system library), with snapshots, range deletes, a bounded
block cache and checkpoints (hard-linked SST files: where incremental
checkpoints plug in). Measured against plain dicts in bench/state.py.
"""

from __future__ import annotations

import bisect
import contextlib
import heapq
import io
import os
import pickle
import logging
import mmap
import shutil
import tempfile
import threading
import time
import weakref
import zlib
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor, wait
from collections.abc import Collection, Mapping
from itertools import compress, islice, repeat
from operator import is_, itemgetter, not_, or_
from typing import Any, Callable, Iterable, Iterator

from ..wire import _canonical, tuple_bytes
from .base import (_PREPARE, KEY_GROUPS, PACK_CHUNK, Changes, KeyedState, PreparedEntries, StateView, keep_received,
                   key_group, pack_chunks)
from .foreground import give_way
from .groups import _numpy, key_groups, split_by_group

logger = logging.getLogger(__name__)

_PICKLE = pickle.HIGHEST_PROTOCOL
_GROUP = tuple(bytes((g,)) for g in range(KEY_GROUPS + 1))
_INT, _STR, _PICKLED = 0x69, 0x73, 0x70       # b"i", b"s", b"p": the tag after the group byte
_INT_KEY = b"%ci%d"     # (group, int) -> _encode(int): one format a key (three maps: 0.24 against 0.11 us)
# Writes held in the write-back buffer before one write batch. The write holds the GIL (rocksdict
# 0.3.29) and stops the PE: 4,096 keys of a 10^6-key store changed at random took 13 ms in process
# (the write 9.3, the batch 2.5, the filter 1.6): gaps of 15-65 ms in the table's stream at 10^6;
# 1,024 keys 5.7 ms, and the table's 10^6 ``disk`` stall fell from 28-43 to 17-25 ms (issue 30).
FLUSH_KEYS = 1024
ENCODED_KEYS = 8192     # keys whose encoding is remembered (an operator's get, then put, of one key)
PIN_READS = 2           # reads at once of a view pinned by a drop, besides the one holding its cursor
INGEST_KEYS = 16384     # a prepared group this large is an SST file, ingested; a smaller one a write batch
MEMTABLE_BLOOM = 0.02   # a memtable's whole-key Bloom filter, in bytes per byte of memtable (RocksDB's
                        # memtable_prefix_bloom_size_ratio): about 10 bits a key of about 60 bytes (1 %
                        # false positives), 1.3 MB allocated with each memtable of 64 MB (at 0.1, 6.4 MB:
                        # eight stores opened made 72 MB resident)
DIRTY_KEYS = 1 << 20    # keys written since the last snapshot past which, no view reading the live store,
                        # the state stops naming them: the next checkpoint writes every group whole (a run
                        # without checkpoints, whose snapshots never come, kept every key it wrote)


def _stored_bits(cache_bytes: int) -> mmap.mmap:
    """The "may be stored" bitmap: a 16th of the cache, a power of two of bytes (at least 64 KiB).

    Anonymous memory, not a ``bytearray``: a ``bytearray`` is zeroed by a memset at every store
    open (32 MB at a 512 MB cache: 13-33 ms quiet, 127 ms once loaded, in a Replicate's deploy and
    a restore), and all of it is resident from then on, each store's. An anonymous map is zero
    pages the kernel gives on first touch: a store that saw few keys holds few pages. Its index and
    item assignment are a ``bytearray``'s (a bit test read 3 % slower in a micro-benchmark)."""
    return mmap.mmap(-1, _stored_size(cache_bytes))


def _stored_size(cache_bytes: int) -> int:
    """The bitmap's bytes at a cache of ``cache_bytes`` (:func:`_stored_bits`)."""
    size = 1 << 16
    while size * 2 <= cache_bytes // 16:
        size *= 2
    return size


_POPULATE_WRITE = getattr(mmap, "MADV_POPULATE_WRITE", 23)     # Linux 5.14; Python names it from 3.13
POPULATE_BYTES = 1 << 20    # bitmap faulted in per call of _populate (about a millisecond holding the GIL)


def _populate(bitmap: mmap.mmap) -> None:
    """Every page of ``bitmap`` faulted in writable, :data:`POPULATE_BYTES` at a time, in a thread
    of its own: the kernel maps them without changing a byte, so the PE's writes meanwhile are
    safe. A restored group's keys set bits all over the bitmap: first touched in the PE's turn,
    its pages cost a fault each (8,192 of them at a 512 MB cache: 40-80 ms for a group of 78,000
    keys, loaded; 3-12 ms once faulted). A kernel without it leaves them to first touch."""
    for start in range(0, len(bitmap), POPULATE_BYTES):
        try:
            bitmap.madvise(_POPULATE_WRITE, start, min(POPULATE_BYTES, len(bitmap) - start))
        except (OSError, ValueError):
            return
        time.sleep(0)                       # the GIL to the PE's thread between two calls


_U64 = (1 << 64) - 1
_BLOCK = 511            # a key's two bits are in one block of 512 bits (MayBeStored)


class MayBeStored:
    """The "may be stored" filter of a store's encoded keys: a Bloom filter of two bits per key
    over :func:`_stored_bits`'s map (never cleared). A key with a bit clear was never written, so
    a get of it is a miss without a call into RocksDB (a fill's every get).

    Two bits, not one: with one, a key new to a store of n keys set in m bits read RocksDB with
    a chance of n/m (0.4 % at 10^6 keys in 32 MB, 3.7 % at 10^7); each such read is a call that
    lets the GIL go (rocksdict's get) and waits to have it back beside a checkpoint's writer: in
    a fill of 10^6 keys (``bench/fill.py``, its writer beside) 3,585 of them cost 0.48 s of wall
    time and 0.05 s of CPU. With two, about (2n/m)^2: 0.006 % at 10^6, 0.55 % at 10^7. Both of a key's bits are
    in one block of 512 bits (a cache line: a blocked Bloom filter, as RocksDB's own), so a test
    reads one line, not two far apart: bit ``h mod m`` (``h`` the encoded key's hash), and the bit
    of its block at the hash's upper 32 bits mod 512. The map is at least 64 KiB: whole blocks."""

    def __init__(self, cache_bytes: int) -> None:
        self.bits = _stored_bits(cache_bytes)
        self.mask = len(self.bits) * 8 - 1

    def __contains__(self, key: bytes) -> bool:
        u, mask, bits = hash(key) & _U64, self.mask, self.bits
        a = u & mask
        b = (a & ~_BLOCK) | (u >> 32 & _BLOCK)
        return bool(bits[a >> 3] & (1 << (a & 7))) and bool(bits[b >> 3] & (1 << (b & 7)))

    def add_hashes(self, hashes: Iterable[int]) -> None:
        """The bits of keys of these hashes set, per key in Python (a few keys, or no numpy)."""
        mask, bits = self.mask, self.bits
        for h in hashes:
            u = h & _U64
            a = u & mask
            for at in (a, (a & ~_BLOCK) | (u >> 32 & _BLOCK)):
                bits[at >> 3] |= 1 << (at & 7)

    @staticmethod
    def places(np: Any, hashes: Any, mask: int) -> tuple[Any, Any]:
        """Where keys of ``hashes`` (int64) have their bits in a map of ``mask + 1`` bits: byte offsets
        (intp) and each one's bit (uint8), the first bits' then the second's (2 x the keys)."""
        h = hashes.view(np.uint64)
        first = h & np.uint64(mask)
        both = np.concatenate((first, (first & ~np.uint64(_BLOCK)) | (h >> np.uint64(32) & np.uint64(_BLOCK))))
        return (both >> np.uint64(3)).astype(np.intp), np.left_shift(np.uint8(1), (both & np.uint64(7)).astype(np.uint8))

    @staticmethod
    def hashes(np: Any, keys: Collection[bytes]) -> Any:
        """The encoded keys' hashes as int64, taken by ``map`` in C."""
        return np.fromiter(map(hash, keys), dtype=np.int64, count=len(keys))

    def bits_of(self, encoded: list[bytes]) -> tuple | None:
        """:meth:`places` of the ``encoded`` keys in this map, for :meth:`among` and then :meth:`add`
        of the same keys (a batch read, then written: :meth:`DiskState.write_many`); None under
        64 keys or without numpy (both then work a key at a time)."""
        np = _numpy()
        if np is None or len(encoded) < 64:
            return None
        return self.places(np, self.hashes(np, encoded), self.mask)

    def among(self, encoded: list[bytes], among: list[bool] | None, places: tuple | None = None) -> list[int]:
        """The places of the ``encoded`` keys (``among``: those where it is True; None: all) that may
        be stored; ``places`` their :meth:`bits_of`. In numpy from 64 keys."""
        np = _numpy()
        if np is None or len(encoded) < 64:
            return [i for i, k in enumerate(encoded) if (among is None or among[i]) and k in self]
        at, bit = places or self.places(np, self.hashes(np, encoded), self.mask)
        hit = (np.frombuffer(self.bits, dtype=np.uint8)[at] & bit) != 0
        hit = hit[:len(encoded)] & hit[len(encoded):]
        if among is not None:
            hit &= np.fromiter(among, dtype=bool, count=len(among))
        return np.flatnonzero(hit).tolist()

    def add(self, keys: Collection[bytes], places: tuple | None = None) -> None:
        """The encoded ``keys``' bits set (``places``: their :meth:`bits_of`), in the PE's turn (a
        bit set is a read and a write of a byte: not from another thread); in numpy from 64 keys.
        A gather, an or and a scatter (``bitmap[at] |= bit``): where two bits share a byte the
        last one's write wins, so the bits not set are looked for and set again, until none is
        missing (a key's two bits share its byte once in 64: a second pass of a few dozen bits a
        flush). ``bitwise_or.at``, which needs no second pass, took 0.15 us a key against 0.10
        with the hashes (10^6 keys in flushes of 1,024, in process)."""
        np = _numpy()
        if np is None or len(keys) < 64:
            self.add_hashes(map(hash, keys))
            return
        bitmap = np.frombuffer(self.bits, dtype=np.uint8)
        at, bit = places or self.places(np, self.hashes(np, keys), self.mask)
        while len(at):
            bitmap[at] |= bit
            missing = (bitmap[at] & bit) == 0
            at, bit = at[missing], bit[missing]

    @classmethod
    def marks(cls, np: Any, hashes: list[int], cache_bytes: int) -> tuple:
        """``(mask, byte offsets, their bits)`` of keys of ``hashes`` in the filter of a store of
        ``cache_bytes``, each offset once with its bits combined (computed off the PE's turn, by
        :func:`prepare_group`; :meth:`add_marks` applies them in one gather and scatter)."""
        mask = _stored_size(cache_bytes) * 8 - 1
        at, bits = cls.places(np, np.array(hashes, dtype=np.int64), mask)
        order = np.argsort(at, kind="stable")
        at, bits = at[order], bits[order]
        starts = np.concatenate(([0], np.flatnonzero(np.diff(at)) + 1))
        return mask, at[starts].astype(np.intp), np.bitwise_or.reduceat(bits, starts).astype(np.uint8)

    def add_marks(self, marks: tuple | None, hashes: list[int]) -> None:
        """:meth:`marks`' offsets and bits set where their mask is this filter's, else the keys of
        ``hashes`` one at a time."""
        if marks is not None and marks[0] == self.mask:
            _mask, at, bits = marks
            bitmap = _numpy().frombuffer(self.bits, dtype="uint8")
            bitmap[at] |= bits                  # offsets unique: no update lost
            return
        self.add_hashes(hashes)


def _prefix(group: int) -> bytes:
    return _GROUP[group]


def _encode(key: Any) -> bytes:
    """Group byte, tag, body: one encoding per value Python holds equal (``wire._canonical``:
    an integral number is an int, a tuple canonical inside and pickled without back-references,
    ``wire.tuple_bytes``), so 0, 0.0 and False are one key, and so are ``(s, s)`` and ``(s, t)``
    for equal strings ``s`` and ``t``."""
    t = type(key)
    if t is not str and t is not int:
        key = _canonical(key)
        t = type(key)
        if t is tuple:                  # memo-free: (s, s) and (s, a copy of s) are one key
            return _GROUP[key_group(key)] + b"p" + tuple_bytes(key)
        if t is not str and t is not int:
            return _GROUP[key_group(key)] + b"p" + pickle.dumps(key, _PICKLE)
    if t is str:
        return _GROUP[key_group(key)] + b"s" + key.encode()
    return _GROUP[key_group(key)] + b"i%d" % key


def _decode(raw: bytes) -> Any:
    """The key :func:`_encode` encoded (its canonical form); the first encoding's pickle too."""
    tag = raw[1]
    if tag == _INT:
        return int(raw[2:])
    if tag == _STR:
        return raw[2:].decode()
    if tag == _PICKLED:
        return pickle.loads(raw[2:])
    return pickle.loads(raw[1:])            # written before the tags: the pickle follows the group


_TAIL = itemgetter(slice(2, None))     # an encoded key's body, after its group and tag bytes


def _decode_all(raws: list[bytes]) -> list:
    """``[_decode(raw) for raw in raws]``, in C (``map``) when every key is an int or every one a
    str (their tag bytes read in one ``bytes`` of ``map``): a Python call per key otherwise."""
    tags = set(bytes(map(_SECOND, raws)))
    if tags == {_INT}:
        return list(map(int, map(_TAIL, raws)))
    if tags == {_STR}:
        return list(map(bytes.decode, map(_TAIL, raws)))
    return list(map(_decode, raws))


def _range(source: Any, group: int) -> Iterator[tuple[Any, Any]]:
    """``(key, value)`` of one group from a store or a store snapshot (one seek, then in order)."""
    return ((_decode(raw), pickle.loads(value)) for raw, value in _raw_range(source.iter(), group))


def _raw_range(it: Any, group: int) -> Iterator[tuple[bytes, bytes]]:
    """Encoded keys and pickled values of one group, from an iterator of a store (its view: as
    the store was when the iterator was made)."""
    it.seek(_prefix(group))
    while it.valid():
        raw = it.key()
        if raw[0] != group:
            break
        yield raw, it.value()
        it.next()


RANGE_PAIRS = 1024      # pairs a call takes from a group's range (SnapshotView.raw): about 0.2-0.4 ms holding the GIL


def _group_ranges(db: Any, groups: Iterable[int] = range(KEY_GROUPS)) -> dict[int, Any]:
    """An iterator of ``(encoded key, pickled value)`` pairs per key group of ``groups``, each
    bounded to its group and made now (rocksdict makes a RocksDB iterator at the call: a view of the store as it
    is then, as :meth:`SnapshotView._fresh`'s own), read in rocksdict's loop :data:`RANGE_PAIRS`
    at a time: a Python loop of ``key``, ``value``, ``next`` and an append a key was 37 % of the
    writer's time in a fill's whole checkpoints (py-spy, session 40); a whole group in one call
    held the GIL 40-50 ms at 10^7 keys (78 k keys a group), which the PE waited for. Not filling
    the block cache: a whole group read once would push out the blocks the PE reads."""
    from rocksdict import ReadOptions

    ranges = {}
    for g in groups:
        opts = ReadOptions()
        opts.fill_cache(False)
        opts.set_iterate_upper_bound(_prefix(g + 1))
        ranges[g] = db.items(from_key=_prefix(g), read_opt=opts)
    return ranges


def _by_group(keys: Iterable[bytes]) -> dict[int, list]:
    """Encoded keys by key group (a view's ``by_group``): an encoded key's first byte is its group,
    read for all of them in C (``bytes`` of ``map``), then :func:`groups.split_by_group`."""
    keys = list(keys)
    return split_by_group(keys, bytes(map(_first, keys)))


def _union_by_group(collections: list) -> dict[int, set]:
    """The union of ``collections`` of encoded keys, by key group, :data:`MERGE_KEYS` keys
    between two :func:`give_way` (a view's keys written since its snapshot, in the writer's
    thread). One ``set().union`` of them all and one :func:`_by_group` held the GIL 30 ms at
    10^5 keys and 0.4-1.0 s at 10^6 (in process): traced at 10^7 keys as the PE's stall of 20 ms
    in a steady checkpoint, 174 ms in one during the fill. Each collection's keys are listed in
    one C call first (a :class:`Written`'s dict may grow in another thread's merge)."""
    by: dict[int, set] = {}
    for keys in collections:
        keys = list(keys)
        for at in range(0, len(keys), MERGE_KEYS):
            part = keys[at:at + MERGE_KEYS]
            for group, some in _by_group(part).items():
                held = by.get(group)
                if held is None:
                    by[group] = set(some)
                else:
                    held.update(some)
            give_way()
    return by


def _groups(source: Any, it: Any = None) -> list[int]:
    """Non-empty key groups: a seek per group found (the store is ordered by group)."""
    found, it = [], it or source.iter()
    it.seek_to_first()
    while it.valid():
        g = it.key()[0]
        found.append(g)
        it.seek(_prefix(g + 1))             # groups are < 128: g + 1 is still one byte
    return found


def _shut(db: Any, path: str, flushing: list | None = None) -> None:
    """Close a store (or a view's) and remove its directory, in the caller's thread, once its
    last flush asked of :func:`_background` (``flushing``: its future) has ended.

    rocksdict's ``close`` flushes the memtable first (no option skips it): 0.4 s for 500 k keys
    written since the last flush. Closing in a thread of its own was tried (session 20) and
    wedged RocksDB: with dozens of stores freed at once (a test module's), every close waited on
    a condition for good, a store still in use among them. A store whose directory was removed
    under it (``remove_stores``, a test's temporary directory) fails its flush: nothing is left
    to keep, so that failure is logged, not raised."""
    if flushing and not threading.current_thread().name.startswith(BACKGROUND):
        wait(flushing, SHUT_WAIT_S)         # (collected in that thread: its flush is behind this)
    try:
        db.close()
    except Exception:
        logger.debug("closing the store in %s failed", path, exc_info=True)
    shutil.rmtree(path, ignore_errors=True)


_MISSING = object()     # a key the write-back buffer does not hold; a value the changes did not keep
_first = itemgetter(0)
_SECOND = itemgetter(1)
MERGE_KEYS = 4096       # keys :meth:`Written.merged` takes into its dict, :func:`_union_by_group` sorts by group,
                        # between two give_way (about 1 ms)
PUT_PART = 1024         # keys put one at a time into one part of a Written (what its reads may read again)


class Written:
    """The encoded keys a store wrote since a snapshot, each with its last pickled value (None:
    deleted; :data:`_MISSING`: not kept), as one dict (:meth:`merged`) made when read.

    The PE appends each batch's keys and values as they are (:meth:`add`: O(1) a batch, in its
    turn); the one dict is made from them by whoever reads it first (a checkpoint's writer, a
    view's reader, in their threads), under a lock, :data:`MERGE_KEYS` keys between two
    :func:`give_way`. A dict updated in the PE's turn, key by key, grew to every key of the
    interval: 0.25-0.36 us a key of a fill's 2.9 on ``disk`` (cache misses in a table of 10^6
    keys; in process), 10 % of the PE's samples in the table's fill at 10^6 (py-spy). A checkpoint
    that writes the groups whole (during a fill) reads no value of it, so that dict is not made.

    A read made of its dict sees the keys of every batch added before it (the PE adds a batch's
    keys before they reach the store, :meth:`DiskState.write_many`), which is what
    :meth:`DiskState._written_after` promises. A batch is two tuples, not lists: once a collection
    has seen that they hold only bytes (or None), the cyclic GC no longer visits them (a full
    collection that visits 10^6 keys holds the GIL for 300 ms); the dict, of bytes, is untracked."""

    __slots__ = ("_parts", "_merged", "_upto", "_at", "_lock", "most", "__weakref__")

    def __init__(self) -> None:
        self._parts: list = []              # (keys, values or None: not kept) a batch, in the order written
        self._merged: dict[bytes, Any] = {}
        self._upto = 0                      # the parts in _merged (each then None: its tuples let go)
        self._at = 0                        # and the keys of the next one already in it
        self._lock = threading.Lock()
        self.most = 0                       # keys added, each time it was: at least len(merged()), read
                                            # without making it (incremental._more_than)

    def add(self, keys: tuple, values: tuple | None) -> None:
        """A batch of encoded keys and their pickled values (None: not kept) written, in the PE's turn."""
        self._parts.append((keys, values))
        self.most += len(keys)

    def put(self, key: bytes, value: Any) -> None:
        """One key written (a put, a delete: None), in the PE's turn: into the last part while that
        is a dict of such keys under :data:`PUT_PART` (a part a key, a tuple of tuples, would be
        three tracked objects). Only the last part is ever put into, and only the PE adds parts."""
        parts = self._parts
        last = parts[-1] if parts else None
        if type(last) is not dict or len(last) >= PUT_PART:
            last = {}
            parts.append(last)
        last[key] = value
        self.most += 1

    def merged(self) -> dict[bytes, Any]:
        """``{encoded key: its last value}`` of every key added so far (any thread), about
        :data:`MERGE_KEYS` keys at a time (a batch larger than that in slices), each stretch under
        the lock, a :func:`give_way` between two with the lock let go (a PE that reads it waits
        for no writer's pause). A dict of keys put one at a time that was the last part when read
        is read again next time, as the PE may still put into it (at most :data:`PUT_PART` keys
        read again a call)."""
        while True:
            with self._lock:
                parts, merged, budget = self._parts, self._merged, MERGE_KEYS
                while budget > 0:
                    i = self._upto
                    if i >= len(parts):
                        return merged
                    part = parts[i]
                    if type(part) is dict:
                        last = i == len(parts) - 1      # asked before it is read: the PE may add to it
                        merged.update(part)
                        if last:
                            return merged
                        budget -= len(part)
                    else:
                        keys, values = part
                        a = self._at
                        b = min(len(keys), a + budget)
                        merged.update(dict.fromkeys(keys[a:b], _MISSING) if values is None else zip(keys[a:b], values[a:b]))
                        budget -= b - a
                        if b < len(keys):           # the rest of this batch in the next stretch
                            self._at = b
                            break
                        self._at = 0
                    parts[i] = None
                    self._upto = i + 1
            give_way()

    def let_go(self) -> None:
        """Its keys and values emptied a slice at a time (a checkpoint done with them:
        ``incremental._emptied``; a state that stopped naming them: :meth:`DiskState._named`),
        the batches never merged too (a checkpoint that wrote every group whole read none):
        10^6 keys of them dropped in one C call held the GIL 54 ms (in process)."""
        from .incremental import let_go

        with self._lock:
            parts, self._parts, self._upto, self._at = self._parts, [], 0, 0
            merged, self._merged = self._merged, {}
        let_go(merged)
        count = 0
        while parts:
            part = parts.pop()
            count += 0 if part is None else len(part) if type(part) is dict else len(part[0])
            del part
            if count >= MERGE_KEYS:
                give_way()
                count = 0

    def __len__(self) -> int:
        return len(self.merged())

    def __iter__(self) -> Iterator[bytes]:
        return iter(self.merged())

    def values(self) -> Any:
        return self.merged().values()


def _dict_of(keys: Any) -> dict:
    """A :class:`Changes`' keys as the dict of their values: a disk store's (:class:`Written`), or
    an empty one for anything else (a set of keys: values not kept)."""
    if type(keys) is Written:
        return keys.merged()
    return keys if type(keys) is dict else {}


def _let_go_of(state: "weakref.ref[DiskState]", changes: Changes | None) -> None:
    """A view's end, released or collected: its changes to its state, if it still lives."""
    st = state()
    if st is not None:
        st._let_go(changes)


class SnapshotView(StateView):
    """The store at a barrier, taken in O(1) on the PE's loop: a RocksDB snapshot (a sequence
    number) and a copy of the write-back buffer. A RocksDB checkpoint there flushed the memtable
    (every key written since the previous one) and opened every SST file's index and filter
    blocks, holding the GIL: the PE's stall at a checkpoint grew with the state (docs/state-log.md).

    Its reads come later, in the worker's writer thread. ``delta``, the keys a checkpoint writes
    as a delta: those written in the interval the snapshot closed with the value its
    :class:`Changes` hold, others from the buffer's copy, or the live store corrected as an
    iterator is (:meth:`_values`). rocksdict's snapshot iterators read the live store
    (0.3.29), so a group is iterated in the live store through one iterator the view makes at its first read (an iterator is a consistent view of
    the store as it was then; after :meth:`reads_whole` also one bounded to each group, made with
    it: :func:`_group_ranges`), and every key written between the snapshot and that iterator is
    read at the snapshot instead: the state's later :class:`Changes` and its keys since the last
    one, read after the iterator is made, hold every write it sees. Before a group is replaced
    or dropped whole (a rescale while this view is being written) the state pins the view
    (:meth:`DiskState._pin_views`): :data:`PIN_READS` iterators made then, for the reads that
    need an iterator from then on (the one it made before still sees the store as it was),
    corrected as any other by the keys written since the snapshot (read later: a superset of
    those written until the pin). A RocksDB checkpoint there flushed the memtable, and a copy
    of the keys written since, in the PE's turn: 0.1-0.6 s right after a fill of 10^5-10^6 keys.

    ``taking``: a rescale's take of those key groups (:meth:`DiskState.take_groups`): the
    iterator is made here, before the store drops them (O(1): a RocksDB iterator pins the
    memtables and files as they are), and the buffer's copy holds only their keys. Such a view
    never makes another iterator (the live store no longer has its groups): its groups are read
    one at a time, when the part is packed."""

    def __init__(self, state: "DiskState", changes: Changes | None, taking: set[int] | None = None) -> None:
        self.changes = changes
        self._state = state
        pending = state._pending            # writes not yet in the store: they win over the snapshot
        self._buffered = dict(pending) if taking is None else {k: v for k, v in pending.items() if k[0] in taking}
        self._snap = state._db.snapshot()
        # dropped unreleased (a PE's snapshot that failed at a later operator), the view goes with its
        # snapshot (the state holds its views weakly) and its changes still reach the next checkpoint
        self._end = weakref.finalize(self, _let_go_of, weakref.ref(state), changes)
        self._end.atexit = False
        self._pinned: list | None = None    # iterators made at a pin (a drop's), not in use
        self._cursor: tuple[Any, dict] | None = None    # (iterator, {group: keys read at the snapshot})
        self._ranges: dict[int, Any] = {}   # per group, made with the cursor: raw's first read of each (_group_ranges)
        self._whole_reads: bool | set[int] = False      # reads_whole() (all) or reads_full(groups): the cursor's _ranges
        self._busy = False                  # a read is using the cursor (a generator not done)
        self._taken = taking is not None
        if self._taken:                     # (a few microseconds an iterator: 64 groups 0.2-0.7 ms)
            self._cursor = (state._db.iter(), self.by_group(self._buffered))
            self._ranges = _group_ranges(state._db, sorted(taking))

    @property
    def lazy(self) -> bool:
        """It may still read with an iterator made after its snapshot (its first read, or one
        while another is in use): the journal must keep the keys written since it."""
        return self._snap is not None and not self._taken

    @property
    def unpinned(self) -> bool:
        """It may still make an iterator of the live store: a whole-group change must pin it first."""
        return self.lazy and self._pinned is None

    @contextlib.contextmanager
    def _reading(self) -> Iterator[tuple[Any, dict]]:
        """The view's iterator and the keys, by group, to read at the snapshot instead, for one
        read: made at the first read and kept (another pair while a read holds the first; after
        a pin, one of the pin's, given back when the read ends)."""
        if self._cursor is not None and not self._busy:
            cursor, pool = self._cursor, None
        elif self._taken:
            raise RuntimeError("a take's key groups are read one at a time: the store no longer holds them")
        else:
            cursor, pool, ranges = self._fresh()
            if self._cursor is None:
                self._cursor, pool, self._ranges = cursor, None, ranges
        shared = cursor is self._cursor
        self._busy |= shared
        try:
            yield cursor
        finally:
            if shared:
                self._busy = False
            elif pool is not None:
                pool.append(cursor[0])

    def _fresh(self) -> tuple[tuple[Any, dict], list | None, dict[int, Any]]:
        """An iterator and the keys written since the snapshot, read after it: a pin (and the drop
        after it) that came later is not in the iterator's view. With the pool it came from (a
        pin's), to give it back to, and (the view's first cursor, not a pin's, after
        :meth:`reads_whole`) an iterator per group made with it (:func:`_group_ranges`), which
        the same keys correct."""
        pool, ranges = self._pinned, {}
        if pool is None:
            it = self._state._db.iter()
            if self._cursor is None and self._whole_reads:
                whole = self._whole_reads
                ranges = _group_ranges(self._state._db, *(() if whole is True else (sorted(whole),)))
            pool = self._pinned
        if pool is not None:
            if not pool:
                raise RuntimeError(f"more than {PIN_READS} reads at once of a view pinned by a drop")
            it, ranges = pool.pop(), {}
        return (it, _union_by_group([*self._state._written_after(self.changes.seq), self._buffered])), pool, ranges

    def reads_whole(self) -> None:
        """Its first cursor comes with an iterator per group (:func:`_group_ranges`): 128
        iterators made, each seeking its group, 0.3-1.5 ms at 10^6 keys, which a steady
        checkpoint (deltas and a group or two whole) would pay for nothing."""
        self._whole_reads = True

    def reads_full(self, groups: Iterable[int]) -> None:
        """The groups a checkpoint may write whole (a steady one: a group or two, their chains'
        turns) are read from an iterator bounded to each, made with the cursor (:func:`_group_ranges`),
        :data:`RANGE_PAIRS` a call, as after :meth:`reads_whole`; read through the cursor they cost
        three calls into the iterator and an append a key in the writer's thread (at 10^7 keys
        78,000 keys a group, each call a hand-over of the GIL the PE waited on: docs/state-log.md,
        session 55). The writer names them after its first read (the view's groups), so a cursor
        made then is let go and the next read makes one with their ranges: the keys written since
        the snapshot are read after the iterator is made, as :meth:`_fresh`'s always are. Not on a
        pinned view (a drop came: its iterators are the pin's) nor a take's (made with its ranges)."""
        wanted = set(groups)
        if not wanted or self._whole_reads is True or not self.unpinned or self._busy:
            return
        self._whole_reads = wanted
        self._cursor, self._ranges = None, {}

    def _at(self, raw: bytes) -> bytes | None:
        """The pickled value of an encoded key at the snapshot, None when it had none."""
        value = self._buffered.get(raw, _MISSING)
        if value is not _MISSING:
            return value
        try:
            return self._snap[raw]
        except Exception as exc:            # rocksdict raises a bare Exception for a missing key
            if str(exc) != "key not found":
                raise
            return None

    def groups(self) -> list[int]:
        """The non-empty key groups (of some only, with a key of each: :meth:`first_keys`)."""
        with self._reading() as (it, changed):
            return [g for g in sorted(set(_groups(None, it)) | set(changed))   # unchanged keys: it had them
                    if g not in changed or any(True for _ in self._items(g, changed[g], it))]

    def first_keys(self, among: Iterable[int]) -> dict[int, Any]:
        """A key of each non-empty key group of ``among``, in group order (a seek each, its value
        not read): a take's groups and the key each part names (``groups.take_groups``) in one
        pass, where the take sought each group twice and unpickled its first value."""
        out = {}
        with self._reading() as (it, changed):
            for g in sorted(set(among)):
                raw = next((raw for raw, _value in self._items(g, changed.get(g, ()), it)), None)
                if raw is not None:
                    out[g] = _decode(raw)
        return out

    def items(self, group: int) -> Iterator[tuple[Any, Any]]:
        """:meth:`chunks`' entries, one after the other; the first read alone (a reader after a
        key of the group reads no more)."""
        for chunk in self.chunks(group, first=1):
            yield from chunk.items()

    def chunks(self, group: int, first: int = PACK_CHUNK) -> Iterator[dict]:
        """:meth:`_items` decoded, as dicts of at most :data:`base.PACK_CHUNK` entries (``first``
        in the first) built in one loop over the iterator, an int key decoded inline: the
        checkpoint writer reads every key of a full file here, sharing the GIL with the PE (three
        generators and a call per key were a third of its reading; then a generator step, a
        tuple and ``valid()`` per key)."""
        loads = pickle.loads
        with self._reading() as (it, changed):
            later = set(changed.get(group, ()))     # written since the snapshot: read at it, below
            it.seek(_GROUP[group])
            key, value, step = it.key, it.value, it.next
            chunk, room = {}, first
            while True:
                raw = key()                 # None once past the end: no valid() call per key
                if raw is None or raw[0] != group:
                    break
                if raw not in later:
                    chunk[int(raw[2:]) if raw[1] == _INT else _decode(raw)] = loads(value())
                    room -= 1
                    if not room:
                        yield chunk
                        chunk, room = {}, PACK_CHUNK
                step()
            for raw in later:
                at = self._at(raw)
                if at is not None:
                    chunk[_decode(raw)] = loads(at)
                    room -= 1
                    if not room:
                        yield chunk
                        chunk, room = {}, PACK_CHUNK
            if chunk:
                yield chunk

    def _items(self, group: int, changed: Iterable[bytes], it: Any) -> Iterator[tuple[bytes, bytes]]:
        """The group's encoded keys and pickled values at the snapshot: the iterator's but
        ``changed`` (written since the snapshot), those read at the snapshot."""
        changed = set(changed)
        for raw, value in _raw_range(it, group):
            if raw not in changed:
                yield raw, value
        for raw in changed:
            value = self._at(raw)
            if value is not None:
                yield raw, value

    def raw(self, group: int) -> list[tuple[bytes, bytes]]:
        """The group's ``(encoded key, pickled value)`` pairs at the view, in key order (a
        rescale's part between two disk stores, :class:`ViewGroup`; a checkpoint's full file,
        :meth:`full`): the iterator's bytes as they are, nothing decoded or unpickled."""
        pairs: list[tuple[bytes, bytes]] = []
        with self._reading() as (it, changed):
            later = set(changed.get(group, ()))
            cursor = self._cursor
            ranges = self._ranges.pop(group, None) if cursor is not None and it is cursor[0] else None
            if ranges is not None:          # made with this cursor, read once: in rocksdict's loop
                while True:                 # RANGE_PAIRS a call: the PE has the GIL between two
                    give_way()              # and its turns go first (a group whole: 78 k keys at 10^7)
                    chunk = list(islice(ranges, RANGE_PAIRS))
                    pairs += compress(chunk, map(not_, map(later.__contains__, map(_first, chunk)))) if later else chunk
                    if len(chunk) < RANGE_PAIRS:
                        break
            else:
                it.seek(_GROUP[group])
                key, value, step, add = it.key, it.value, it.next, pairs.append
                while True:                 # three calls into the iterator and an append a key
                    raw = key()
                    if raw is None or raw[0] != group:
                        break
                    if raw not in later:
                        add((raw, value()))
                    step()
            at = [(raw, v) for raw in later if (v := self._at(raw)) is not None]
        return _merged(pairs, _sorted(at)) if at else pairs     # written since: into the order

    def full(self, group: int) -> tuple[bytes, int, Any]:
        """A checkpoint's full file of the group: its :meth:`raw` bytes as a rescale's part
        pickles them (:class:`RawPart`), which a restore into a disk store writes into its SST
        file as they are and :func:`base.unpack_group` reads as the group's dict. Decoding every
        key and unpickling every value (:meth:`chunks`) to pickle them again cost the writer 3.3 s
        beside the PE for 10^6 keys, this 1.0-1.4 s and 0.4-0.5 s compressing without the GIL; the
        files 11.5 MB against 34.6 (docs/state-log.md, session 32)."""
        pairs = self.raw(group)
        if len(pairs) < RAW_FULL_MIN:       # as dicts: the raw form's header outweighs a few keys
            return pack_chunks([RawEntries(list(map(_first, pairs)), list(map(_SECOND, pairs))).decoded()])
        return _full_file(group, _pack_raw(pairs)), len(pairs), _decode(pairs[0][0])

    by_group = staticmethod(_by_group)

    def delta(self, group: int, keys: Iterable[bytes]) -> tuple["RawDelta", tuple]:
        """The keys' values at the snapshot as the store holds them (:class:`RawDelta`: the keys
        decoded, by ``map`` in C for ints and strs; the values as pickled, nothing unpickled).
        Unpickling each value to pickle it again was a third of the writer's time beside the PE at
        a steady checkpoint (docs/state-log.md, session 33). Read :data:`base.PACK_CHUNK` keys a call
        (:meth:`_values`): one ``map`` over a group's 20,000 keys changed (the first checkpoint
        after a rescale at 10^7 keys) held the GIL through 20,000 snapshot reads."""
        keys, changes = list(keys), self.changes
        # the values the snapshot's Changes hold, unless the group was replaced whole (a drop, an
        # import) in its interval: a key written before that holds a value the group no longer has
        own = _dict_of(changes.keys) if changes is not None and group not in changes.whole else {}
        values: list = []
        for i in range(0, len(keys), PACK_CHUNK):       # the PE's thread gets the GIL between two
            values += self._values(keys[i:i + PACK_CHUNK], own)
        return RawDelta(_decode_all(keys), values), ()

    def _values(self, keys: list[bytes], own: dict) -> list:
        """The pickled values of ``keys`` at the snapshot, None for a deleted one. Those written in
        the interval the snapshot closed from ``own``, its :class:`Changes`' keys, which hold each
        one's last value (a steady checkpoint's every delta key: no read at all); then the
        buffer's copy; then one multi-get of the live store, which RocksDB reads with the GIL let
        go (a snapshot read a key, through ``map`` in C, held it for every 1,024: 5-7 ms a call at
        10^7 keys, the writer's longest holds beside the PE, docs/state-log.md), and the keys written
        since the snapshot read at it instead (:meth:`_since`). At the snapshot, a read a key: a
        view pinned (a group dropped or replaced whole in the live store) or a take's."""
        raws = list(map(own.get, keys, repeat(_MISSING)))
        unread = list(compress(range(len(keys)), map(is_, raws, repeat(_MISSING))))
        if unread and self._buffered:
            buffered = self._buffered.get
            for i in unread:
                raws[i] = buffered(keys[i], _MISSING)
            unread = [i for i in unread if raws[i] is _MISSING]
        if not unread:
            return raws
        rest = list(map(keys.__getitem__, unread))
        try:
            got = self._state._db.get(rest) if self.unpinned else None
            if got is not None and self._pinned is None:    # pinned meanwhile: the drop may be in what it read
                for i in self._since(rest):
                    got[i] = self._at(rest[i])
            else:
                got = list(map(self._snap.__getitem__, rest))
        except Exception:                   # a key the snapshot has not (rocksdict raises a bare Exception)
            got = list(map(self._at, rest))
        for i, raw in zip(unread, got):
            raws[i] = raw
        return raws

    def _since(self, keys: list[bytes]) -> list[int]:
        """The indices of ``keys`` written after the snapshot (:meth:`DiskState._written_after`),
        read after the live store was: a superset of those it had newer; tested by ``map`` in C."""
        written = self._state._written_after(self.changes.seq)
        hits = list(map(written[0].__contains__, keys))
        for more in written[1:]:
            hits = list(map(or_, hits, map(more.__contains__, keys)))
        return list(compress(range(len(keys)), hits))

    def _pin(self, iterators: list) -> None:
        self._pinned = iterators

    def release(self) -> None:
        """Let go of the snapshot, and of the keys written before it here (in the writer's
        thread: freeing 1 % of 10^6 keys took a millisecond on the PE's loop at the next barrier).
        Its changes, if no checkpoint took them, go with the next snapshot's (``KeyedState._let_go``)."""
        self._end()
        self._snap = self._pinned = self._cursor = self.changes = None
        self._buffered, self._ranges = {}, {}


class ViewGroup:
    """One key group of a take's view, read when iterated (a group taken by
    :meth:`DiskState.take_groups`: its keys and values, as ``{key: value}`` would give them; the
    view lives as long as this)."""

    def __init__(self, view: SnapshotView, group: int, first: Any) -> None:
        self.view, self.group, self.first = view, group, first

    def first_key(self) -> Any:
        """A key of it (read at the take: ``groups.take_groups`` names it, without reading the rest)."""
        return self.first

    def __iter__(self) -> Iterator[Any]:
        return (key for key, _value in self.items())

    def items(self) -> Iterator[tuple[Any, Any]]:
        return self.view.items(self.group)

    def packed(self) -> tuple[Callable, tuple]:
        """How a rescale's part pickles it (``groups.PackedOnPickle``): the store's own bytes, in
        key order (:func:`_pack_raw`), for the receiving disk store to write into its SST file as
        they are (:func:`prepare_group`). Decoding every key and unpickling every value here,
        then encoding and pickling them again there and sorting them, made a Replicate at 10^7
        keys take 33-41 s to get its 64 groups to the copy, a part after another; the stream
        behind the copy, which held their tuples meanwhile, stopped 0.4-0.8 s at a time
        (docs/state-log.md, session 31)."""
        return RawPart(self.group, _pack_raw(self.view.raw(self.group))).__reduce__()


def _full_file(group: int, packed: bytes) -> bytes:
    """A checkpoint's full file of a group as :func:`_pack_raw` packed it (:meth:`SnapshotView.full`);
    a rescale's part carries the same ``packed`` bytes, which its receiver keeps as that file."""
    return pickle.dumps(RawPart(group, packed), _PICKLE)


class RawPart:
    """A key group as a disk store holds it, pickled (:func:`_pack_raw`'s bytes): a rescale's part
    (:meth:`ViewGroup.packed`) and a checkpoint's full file (:meth:`SnapshotView.full`) alike; it
    unpickles through :func:`_unpickled_raw`."""

    __slots__ = ("group", "packed")

    def __init__(self, group: int, packed: bytes) -> None:
        self.group, self.packed = group, packed

    def __reduce__(self):
        return _unpickled_raw, (self.group, self.packed)


class RawDelta:
    """A checkpoint's delta of a disk view's group (:meth:`SnapshotView.delta`): its keys, and
    their values at the snapshot as the store holds them (pickled; None where the key was
    deleted). Its length is the keys put. Pickled as it is (``incremental.pack_delta``), it
    unpickles through :func:`_unpickled_delta` as any delta does, ``(puts, deleted keys)``, in the
    restore's thread (off the PE's loop). The keys go decoded: encoded, each a ``bytes`` of its
    own, they made the delta 1.3-1.4x the bytes of the group's dict compressed (ints; 1.02-1.08x
    decoded), past the size a ``.state`` file holds (``incremental.PACK_DELTA``) at 10^6 keys."""

    __slots__ = ("keys", "values", "puts")

    def __init__(self, keys: list, values: list[bytes | None]) -> None:
        self.keys, self.values = keys, values
        self.puts = len(values) - values.count(None)

    def __len__(self) -> int:
        return self.puts

    def __reduce__(self):
        return _unpickled_delta, (self.keys, self.values)


def _unpickled_delta(keys: list, values: list[bytes | None]) -> tuple[dict, list]:
    """:class:`RawDelta` unpickled: ``({key: value} put, [key] deleted)``."""
    if None not in values:
        return dict(zip(keys, map(pickle.loads, values))), []
    return ({k: pickle.loads(v) for k, v in zip(keys, values) if v is not None},
            [k for k, v in zip(keys, values) if v is None])


RAW_FULL_MIN = 16       # a group with fewer keys is a full file of pickled dicts (SnapshotView.full): its
                        # raw file was 1.13x their bytes at 7 keys, 0.82x at 15, 0.54x at 46
RAW_CHUNK = 8192        # pairs written to an SST file in one C call (about a millisecond)
RAW_LEVEL = 1           # zlib's level for them: each value's pickle repeats its header, and level 1
                        # takes 57.7 MB of 10^6 keys to 11.5 in 0.5 s of CPU, the GIL let go (6: 9.9 MB, 1.4 s)


def _merged(pairs: list, at: list) -> list:
    """Sorted ``at`` merged into sorted ``pairs`` (no key in both): a bisect and two slices a pair
    of ``at``, the runs between them copied in C. ``heapq.merge`` stepped through every pair in
    Python, a group's 78,000 at 10^7 keys for a thousand written since the snapshot: a fifth of
    the writer's time in :meth:`SnapshotView.raw` (docs/state-log.md, session 39)."""
    out, lo, find = [], 0, bisect.bisect_left
    for pair in at:
        i = find(pairs, pair, lo)
        out += pairs[lo:i]
        out.append(pair)
        lo = i
    out += pairs[lo:]
    return out


def _pack_raw(pairs: list[tuple[bytes, bytes]]) -> bytes:
    """Encoded keys and pickled values as pickled ``(keys, values)`` chunks of
    :data:`base.PACK_CHUNK` pairs, one after the other (each a short hold of the GIL beside the
    PE, as a full file's pickled dicts), compressed (zlib, :data:`RAW_LEVEL`: a stored value is
    its pickle, header and all; as they are they were 3x the bytes of the group pickled as a dict)."""
    out = []
    for i in range(0, max(len(pairs), 1), PACK_CHUNK):
        give_way()                          # a writer's: the PEs' turns first (foreground.py)
        c = pairs[i:i + PACK_CHUNK]
        out.append(pickle.dumps((list(map(_first, c)), list(map(_SECOND, c))), _PICKLE))
    return zlib.compress(b"".join(out), RAW_LEVEL)


def _unpack_raw(data: bytes) -> tuple[list[bytes], list[bytes]]:
    """:func:`_pack_raw`'s keys and values, the chunks joined."""
    data = zlib.decompress(data)
    f, keys, values = io.BytesIO(data), [], []
    while f.tell() < len(data):
        k, v = pickle.load(f)
        keys += k
        values += v
    return keys, values


class RawEntries(Mapping):
    """A key group as a disk store holds it: encoded keys in order and their pickled values
    (:meth:`ViewGroup.packed`). :func:`prepare_group` takes them as they are; as a mapping they
    are decoded and unpickled once, when first read (any other reader)."""

    def __init__(self, keys: list[bytes], values: list[bytes]) -> None:
        self.keys_, self.values_ = keys, values
        self._dict: dict | None = None

    def decoded(self) -> dict:
        if self._dict is None:
            self._dict = dict(zip(_decode_all(self.keys_), map(pickle.loads, self.values_)))
        return self._dict

    def __getitem__(self, key: Any) -> Any:
        return self.decoded()[key]

    def __iter__(self) -> Iterator[Any]:
        return iter(self.decoded())

    def __len__(self) -> int:
        return len(self.keys_)

    def __reduce__(self):
        return dict, (self.decoded(),)


def _unpickled_raw(group: int, packed: bytes) -> Any:
    """:class:`RawPart` unpickled: made ready by the receiving store's ``prepare`` (within
    ``groups.loads_prepared`` or ``base.unpack_prepared``): as they are by this module's
    :func:`prepare_group`, decoded for any other; without one, the group's dict."""
    raw = RawEntries(*_unpack_raw(packed))
    prepare = _PREPARE.get()
    if prepare is None:
        return raw.decoded()
    prepared = prepare(group, raw if getattr(prepare, "func", prepare) is prepare_group else raw.decoded())
    return keep_received(prepared, lambda: _full_file(group, packed))     # a rescale's part keeps its bytes


class PreparedGroup(PreparedEntries):
    """One key group's entries made ready for a store off the PE's turn (:func:`prepare_group`, in
    a lazy restore's loader thread): every key encoded and value pickled, and (from
    :data:`INGEST_KEYS` keys) sorted and written into an SST file beside the stores; the hashes of the
    encoded keys for the "may be stored" bitmap. The turn that installs it
    (:meth:`DiskState.import_groups`) ingests the file, or writes the pairs in one batch: no key
    is encoded, no value pickled there. Before, that turn encoded and pickled the whole group:
    214-459 ms for the 78,000 keys of a group at 10^7 (each group a stall of the stream).

    As a mapping it is the entries (a backend that does not take it reads them as a dict);
    it pickles as that dict. Its file goes with it if it is never installed."""

    def __init__(self, group: int, entries: dict, pairs: list[tuple[bytes, bytes]], hashes: list[int],
                 sst: str | None, marks: tuple | None = None) -> None:
        super().__init__(group, entries)
        self.pairs, self.hashes, self.sst = pairs, hashes, sst
        self.marks = marks      # MayBeStored.marks: the filter's update at that mask, in numpy
        self._end = weakref.finalize(self, shutil.rmtree, os.path.dirname(sst), True) if sst else None

    def first_key(self) -> Any:
        entries = self.entries
        return _decode(entries.keys_[0]) if type(entries) is RawEntries else next(iter(entries))

    def discard(self) -> None:
        """Its file removed (ingested: the store holds its own link; or not used)."""
        if self._end is not None:
            self._end()


_BACKGROUND: list[ThreadPoolExecutor] = []
BACKGROUND = "disk-state-background"
SHUT_WAIT_S = 60.0      # the longest a store's close waits for its flush in _background


def _background() -> ThreadPoolExecutor:
    """The thread doing the stores' file work that must not stop a PE's turn or the worker's loop:
    the flush after a drop (:meth:`DiskState._drop`), an installed group's SST directory
    removed (:meth:`PreparedGroup.discard`), the count of the keys written since a snapshot and
    their let-go when a state stops naming them (:meth:`DiskState._named`). rocksdict's ``flush(False)`` lets the GIL go but
    waits until a flush would not stall writes (RocksDB's ``allow_write_stall`` off, its default):
    on the loop, a retired copy's flush stopped it 321 ms (a Release at 10^7 keys, traced), a
    source there with it; 109 ms in process right after a fill. One thread for every store:
    each store's own work stays in order, and its close waits for its flush (:func:`_shut`)."""
    if not _BACKGROUND:
        _BACKGROUND.append(ThreadPoolExecutor(1, thread_name_prefix=BACKGROUND))
    return _BACKGROUND[0]


os.register_at_fork(after_in_child=_BACKGROUND.clear)     # a forked child has not the parent's thread


def _flush(db: Any, path: str) -> None:
    """A store's memtable flushed, in :func:`_background`, waited for there (the GIL let go): its
    future's end is the flush's, which a close and a group given back wait for. A store closed
    or removed meanwhile (a test's directory) fails it: logged."""
    try:
        db.flush(True)
    except Exception:
        logger.debug("flushing the store in %s failed", path, exc_info=True)


SORT_RUN = 4096          # pairs sorted in one call (it holds the GIL) before the runs are merged


def _sorted(pairs: list) -> list:
    """``sorted(pairs)`` in runs of :data:`SORT_RUN`, merged in Python: one ``sorted`` of a group's
    78,000 pairs held the GIL for 342 ms (load 10), a stall of the PE's thread beside this one;
    a merge step is bytecode, so the interpreter hands the GIL over every switch interval."""
    if len(pairs) <= SORT_RUN:
        return sorted(pairs)
    return list(heapq.merge(*(sorted(pairs[i:i + SORT_RUN]) for i in range(0, len(pairs), SORT_RUN))))


def prepare_group(group: int, entries: Mapping, where: str | None = None,
                  cache_bytes: int | None = None) -> PreparedGroup:
    """``entries`` of key group ``group`` made ready for :meth:`DiskState.import_groups` in the
    calling thread (:class:`PreparedGroup`): from :data:`INGEST_KEYS` keys, its SST file in a
    directory of its own under ``where`` (the worker's state directory: the same file system as
    the stores, so an ingest links the file, never copies it), and the bitmap's update for a
    store of ``cache_bytes`` (the worker's ``pescheduler.state.cache``). Every key is checked to
    be of ``group`` (the turn checked one). :class:`RawEntries` (another disk store's bytes, in
    key order) are taken as they are: only their ends are checked, nothing encoded or sorted."""
    from rocksdict import Options, SstFileWriter

    if type(entries) is RawEntries:         # another disk store's bytes, in key order (ViewGroup.packed)
        keys = entries.keys_
        stray = next((raw for raw in keys[:1] + keys[-1:] if raw[0] != group), None)   # in order: the ends say
        pairs = list(zip(keys, entries.values_))
        ordered = True
    else:
        dumps = pickle.dumps
        pairs = [(_encode(key), dumps(value, _PICKLE)) for key, value in entries.items()]
        stray = next((raw for raw, _ in pairs if raw[0] != group), None)
        ordered = False
    if stray is not None:
        raise ValueError(f"key {_decode(stray)!r} is in key group {stray[0]}, not {group}")
    hashes = list(map(hash, map(_first, pairs)))
    np = _numpy()
    marks = MayBeStored.marks(np, hashes, cache_bytes) if np is not None and cache_bytes is not None and hashes else None
    sst = None
    if len(pairs) >= INGEST_KEYS:          # an SST file takes its keys in order (a write batch in any)
        if not ordered:
            pairs = _sorted(pairs)
        if where is not None:
            os.makedirs(where, exist_ok=True)
        sst = os.path.join(tempfile.mkdtemp(prefix=f"g{group:03d}-", dir=where), "group.sst")
        writer = SstFileWriter(Options(raw_mode=True))
        writer.open(sst)
        for i in range(0, len(pairs), RAW_CHUNK):   # in C, a chunk a call: the GIL may change hands between
            chunk = pairs[i:i + RAW_CHUNK]
            deque(map(writer.__setitem__, map(_first, chunk), map(_SECOND, chunk)), maxlen=0)
        writer.finish()
    return PreparedGroup(group, entries, pairs, hashes, sst, marks)


class DiskState(KeyedState):
    """RocksDB in ``path`` with ``cache_bytes`` of memory; see the module docstring.

    ``path`` is this instance's own directory: the store in ``path/db``, views beside it. It
    is the operator's working set (durable copies are the checkpoint's), removed by
    :meth:`close` or, at the latest, when the state is garbage-collected or its process exits.
    """

    backend = "disk"
    reads_in_batches = True

    def __init__(self, path: str, cache_bytes: int) -> None:
        from rocksdict import BlockBasedOptions, Cache, Options, Rdict, WriteBufferManager, WriteOptions

        # One cache of the whole budget: the memtables are charged to it (the write buffer
        # manager's dummy entries), up to half; the blocks have the rest. A cache of half the
        # budget, with the memtables charged to it too, held 256 MB in all at a 512 MB budget.
        cache = Cache(max(cache_bytes, 2 << 20))
        table = BlockBasedOptions()
        table.set_block_cache(cache)
        table.set_bloom_filter(10, False)      # a get of a key not in an SST file reads no block of it
        opts = Options(raw_mode=True)
        opts.create_if_missing(True)
        opts.set_block_based_table_factory(table)
        opts.set_write_buffer_manager(WriteBufferManager.new_write_buffer_manager_with_cache(
            max(cache_bytes // 2, 1 << 20), False, cache))
        opts.set_write_buffer_size(max(cache_bytes // 8, 1 << 20))
        # A Bloom filter of whole keys in each memtable: a get of a key it does not hold skips its
        # skip list (a steady batch's keys, read at random from 10^7, are mostly in SST files)
        opts.set_memtable_prefix_bloom_ratio(MEMTABLE_BLOOM)
        opts.set_memtable_whole_key_filtering(True)
        self.path = path
        self._db = Rdict(os.path.join(path, "db"), opts)
        no_wal = WriteOptions()
        no_wal.disable_wal = True           # the checkpoint is the durability (module docstring)
        self._db.set_write_options(no_wal)
        self._pending: dict[bytes, bytes | None] = {}   # the write-back buffer: None, a delete
        self._encoded: dict[Any, bytes] = {}    # key -> _encode(key): equal keys share one entry
        self._stored = MayBeStored(cache_bytes)     # of every encoded key written to the store
        self._unmarked: list[bytes] = []    # keys written without their bits (not read first), set at the flush
        self._read: tuple | None = None     # the last get_many's (keys, encoded, bits) (write_many's)
        self._warming = False               # its pages being faulted in by a thread (_populate)
        self._flushing: list[Future] = []      # the last flush asked of _background, until it ends
        self._end = weakref.finalize(self, _shut, self._db, path, self._flushing)
        # encoded keys put or deleted since the snapshot, each with its last pickled value (None:
        # deleted; _MISSING: not kept), so that a checkpoint's delta of them reads nothing
        # (SnapshotView._values). A dict of bytes is not tracked by the cyclic GC, a set is, and a
        # full collection visits each of its keys (a set of 10^6 keys: 300 ms holding the GIL, L
        # 12; the dict: 1 ms). A Written: appended a batch at a time, one dict when read. Its
        # :class:`Changes` and the journal keep the same Written.
        self._dirty = Written()
        self._look = DIRTY_KEYS             # the dirty keys' count (as written) at which _named looks next
        self._merging: tuple | None = None  # (Written, its merge in the background) while _named waits
        # the values kept there, in bytes, at most a sixteenth of the cache an interval: past that
        # a key is kept as _MISSING (its delta reads it back), so a run without checkpoints, whose
        # snapshots never come, does not hold every value it wrote
        self._kept, self._keep = 0, max(cache_bytes // 16, 1 << 20)
        self._whole: set[int] = set()       # groups replaced whole since the snapshot
        self._views: weakref.WeakSet[SnapshotView] = weakref.WeakSet()   # weak: one dropped unreleased goes
        self._journal: list[Changes] = []     # snapshots' Changes after the oldest lazy view's
        # key groups the store holds no live key of: every group of a new store; a group dropped
        # by range, until a key of it is written (_flush) or it is installed. A group's SST file is
        # ingested only into one of them (_holds_nothing_of): asking the store instead, a seek over
        # a group just dropped stepped over each of its deleted keys (30-79 ms at 78,000 keys, the
        # Release's imports at 10^7, in the PE's turn)
        it = self._db.iter()
        it.seek_to_first()
        self._empty: set[int] = set() if it.valid() else set(range(KEY_GROUPS))
        del it
        self._track()

    def _key(self, key: Any) -> bytes:
        """``_encode(key)``, remembered for the next call naming it: correct for every key equal
        to it, since equal keys have one encoding. Bounded: forgotten all at once when full."""
        encoded = self._encoded
        k = encoded.get(key)
        if k is None:
            if len(encoded) >= ENCODED_KEYS:
                encoded.clear()
            k = encoded[key] = _encode(key)
        return k

    def _keys(self, keys: list) -> list[bytes]:
        """``[self._key(k) for k in keys]``, the keys not remembered encoded in one batch: their
        key groups by :func:`groups.key_groups` (numpy over the batch) where every one is a plain
        int, instead of ``key_group`` per key (a fill's every key is new: ``_encode``, and
        ``key_group`` in it, were a fifth of ``latest``'s reads on disk in process). Looked up,
        encoded and remembered by ``map`` in C when every key is new (a fill's batch) or known."""
        out = list(map(self._encoded.get, keys))
        if None not in out:
            return out
        every = out.count(None) == len(out)
        missing = range(len(keys)) if every else [i for i, k in enumerate(out) if k is None]
        fresh = keys if every else [keys[i] for i in missing]
        if len(fresh) >= 64 and set(map(type, fresh)) == {int}:
            encoded = list(map(_INT_KEY.__mod__, zip(key_groups(fresh), fresh)))
        else:
            encoded = list(map(_encode, fresh))
        remember = self._encoded if len(fresh) <= ENCODED_KEYS else {}
        if len(remember) + len(fresh) > ENCODED_KEYS:
            remember.clear()
        remember.update(zip(fresh, encoded))
        if every:
            return encoded
        for i, k in zip(missing, encoded):
            out[i] = k
        return out

    def get(self, key: Any, default: Any = None) -> Any:
        k = self._encoded.get(key) or self._key(key)
        raw = self._pending.get(k, _MISSING)
        if raw is _MISSING:
            if k not in self._stored:
                return default
            raw = self._db.get(k)
        return default if raw is None else pickle.loads(raw)

    def put(self, key: Any, value: Any) -> None:
        k = self._encoded.get(key) or self._key(key)
        pending = self._pending
        pending[k] = raw = pickle.dumps(value, _PICKLE)
        self._dirty.put(k, raw if self._keeps(len(raw)) else _MISSING)
        self._unmarked.append(k)
        if len(pending) >= FLUSH_KEYS:
            self._flush()

    def delete(self, key: Any) -> None:
        k = self._encoded.get(key) or self._key(key)
        self._dirty.put(k, None)
        pending = self._pending
        pending[k] = None
        if len(pending) >= FLUSH_KEYS:
            self._flush()

    def _keeps(self, size: int) -> bool:
        """Whether values of ``size`` bytes just written are kept in :attr:`_dirty` for the next
        checkpoint's deltas (counted): while this interval's are under :attr:`_keep` (the last
        batch may pass it), else its keys are named with :data:`_MISSING` and read back."""
        if self._kept >= self._keep:
            return False
        self._kept += size
        return True

    def get_many(self, keys: list) -> list:
        """The buffer first, then one multi-get for the rest (a get per key through the binding
        cost a call and a lookup each). By ``map`` in C and numpy: the buffer's lookups, the
        "may be stored" bits of the keys it has not (:class:`MayBeStored`), the unpickling; a
        Python step only for each key found."""
        pending, encoded = self._pending, self._keys(keys)
        raws = list(map(pending.get, encoded))              # None: not in the buffer, or deleted there
        unbuffered = list(map(pending.__contains__, encoded))
        unbuffered = list(map(not_, unbuffered)) if True in unbuffered else None
        bits = self._stored.bits_of(encoded)
        missed = self._stored.among(encoded, unbuffered, bits)
        self._read = (list(keys), encoded, bits)
        if missed:
            for i, raw in zip(missed, self._db.get([encoded[i] for i in missed])):
                raws[i] = raw
        out = [None] * len(keys)
        found = list(compress(range(len(raws)), raws))
        for i, value in zip(found, map(pickle.loads, compress(raws, raws))):
            out[i] = value
        return out

    def write_many(self, puts: Iterable[tuple[Any, Any]], deletes: Iterable[Any] = ()) -> None:
        """Into the write-back buffer, written in one batch once it is full: the keys encoded in
        a batch (:meth:`_keys`) and the values pickled by ``map``, the buffer and the changed keys
        updated in C (a store and a set add per key in Python were a fifth of a fill's time; then
        a comprehension calling a lookup and ``dumps`` per key). Keys the last :meth:`get_many` read,
        the same objects in its order (an operator's batch: read, then written back), come with
        their encodings and, from 64 keys, their "may be stored" bits as it made them (compared by
        identity, not ``==``: a numpy scalar against a tuple compares to an array), the bits set
        here in one numpy pass: encoded and hashed again, they cost a fill on ``disk`` 0.1 us a key
        of about 1.9 in the backend's calls (in process). Other keys' bits are set at the flush, in
        one pass over the buffer's (a batch of a few keys marked here would be a Python step a key)."""
        if type(puts) is not dict:
            puts = dict(puts)
        keys, (read, self._read) = list(puts), (self._read, None)
        same = read is not None and len(read[0]) == len(keys) and all(map(is_, read[0], keys))
        encoded = read[1] if same else self._keys(keys)     # the same objects: the read's encodings
        if same and read[2] is not None:        # and its bits, set here
            self._stored.add(encoded, read[2])
        else:                                   # bits set at the flush, in one pass over the buffer's keys
            self._unmarked += encoded
        pending, values = self._pending, list(map(pickle.dumps, puts.values(), repeat(_PICKLE)))
        pending.update(zip(encoded, values))
        self._dirty.add(tuple(encoded), tuple(values) if self._keeps(sum(map(len, values))) else None)
        if deletes:
            gone = self._keys(list(deletes))
            pending.update(dict.fromkeys(gone))         # None: a delete
            self._dirty.add(tuple(gone), (None,) * len(gone))
        if len(pending) >= FLUSH_KEYS:
            self._flush()

    def _flush(self) -> None:
        """The write-back buffer into the store, one write batch. No Python step per key: the puts
        go into the batch through ``map`` (a C loop calling the binding); the bits of keys written
        without them (not read first: :meth:`write_many`) go into the filter in one numpy pass
        (:meth:`MayBeStored.add`), before the write. A loop of ``batch.put`` and a bit set per key
        was 19 % of the PE's GIL in a fill at 10^6 keys (h31f's profile). The batch is in key order:
        RocksDB's memtable inserts keys in order from where the last one went (its skip list's
        splice), a random order searches from the top each time; a fill of 10^6 keys in one process
        spent 0.66 us a key in the write unsorted, 0.22 sorted (2.36 and 1.64 with the keys in a random
        order), the sort 0.12."""
        pending = self._pending
        if not pending:
            return
        from rocksdict import WriteBatch

        batch = WriteBatch(raw_mode=True)
        puts = pending
        if None in pending.values():        # deletes: rare (a scan in C finds none in a fill)
            puts = {k: raw for k, raw in pending.items() if raw is not None}
            deque(map(batch.delete, [k for k, raw in pending.items() if raw is None]), maxlen=0)
        keys = sorted(puts)
        deque(map(batch.put, keys, map(puts.__getitem__, keys)), maxlen=0)
        if self._unmarked:                  # (a batch read first has its bits: write_many)
            self._stored.add(self._unmarked)
            self._unmarked = []
        if self._empty and keys:            # the groups written into are no longer empty
            self._written_into(keys)
        self._db.write(batch)
        self._pending = {}
        if self._dirty.most > self._look:
            self._named()

    def _named(self) -> None:
        """Past :data:`DIRTY_KEYS` keys written since the snapshot, counted as written (a key
        written twice twice): the distinct ones counted in the :class:`Written`'s dict, made in
        the background thread (2^20 keys took 0.2-0.4 s: not in the PE's turn), and looked at at a
        flush once it is made. Past DIRTY_KEYS of them, no view reading the live store, the state
        stops naming them and the next checkpoint writes every group whole (a run without
        checkpoints, whose snapshots never come, kept every key it wrote). Fewer (a few keys
        written again and again: their deltas stay small), the next look comes DIRTY_KEYS writes
        later."""
        written, merging = self._dirty, self._merging
        if merging is None or merging[0] is not written:
            self._merging = (written, _background().submit(written.merged))
            return
        if not merging[1].done():
            return
        self._merging = None                # the keys it counted: those written since are the next look's
        counted = len(merging[1].result())
        del merging                         # (the future held the dict too)
        if counted > DIRTY_KEYS and not any(v.lazy for v in list(self._views)):
            self._whole.update(range(KEY_GROUPS))
            self._dirty, self._kept, self._look = Written(), 0, DIRTY_KEYS
            self._adopted.clear()           # the keys written since an import are not named either
            _background().submit(written.let_go)    # its 2^20 keys or more: 40 ms in one del, in process
        else:
            self._look = written.most + DIRTY_KEYS

    def _written_into(self, keys: list[bytes]) -> None:
        """The groups of :attr:`_empty` that sorted ``keys`` (encoded, each led by its group's
        byte) write into leave it: nothing to do while none of them is between the first key's
        group and the last's (a copy's own groups, each side of those it gave away), else their
        groups' bytes taken out of it in C (``map``), no call a key from Python."""
        low, high = keys[0][0], keys[-1][0]
        if not self._empty.isdisjoint(range(low, high + 1)):
            self._empty.difference_update(map(_first, keys))

    def items(self, group: int) -> Iterator[tuple[Any, Any]]:
        self._flush()
        return _range(self._db, group)

    def groups(self) -> list[int]:
        self._flush()
        return _groups(self._db)

    def snapshot(self) -> SnapshotView:
        """A RocksDB snapshot and a copy of the write-back buffer (:class:`SnapshotView`): no
        write into the store (a flush of the buffer held the GIL for 8-40 ms, growing with the
        memtable)."""
        changes = self._changes(self._dirty, self._whole)
        # a view's changes read once: the writer's thread may release it (changes None) meanwhile
        lazy = [c.seq for v in list(self._views) if v.lazy and (c := v.changes) is not None]
        # the journal before the swap: a view's reader copies the keys since first, then the journal
        self._journal = [c for c in self._journal if c.seq > min(lazy)] + [changes] if lazy else []
        self._dirty, self._whole, self._kept, self._look, self._merging = Written(), set(), 0, DIRTY_KEYS, None
        view = SnapshotView(self, changes)
        self._views.add(view)
        return view

    def _written_after(self, seq: int) -> list:
        """The collections of encoded keys written after snapshot ``seq`` (together a superset),
        for another thread while the PE writes: the dict of keys since the last snapshot first
        (the one a later snapshot swaps out, whole, into its Changes), then the journal's after
        ``seq`` (a snapshot extends it before it swaps those keys out). Each is a dict, made here
        (:meth:`Written.merged`), read in one C call."""
        return [self._dirty.merged(), *(_dict_of(c.keys) for c in list(self._journal) if c.seq > seq)]

    def _pin_views(self) -> None:
        """Before a group is dropped or replaced whole: views still reading the live store read
        iterators made now instead (O(1) each: an iterator pins the memtables and files as they
        are; only while a checkpoint's views are being written during a rescale). Neither a flush
        nor the keys written since: a view reads those at its snapshot, and learns them later."""
        for view in list(self._views):
            if view.unpinned:
                view._pin([self._db.iter() for _ in range(PIN_READS)])

    def changed(self) -> set[int]:
        return {k[0] for k in self._dirty.merged()} | self._whole     # derived here: a put adds to one set

    def drop_groups(self, groups: Iterable[int]) -> None:
        self._flush()
        self._drop(groups)

    def _drop(self, groups: Iterable[int]) -> None:
        """Groups out of the store by range (the write-back buffer holds none of their keys)."""
        self._pin_views()
        dropped = False
        for g in groups:
            self._db.delete_range(_prefix(g), _prefix(g + 1))
            self._replaced(g)
            self._empty.add(g)
            dropped = True
        if dropped:     # the range deletes out of the memtable: an SST file of these groups is
            self._flushing[:] = [_background().submit(_flush, self._db, self.path)]    # refused while there

    def take_groups(self, groups: Iterable[int]) -> dict[int, "ViewGroup"]:
        """Whole key groups out of the store without reading them here (a rescale's export, in
        the PE's turn): a view of them as they are (:class:`SnapshotView` with its iterator made
        now, and the write-back buffer's keys of those groups, which leave the buffer), read only
        when the part is packed, off the turn; the store drops them by range. A seek per group
        taken (is it empty?) and a pass over the buffer: nothing here reads the keys written
        since anything (a RocksDB checkpoint here flushed the memtable: 0.6-0.8 s right after a
        fill of 10^6 keys, docs/state-log.md)."""
        wanted = set(groups)
        view = SnapshotView(self, None, taking=wanted)
        firsts = view.first_keys(wanted)
        if not firsts:
            return {}
        pending, mine = self._pending, set(firsts)
        for k in [k for k in pending if k[0] in mine]:     # the view has them
            del pending[k]
        self._drop(list(firsts))
        return {g: ViewGroup(view, g, first) for g, first in firsts.items()}

    def import_groups(self, exported: dict) -> None:
        """As the contract's, and a :class:`PreparedGroup` installed as it is (:meth:`_install`)."""
        for g, data in exported.items():
            if type(data) is PreparedGroup:
                self._install(g, data)
            else:
                super().import_groups({g: data})

    def _install(self, group: int, prepared: PreparedGroup) -> None:
        """A group :func:`prepare_group` made ready, in the PE's turn: its SST file ingested when
        the store holds nothing of the group (a restored group, gated until now, or one a rescale
        took and gives back: O(1) in its keys, the file linked into the store), else its pairs in
        one write batch replacing the group (and when RocksDB refuses the file: the take's range
        deletes still in the memtable, their flush not done; before :meth:`_drop` flushed them,
        each group a Release gave back at 10^7 keys was written so, 46-58 ms in the turn); then
        its keys' bits. Views still reading the live store are pinned first, as for any
        whole-group change."""
        if prepared.group != group:
            raise ValueError(f"a prepared key group {prepared.group} given as group {group}")
        from rocksdict import IngestExternalFileOptions, WriteBatch

        if prepared.sst is not None and not self._warming:     # a large restore: the later groups' bits warm
            self._warming = True
            threading.Thread(target=_populate, args=(self._stored.bits,), name="disk-state-bitmap", daemon=True).start()
        self._pin_views()
        ingested = False
        if prepared.sst is not None and self._holds_nothing_of(group):
            opts = IngestExternalFileOptions()
            opts.set_move_files(True)
            opts.set_allow_blocking_flush(False)    # a flush needed (a range delete in the memtable): the batch
            try:
                self._db.ingest_external_file([prepared.sst], opts)
                ingested = True
            except Exception:
                logger.debug("ingesting key group %d failed: written as a batch", group, exc_info=True)
        if not ingested:
            self._flush()
            batch = WriteBatch(raw_mode=True)
            batch.delete_range(_prefix(group), _prefix(group + 1))
            for raw, value in prepared.pairs:
                batch.put(raw, value)
            self._db.write(batch)
        if prepared.sst is not None:        # its directory removed off the turn: 17 ms in the turn
            _background().submit(prepared.discard)  # beside RocksDB's flushes (10^7 keys, traced)
        self._emptied(group, not prepared.pairs)
        self._stored.add_marks(prepared.marks, prepared.hashes)
        self._replaced(group, prepared.received)    # a part's bytes, a restore's files: its next chain starts there

    def _holds_nothing_of(self, group: int) -> bool:
        """Neither the store (:attr:`_empty`) nor the write-back buffer (a pass over it: at most
        :data:`FLUSH_KEYS` keys) has a key of ``group``."""
        return group in self._empty and not any(raw[0] == group for raw in self._pending)

    def _put_group(self, group: int, entries: dict) -> None:
        """One write batch per group (a put per key through the binding was the cost of a restore)."""
        from rocksdict import WriteBatch

        first = next(iter(entries), None)     # one key checked: a group's keys come whole from export
        if first is not None and key_group(first) != group:
            raise ValueError(f"key {first!r} is in key group {key_group(first)}, not {group}")
        self._flush()
        self._pin_views()
        batch, dumps = WriteBatch(raw_mode=True), pickle.dumps
        batch.delete_range(_prefix(group), _prefix(group + 1))
        encoded = []
        for key, value in entries.items():
            k = _encode(key)
            batch.put(k, dumps(value, _PICKLE))
            encoded.append(k)
        self._db.write(batch)
        self._emptied(group, not encoded)
        self._stored.add(encoded)
        self._replaced(group)

    def _emptied(self, group: int, empty: bool) -> None:
        """Group ``group`` replaced whole: :attr:`_empty` names it when nothing replaced it."""
        if empty:
            self._empty.add(group)
        else:
            self._empty.discard(group)

    def retire(self) -> None:
        """Its operator is gone (a retired PE, stopped): nothing reads or writes the store again but
        views already taken from it. Every group leaves by range (views still reading the live store
        pinned first, as for any drop) and the memtable's flush is asked of :func:`_background` (on
        the worker's loop it waited for RocksDB 321 ms at 10^7 keys): the close, wherever the last
        reference goes (in whatever turn of whatever loop drops it), waits for that flush and has
        nothing to write. rocksdict's ``close`` flushes the memtable, and no option skips it:
        190-235 ms for 5 * 10^5 keys written since the last flush, 1-6 ms after this. A view
        taken before keeps reading what it saw (an iterator is a consistent view: the range
        deletes after it are not in it), so a deferred move's groups still pack after this."""
        self._pending = {}                  # views copied the buffer when they were taken
        self._drop(range(KEY_GROUPS))       # and the memtable flushed, in _background

    def close(self) -> None:
        """Close the store and remove its directory (views taken from it end first)."""
        self._pending = {}
        for view in list(self._views):
            view.release()
        self._views.clear()
        self._end()
