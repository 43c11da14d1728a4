"""Asynchronous, incremental checkpoints of keyed state, written by the worker (docs/checkpoints.md).

At a barrier a KEYED operator's snapshot holds a :class:`GroupsSnapshot`: a
consistent view of its state (``KeyedState.snapshot``: O(key groups) for
``memory``, a RocksDB checkpoint for ``disk``) and the keys written since the
previous one (:class:`~pescheduler.state.base.Changes`). Nothing is copied
on the PE's loop. The rest of the PE's snapshot is pickled there as before
(:func:`pickle_snapshot` sets the views aside), and the worker's
:class:`ChainWriter` then writes the views' key groups, in a thread of the
worker, straight into the checkpoint storage.

Each key group is a chain of files: one full file (``StateView.full``:
:func:`pack_group`'s bytes, or a disk store's own, compressed) and up to
``pescheduler.checkpoint.max-deltas`` delta files, each holding
``({key: value} put, [key] deleted)`` since the chain's previous file
(Flink's changelog idea; a disk store's with its values as the store pickled
them, ``disk.RawDelta``, unpickled when read). A checkpoint writes, per group:
nothing when no key of it changed (the manifest references the earlier files),
a delta when the chain is short enough, its deltas together hold no more keys than its full file
(:func:`outgrown_at`: weighed in keys, not bytes, since a disk store's full file
is compressed better than any delta, session 32; past it, the group waits while a
checkpoint rewrites those most past theirs, a few at a time: :func:`outgrown_waits`)
and it is not the group's turn to be rewritten, else the group whole. Turns are
staggered (:func:`rewrite_turn`): each checkpoint rewrites about 1 /
max-deltas of the groups, not every chain at once when they all reach their
length together (1 % of the keys changed touches every group, so every chain
grows at each checkpoint: rewritten in lockstep, one checkpoint in
max-deltas + 1 wrote the whole state).

A chain grows from the newest file the worker wrote of its group and knows
durable: one of the last complete checkpoint (:meth:`ChainWriter.confirm`), or
one an aborted checkpoint wrote whole (written and fsynced) before it was cut
short (:meth:`ChainWriter.abandon` stops that write at the next group). The
coordinator leaves an aborted checkpoint's files in place (pruning removes them
once no kept manifest references them), so the next attempt references the
groups the last one got through and writes only the rest: a first checkpoint
of a state too large to write within ``checkpoint.timeout`` completes after a
few attempts instead of starting over at each one (Flink keeps the files an
aborted checkpoint uploaded for the same reason, FLINK-24611). Only a complete
checkpoint's signed manifest vouches for those files; a restore checks each
against it.

The PE's ``.state`` file stores, in place of each view, a :class:`GroupMap`:
what changed in the view's chains since the last complete checkpoint's map,
which a restore walks back (:func:`with_entries`) to ``{group: (a key of it,
GroupRef)}``; a :class:`GroupRef` names the chain's files, and the signed
manifest lists each with its size and SHA-256 (and each earlier ``.state``
file the walk reads, role ``map``). A restore hands those entries to the
worker that gets the group (``resolve_restore``), which reads and checks each
file before unpickling it: the deploying process never holds state bytes.

Outside a checkpoint (a reconfiguration's snapshot, a test) a
:class:`GroupsSnapshot` is an ordinary mapping ``{group: (key, bytes)}``, and
pickles as one.
"""

from __future__ import annotations

import io
import itertools
import pickle
import sys
import threading
import zlib
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any, Callable, Iterable, Iterator

import cloudpickle

from .. import config
from ..errors import CheckpointDamaged, CheckpointError
from .base import KEY_GROUPS, Changes, StateView, came_from, pack_group, unpack_group, unpack_prepared
from .files import Segment, StateFiles, physical
from .foreground import give_way
from .local import LocalCopies

_PICKLE = pickle.HIGHEST_PROTOCOL


class GroupsSnapshot(Mapping):
    """A KEYED operator's key groups at a snapshot, as a view: packed only when read; and
    ``restored``, ``{group: (key, GroupRef)}`` of groups a lazy restore has not loaded yet
    (``worker/lazy_restore.py``): a checkpoint references their files (:meth:`joined`)."""

    def __init__(self, view: StateView) -> None:
        self.view = view
        self.restored: dict = {}
        self._packed: dict | None = None

    def joined(self, restored: dict) -> "GroupsSnapshot":
        """This view with ``restored``'s groups (file references, disjoint from its own) added."""
        self.restored.update(restored)
        return self

    def _groups(self) -> dict:
        if self._packed is None:
            out = {g: self.view.group_snapshot(g) for g in self.view.groups()}
            self._packed = {**out, **self.restored}
            self.view.release()
        return self._packed

    def __getitem__(self, group: int) -> tuple[Any, bytes]:
        return self._groups()[group]

    def __iter__(self) -> Iterator[int]:
        return iter(self._groups())

    def __len__(self) -> int:
        return len(self._groups())

    def __reduce__(self):
        return dict, (self._groups(),)


@dataclass(frozen=True)
class GroupRef:
    """One key group in a checkpoint: its chain's files, the full one first. The PE's ``.state``
    file holds it compactly (``name`` is shared by a view's groups, ``chain`` the checkpoint
    and kind of each file); once restored (:func:`with_entries`) ``files`` holds the signed
    manifest's entries the worker checks each file against."""

    run: str
    name: str                   # <pe>.<n>: the view's files are <name>.g<NNN>.full|delta
    group: int
    chain: tuple                # checkpoint ids: the full file's, then each delta's (compact: the .state
    files: tuple = ()           # file holds one per group, every checkpoint)

    @property
    def views(self) -> list[str]:
        """The view whose files each of the chain's is: this one's, or another's (a restored
        state's chain that goes on from a PE of another name, ``ChainWriter._adopted``). A first
        format's reference names no chain: each of its ``files`` is this view's."""
        if len(self.chain) != len(self.files) and self.files:
            return [self.name] * len(self.files)
        return [c[2] if type(c) is tuple and len(c) > 2 else self.name for c in self.chain]

    @property
    def paths(self) -> list[str]:
        return [f"chk-{chk:06d}/" + (pack_name(name) if kind == PACKED else f"{name}.g{self.group:03d}.{kind}")
                for (chk, kind), name in zip(_kinds(self.chain), self.views)]


PACKED = "pack"         # a chain's link to a delta its PE's .state of that checkpoint holds (_Pack)


def _kinds(chain: tuple) -> list[tuple[int, str]]:
    """``(checkpoint id, "full" | "delta" | PACKED)`` of a chain: a file of its own is its
    checkpoint's id (the first the full file), a delta in its PE's pack ``(id, PACKED)``, a file
    of another view ``(id, kind, view)``."""
    return [c[:2] if type(c) is tuple else (c, "delta" if i else "full") for i, c in enumerate(chain)]


def pack_name(name: str) -> str:
    """The file holding view ``name``'s (``<pe>.<n>``) small deltas (:class:`_Pack`): its PE's ``.state``."""
    return f"{name.rsplit('.', 1)[0]}.state"


def _link(entry: dict) -> int | tuple:
    """A chain's file as its map names it (:func:`_kinds`); one of another view carries its name
    (``"view"``: the entry of a restored chain that goes on under a new PE's name)."""
    view, path = entry.get("view"), entry["path"]
    if view is not None:
        return entry["chk"], PACKED if path.endswith(".state") else path.rsplit(".", 1)[1], view
    return (entry["chk"], PACKED) if path.endswith(".state") else entry["chk"]


@dataclass(frozen=True)
class GroupMap:
    """One view's key groups in a PE's ``.state`` file, as what changed since the map of
    checkpoint ``base`` (the last complete one this worker wrote of the view): ``put`` the groups
    whose chain is new (``{group: (a key of it, chain)}``: a full file, or restated at their turn),
    ``grown`` the groups whose chain only grew (``{files added: (group, ...)}``, usually one delta
    of this checkpoint), ``present`` a bit per group the view holds. Every checkpoint rewrote all
    128 groups' references (~40 bytes a group, 4.8 KB a PE: 28 % of a 10^3-key state and more
    than the 1 % of its keys that changed, the bytes of issue 30's small rows). A restore
    (:func:`with_entries`) walks the maps back through ``base`` until every present group is
    ``put``; each group is ``put`` at its turn (:func:`rewrite_turn`) at least, so the walk is
    about ``max-deltas`` maps long, and the manifest lists each map it reads (role ``map``), which
    keeps them from pruning. ``base`` None: every group is ``put``."""

    run: str
    name: str                   # <pe>.<n>: the view's files are <name>.g<NNN>.full|delta
    base: int | None
    put: dict
    grown: dict
    present: int
    restored: dict = field(default_factory=dict)    # {group: (key, GroupRef)} a lazy restore had not
                                                    # loaded (their files another view's: incremental.still_restored)

    def __reduce__(self):       # a tuple, not a dict of field names: this is in every .state file
        return GroupMap, (self.run, self.name, self.base, self.put, self.grown, self.present,
                          *((self.restored,) if self.restored else ()))

    @property
    def groups(self) -> list[int]:
        return [g for g in range(self.present.bit_length()) if self.present >> g & 1]


def map_path(name: str, checkpoint_id: int) -> str:
    """The ``.state`` file (relative to the run) holding view ``name``'s map at ``checkpoint_id``."""
    return f"chk-{checkpoint_id:06d}/{name.rsplit('.', 1)[0]}.state"


def rewrite_turn(group: int, checkpoint_id: int, max_deltas: int) -> bool:
    """Whether checkpoint ``checkpoint_id`` is group ``group``'s turn to be rewritten whole: every
    ``max_deltas`` checkpoints, the groups' turns spread evenly over them (about 1 / max_deltas
    of the state per checkpoint, never all of it at once)."""
    return (group + checkpoint_id) % max(1, max_deltas) == 0


def outgrown_at(group: int) -> float:
    """How many times its full file's keys a chain's deltas may hold before the group is rewritten
    whole (in keys: a rewrite's cost is the writer's per key, and a disk store's full file is 3.3x
    smaller than its group pickled where a delta shrinks 2.4-2.8x compressed, so in bytes its
    deltas outgrew it sooner: 21 and 48 groups rewritten at a checkpoint at 10^7 where the old
    code's rows rewrote 9 and 1; the same writes on both backends now rewrite the same groups):
    from 1 to 2, spread over the groups (an odd multiple of the group, modulo their number). With
    one bound for all, groups that grow alike (a fill, or more than 1 / max-deltas of the keys
    changed per checkpoint) outgrow it at the same checkpoint: at 10^7 keys one steady checkpoint
    rewrote 61 of 128 groups whole (48 % of the state) between ones of 5 %. Spread, they cross it
    at different checkpoints and stay apart, since each restarts from its own full file."""
    return 1 + (group * 37 % KEY_GROUPS) / KEY_GROUPS


OUTGROWN_WAIT = 2.0     # an outgrown chain's rewrite may wait while its deltas hold at most this many times its bound


def _outgrown(chain: "_Chain", group: int, added: int) -> float:
    """How many times its bound (:func:`outgrown_at` of its full file's keys) the chain's deltas
    would hold with ``added`` more keys: past 1, the group is due to be rewritten whole."""
    grown, bound = chain.keys - chain.full_keys + added, chain.full_keys * outgrown_at(group)
    return grown / bound if bound else (float("inf") if grown else 0.0)


def outgrown_waits(since: tuple, checkpoint_id: int, max_deltas: int) -> frozenset[int]:
    """The groups of one view whose deltas outgrow their bound (:func:`outgrown_at`) in this
    checkpoint but whose rewrite waits for a later one: all but the ``KEY_GROUPS / max_deltas``
    most outgrown (as many as the turns rewrite, :func:`rewrite_turn`), while a chain stays short
    of ``max_deltas`` deltas and of :data:`OUTGROWN_WAIT` times its bound. The spread of the bounds
    keeps groups apart in steady work; a fill over a few checkpoints grows every group alike, and
    groups whose deltas reach 1.3 times their full files at one checkpoint were rewritten 47 of 128
    at once (the unit test's). Waiting, they are rewritten a few a checkpoint, most outgrown first;
    meanwhile each writes a delta (fewer bytes than its rewrite)."""
    chains, changed, whole = since
    over = []
    for g, keys in changed.items():
        prev = chains.get(g)
        deltas = 0 if prev is None else len(prev.files) - 1
        if (prev is None or prev.adopted or g in whole or deltas >= max_deltas
                or (deltas and rewrite_turn(g, checkpoint_id, max_deltas))):
            continue                        # written whole anyway, or a delta that fits
        if (ratio := _outgrown(prev, g, len(keys))) > 1:
            over.append((ratio, g))
    over.sort(reverse=True)
    rewrites = -(-KEY_GROUPS // max(1, max_deltas))
    return frozenset(g for ratio, g in over[rewrites:] if ratio <= OUTGROWN_WAIT)


# -- the PE's .state file: views set aside, references put back ----------------------------------

class _SetAside(cloudpickle.Pickler):
    def __init__(self, buffer: io.BytesIO) -> None:
        super().__init__(buffer, protocol=_PICKLE)
        self.views: list[GroupsSnapshot] = []

    def persistent_id(self, obj: Any) -> Any:
        if type(obj) is GroupsSnapshot and obj._packed is None:
            for i, seen in enumerate(self.views):          # one view named twice is written once
                if seen is obj:
                    return i
            self.views.append(obj)
            return len(self.views) - 1
        return None


def pickle_snapshot(snapshot: Any) -> tuple[bytes, list[GroupsSnapshot]]:
    """``snapshot`` pickled now, each unread :class:`GroupsSnapshot` set aside (numbered in order)."""
    buffer = io.BytesIO()
    pickler = _SetAside(buffer)
    pickler.dump(snapshot)
    return buffer.getvalue(), pickler.views


class _PutBack(pickle.Unpickler):
    def __init__(self, data: bytes, groups: list) -> None:
        super().__init__(io.BytesIO(data))
        self.groups = groups

    def persistent_load(self, pid: Any) -> Any:
        return self.groups[pid]


SQUEEZE = 1 << 20      # a .state file this small is compressed (zlib): its fixed part and small deltas


def state_file(blob: dict) -> bytes:
    """A PE's ``.state`` file's bytes: ``blob`` pickled, compressed (zlib) when at most
    :data:`SQUEEZE` bytes and smaller so: with the small key-group files it holds (:class:`_Pack`)
    it is most of what a steady checkpoint writes at 10^3-10^4 keys beside the manifest. Larger
    ones (a non-keyed operator's whole state) are left as they are: their compression would be
    seconds of the writer's CPU."""
    data = cloudpickle.dumps(blob, _PICKLE)
    if len(data) <= SQUEEZE:
        squeezed = zlib.compress(data, 6)
        if len(squeezed) < len(data):
            return squeezed
    return data


def load_state_file(data: bytes) -> dict:
    """:func:`state_file`'s bytes (checked against the manifest first), or an uncompressed one's
    (a pickle starts with its PROTO opcode, a zlib stream with 0x78)."""
    return cloudpickle.loads(zlib.decompress(data) if data[:1] == b"\x78" else data)


def load_snapshot(data: bytes, groups: list) -> Any:
    """:func:`pickle_snapshot`'s bytes, view ``i`` replaced by ``groups[i]`` (``{g: (key, GroupRef)}``)."""
    return _PutBack(data, groups).load()


def with_entries(groups: list, entries: list[dict], read=None) -> list[dict]:
    """A ``.state`` file's ``groups`` as ``[{group: (key, GroupRef)}]``, each :class:`GroupRef`'s
    paths replaced by the entries of the (verified) manifest (``entries``: its files): what the
    worker checks each file against. A :class:`GroupMap` is walked back through the earlier
    ``.state`` files it extends, each read with ``read(entry)`` (its bytes, size and SHA-256
    checked against the manifest) and each listed there, or the checkpoint is damaged."""
    by_path = {e["path"]: e for e in entries}
    maps: dict[str, list] = {}

    def earlier(name: str, checkpoint_id: int) -> GroupMap:
        path = map_path(name, checkpoint_id)
        if path not in maps:
            if path not in by_path or read is None:
                raise CheckpointDamaged(f"the key-group map {path} is not in the signed manifest")
            maps[path] = load_state_file(read(by_path[path]))["groups"]
        found = [m for m in maps[path] if type(m) is GroupMap and m.name == name]
        if not found:
            raise CheckpointDamaged(f"{path} holds no key-group map of {name}")
        return found[0]

    try:
        return [{g: (key, replace(ref, files=tuple(by_path[p] for p in ref.paths)))
                 for g, (key, ref) in (_walked(part, earlier) if type(part) is GroupMap else part).items()}
                for part in groups]
    except KeyError as exc:
        raise CheckpointDamaged(f"key-group file {exc} is not in the signed manifest") from None


def _walked(newest: GroupMap, earlier) -> dict:
    """``{group: (key, GroupRef)}`` of ``newest``'s present groups, its maps walked back, and the
    groups it references from the checkpoint a lazy restore was loading (``restored``)."""
    wanted, found, grown, at = set(newest.groups), dict(newest.restored), {}, newest
    wanted |= set(found)
    while True:
        for g, (key, chain) in at.put.items():
            if g in wanted and g not in found:
                found[g] = (key, GroupRef(newest.run, newest.name, g, (*chain, *grown.get(g, ()))))
        for added, gs in at.grown.items():
            for g in gs:
                if g in wanted and g not in found:
                    grown[g] = (*added, *grown.get(g, ()))
        if len(found) == len(wanted):
            return found
        if at.base is None:
            raise CheckpointDamaged(f"the key-group maps of {newest.name} name no chain for groups "
                                    f"{sorted(wanted - set(found))[:8]}")
        at = earlier(newest.name, at.base)


# -- the worker's writer ---------------------------------------------------------------------------

@dataclass(frozen=True)
class _Chain:
    key: Any                    # a key of the group (stands for it when a rescale asks owns(key))
    files: tuple                # entries, the full file first
    full_bytes: int
    delta_bytes: int
    keys: int = 0               # keys its files hold (each delta's puts counted: at most that many)
    full_keys: int = 0          # of those, its full file's: its deltas are weighed against it in keys
    received: bytes | None = None   # not written yet: the full file a rescale's part brought (_adopted)
    origin: tuple | None = None     # not checked yet: a lazy restore's chain, (run, each file's view name)

    @property
    def adopted(self) -> bool:
        """A chain an import brought (:meth:`ChainWriter._adopted` makes it this view's)."""
        return self.received is not None or self.origin is not None


@dataclass(frozen=True)
class _Kept:
    """A group's chain an aborted checkpoint wrote whole: the next attempt builds on it."""

    seq: int                    # the snapshot it was written from
    checkpoint_id: int          # the aborted checkpoint that wrote it
    chain: _Chain


@dataclass(frozen=True)
class _Union:
    """The keys changed since one snapshot, by group, up to snapshot ``upto``: what the next
    attempt extends with the snapshots since, not sorts again."""

    upto: int
    groups: dict                # group -> its keys, as a dict's keys (untracked by the GC)
    whole: frozenset            # groups replaced whole
    count: int                  # keys in groups
    adopted: dict = field(default_factory=dict)    # groups of whole an import that kept what it came from
                                                   # replaced last: their _Chain


@dataclass(frozen=True)
class _Written:
    seq: int                    # the view's snapshot number
    chains: dict                # group -> _Chain
    run: str                    # the run whose storage holds the files
    name: str = ""              # the view's name (<pe>.<n>): its map is in <pe>.state
    checkpoint_id: int = 0
    anchors: dict = field(default_factory=dict)    # group -> the checkpoint whose map put its chain
    maps: tuple = ()            # entries of the .state files a restore walks, this one's first


class ChainWriter:
    """One deployment's key-group chains on this worker: writes views, learns which checkpoints completed.

    Keyed by the state object (``Changes.token``): a state replaced (a restore, a rescale) starts
    with full files, but for the key groups an import brought that kept what they came from, whose
    chains start there (``Changes.adopted``, :meth:`_adopted`: a rescale's part's bytes, a lazy
    restore's files). Writes happen in a worker thread (the PE host's ``pe_ckpt_write``), one at
    a time (:attr:`_writing`): an aborted checkpoint's write may still be going when the next
    one's begins, and the chains it keeps name files of its segment, which are durable only once
    it ends (:meth:`write_pe`)."""

    def __init__(self, local: LocalCopies | None = None) -> None:
        self.local = local                          # copies of the files written here (local recovery)
        self._base: dict[str, _Written] = {}        # token -> chains of the newest complete checkpoint
        self._seen: dict[str, dict] = {}            # token -> {seq: Changes} since that one
        self._pending: dict[int, dict] = {}         # checkpoint id -> {token: _Written}
        self._kept: dict[str, dict] = {}            # token -> {group: _Kept} written since that one
        self._abandoned: set[int] = set()           # checkpoints aborted: their writes stop
        self._unions: dict[tuple, _Union] = {}      # (token, seq) -> keys changed since that snapshot
        self._lock = threading.Lock()               # confirm() comes from the worker's loop
        self._restored: dict[int, set] = {}         # checkpoint id -> restored files it references
        self._restored_base: set = set()            # those of the newest complete one (local copies kept)
        self._writing = threading.Lock()            # held through a write_pe

    def write_pe(self, files: StateFiles, checkpoint_id: int, pe_id: str, taken: dict) -> dict:
        """One PE's checkpoint: its groups' files, then its ``.state`` file, which holds its small
        ones too (:class:`_Pack`); ``{"files", "positions", "state_bytes"}`` with every file the
        checkpoint references, each once (earlier checkpoints' included: their group files, and
        the ``.state`` files whose key-group maps this one's extend or that hold a chain's file,
        role ``map``), and the bytes of the state it references (each key group's files, wherever
        they are held, and its ``.state``).

        The key-group files go into one segment (``state.files.Segment``), synced before the
        ``.state`` is written and before this returns or raises: the chains kept for the next
        attempt name its files. A segment that cannot be synced takes those chains with it."""
        with self._writing:
            return self._write_pe(files, checkpoint_id, pe_id, taken)

    def _write_pe(self, files: StateFiles, checkpoint_id: int, pe_id: str, taken: dict) -> dict:
        refs, views, run = [], [], files.url.rsplit("/", 1)[-1]
        pack, done, segment = _Pack(checkpoint_id, f"{pe_id}.state"), [], files.segment(checkpoint_id, pe_id)
        try:
            try:
                for i, snap in enumerate(taken["views"]):
                    gmap, chains, token = self._write_view(segment, f"{pe_id}.{i}", i, snap.view, pack)
                    restored, referenced = still_restored(snap.restored, run) if snap.restored else ({}, [])
                    done.append((chains, referenced))
                    if snap.restored:   # groups a lazy restore has not loaded yet: their files referenced
                        gmap = replace(gmap, restored=restored)
                    refs.append(gmap)
                    views.append(token)
            finally:
                segment.close()
        except CheckpointError:         # no .state: the chains kept for the next attempt may not name it
            self._unkeep(lambda f: f is pack.entry)
            raise
        except BaseException:           # the segment may not be durable: nor its chains kept
            segment.abort()
            self._unkeep(lambda f: f is pack.entry or f.get("in") in segment.names and f["chk"] == checkpoint_id)
            raise
        blob = state_file({"ops": taken["state"], "positions": taken["positions"], "groups": refs,
                           **({"deltas": pack.deltas} if pack.deltas else {})})
        state = files.put(checkpoint_id, f"{pe_id}.state", blob)
        if pack.deltas:                 # it holds key-group files: a local copy as theirs
            self._keep(files, state, blob)
        pack.entry.update(state)        # the entry its chains' packed deltas name
        entries: dict = {}
        # The state it references: each key group's files by their own bytes, wherever held (an
        # earlier .state holding some counted whole would count its map and small state too), and
        # this .state less the files it holds (compressed, so at most its own part, never more).
        held = max(0, state["bytes"] - pack.size)
        for chains, referenced in done:
            for f in (f for c in chains.values() for f in c.files):
                entries[f["path"]] = {**{k: v for k, v in f.items() if k != "view"}, "role": "group"}
            held += sum(c.full_bytes + c.delta_bytes for c in chains.values())
            if referenced:
                entries.update((e["path"], e) for e in referenced)
                held += sum(e["bytes"] for e in {e["path"]: e for e in referenced}.values())
                with self._lock:
                    self._restored.setdefault(checkpoint_id, set()).update(map(physical, referenced))
        maps: dict = {}
        with self._lock:
            pending = self._pending.get(checkpoint_id, {})      # gone: a later one completed meanwhile
            for token in views:
                w = pending.get(token)
                if w is not None:
                    pending[token] = replace(w, maps=(state, *w.maps))
                    maps.update((e["path"], e) for e in w.maps)
        for path, e in list(entries.items()):   # a .state holding a chain's delta: a map as the walk's are
            if path.endswith(".state"):
                del entries[path]
                if path != state["path"]:
                    maps.setdefault(path, e)
        return {"files": [{**state, "role": "state", "pe": pe_id}, *entries.values(),
                          *({**e, "role": "map", "pe": pe_id} for e in maps.values())],
                "positions": taken["positions"], "state_bytes": held}

    def _unkeep(self, written: Callable[[dict], bool]) -> None:
        """An aborted write's groups whose chain has a file ``written`` says it wrote: not kept
        (the PE's ``.state`` that would hold a packed delta is not written, or the segment holding
        a file was not synced); the next attempt writes them again."""
        with self._lock:
            for groups in self._kept.values():
                for g in [g for g, k in groups.items() if any(map(written, k.chain.files))]:
                    del groups[g]

    def _write_view(self, segment: Segment, name: str, index: int, view: StateView, pack: "_Pack") -> tuple:
        checkpoint_id = segment.checkpoint_id
        try:
            changes = view.changes or Changes(f"untracked-{id(view)}", 1)   # a view of another backend: whole
            with self._lock:
                _see(self._seen.setdefault(changes.token, {}), changes)
            since = self._since(changes, view.by_group)
            with self._lock:
                fresh = changes.token not in self._base     # no chain but those imports brought (_since)
            if since is None or since[2] or fresh:  # every group whole, or (its third part) groups a
                view.reads_whole()                  # rescale replaced whole: read in ranges
            chains, later = {}, _Later(self, changes, view)
            waits = frozenset() if since is None else outgrown_waits(since, checkpoint_id,
                                                                     config.get("checkpoint.max-deltas"))
            # The groups no attempt wrote since the last complete checkpoint first (after a fill, a
            # complete one's chains are rewritten whole too: their deltas outgrow them): an attempt
            # cut short has added as many to what the next builds on as it could.
            order = sorted(view.groups(), key=lambda g: g in later.kept)
            kept_of = {g: later.since(g) for g in order}
            view.reads_full(self._may_rewrite(order, kept_of, since, checkpoint_id, waits))
            for g in order:
                give_way()                  # a group's work at a time beside the PEs' turns (foreground.py)
                if checkpoint_id in self._abandoned:
                    raise CheckpointError(f"checkpoint {checkpoint_id} was aborted while its files were "
                                          f"written; the groups written are kept for the next one")
                kept = kept_of[g]
                chains[g] = self._chain(segment, f"{name}.g{g:03d}", view, g, kept or since,
                                        lambda data, delta: pack.add(index, g, data, delta),
                                        waits=kept is None and g in waits)
                with self._lock:
                    self._kept.setdefault(changes.token, {})[g] = _Kept(changes.seq, checkpoint_id, chains[g])
        finally:
            view.release()
            _free(self._forget_unions(changes.token))
        run = segment.files.url.rsplit("/", 1)[-1]
        with self._lock:
            base = self._base.get(changes.token)
        if base is not None and (base.run != run or base.name != name or not base.maps):
            base = None                 # its map is not one this view's can extend
        gmap, anchors = _group_map(run, name, checkpoint_id, chains, base)
        oldest = min(anchors.values(), default=checkpoint_id)
        walked = tuple(e for e in base.maps if e["chk"] >= oldest) if base is not None else ()
        with self._lock:
            self._pending.setdefault(checkpoint_id, {})[changes.token] = _Written(
                changes.seq, chains, run, name, checkpoint_id, anchors, walked)
        return gmap, chains, changes.token

    def _forget_unions(self, token: str) -> list["_Union"]:
        """Drop the sorted keys since snapshots no chain builds on any more (a group's kept chain
        moved on to a later attempt's): one set of keys per attempt would pile up otherwise.
        The unions dropped, for :func:`_free` once the lock is let go."""
        with self._lock:
            base = self._base.get(token)
            live = {k.seq for k in self._kept.get(token, {}).values()} | ({base.seq} if base else set())
            return self._pop_unions(token, lambda seq: seq not in live)

    def _pop_unions(self, token: str, gone: Callable[[int], bool]) -> list["_Union"]:
        """The lock held: ``token``'s unions since a snapshot ``gone(seq)`` says, out of :attr:`_unions`."""
        return [self._unions.pop(k) for k in [k for k in self._unions if k[0] == token and gone(k[1])]]

    def _since(self, changes, by_group) -> tuple[dict, dict, set] | None:
        """``(base chains, changed keys by group, groups replaced whole)`` since the last complete
        checkpoint, or None when a snapshot in between was not seen here (everything full)."""
        with self._lock:
            base = self._base.get(changes.token)
            if base is None:            # a state with no complete checkpoint yet: the groups an import
                seen = self._seen.get(changes.token, {})       # brought start from what they came from
                if not any(seen.get(s) is not None and seen[s].adopted for s in range(1, changes.seq + 1)):
                    return None
        return self._changed(changes, 0, {}, by_group) if base is None else \
            self._changed(changes, base.seq, base.chains, by_group)

    def _changed(self, changes, seq: int, chains: dict, by_group) -> tuple[dict, dict, set] | None:
        """``(chains, keys changed by group, groups replaced whole)`` between snapshot ``seq``
        and ``changes``' one; None when a snapshot in between was not seen here, or when more
        keys changed than ``chains`` hold (:func:`_more_than`). A group whose last replacement
        was an import that kept what it came from (``Changes.adopted``) is not among those
        replaced whole: its chain is a rescale's part's bytes, not written yet
        (``_Chain.received``), or a lazy restore's files (``_Chain.origin``), and its keys
        changed include every key written since the import (and some before it, which its delta
        reads from the view all the same). The keys are sorted by group once:
        a later attempt adds only the snapshots since (:class:`_Union`). Each attempt sorted every
        key changed since the last complete checkpoint again, before its first file: at 10^7 keys,
        after a fill of 2 M keys since it, 1-3 files an attempt in 30 s."""
        if changes.one_step and changes.seq - seq > 1:
            return None                 # (Changes.one_step: one snapshot since the chains' files at most)
        with self._lock:
            seen = self._seen[changes.token]
            if any(s not in seen for s in range(seq + 1, changes.seq + 1)):
                return None
            done = self._unions.get((changes.token, seq))
            if done is not None and done.upto > changes.seq:
                done = None
            new = [seen[s] for s in range((done.upto if done else seq) + 1, changes.seq + 1)]
        whole, adopted = set(done.whole) if done else set(), dict(done.adopted) if done else {}
        for c in new:                   # in order: a group's last replacement says where its chain starts
            for g in c.whole:
                r = c.adopted.get(g)
                if r is not None and r.ref is not None:                # a lazy restore's: its files
                    files = r.ref.files
                    adopted[g] = _Chain(r.first, files, files[0]["bytes"], sum(f["bytes"] for f in files[1:]),
                                        r.keys, r.keys, origin=(r.ref.run, tuple(r.ref.views)))
                elif r is not None and len(r.data) > PACK_DELTA:      # (a small one is rewritten whole)
                    adopted[g] = _Chain(r.first, (), len(r.data), 0, r.keys, r.keys, r.data)
                else:
                    adopted.pop(g, None)
            whole |= c.whole
        if _more_than({**chains, **adopted}, done.count if done else 0, (c.keys for c in new)):
            return None
        groups = dict(done.groups) if done else {}
        # Each group's keys as a dict's keys (values None), not a set: a dict of bytes or str is
        # not tracked by the cyclic GC, a set is, and a full collection visits its every key holding
        # the GIL (after a fill at 10^7 keys, millions of keys kept here between attempts). New dicts:
        # an earlier attempt's thread may still read its own. Read a slice at a time (memory's
        # keys are a view of its dicts, read here, off the loop) straight into a dict per group:
        # one dict of every key changed grew by resizes of one call each, 12-85 ms at 10^6 keys
        # and more (the first checkpoint after a fill or a rescale), holding the GIL.
        fresh: dict[int, dict] = {}
        for c in new:
            for part in slices(c.keys):
                for g, keys in by_group(part).items():
                    fresh.setdefault(g, {}).update(dict.fromkeys(keys))
        for g, keys in fresh.items():
            groups[g] = {**groups[g], **keys} if g in groups else keys
        union = _Union(changes.seq, groups, frozenset(whole), sum(len(k) for k in groups.values()), adopted)
        with self._lock:
            self._unions[(changes.token, seq)] = union
        return {**chains, **adopted}, groups, whole - adopted.keys()

    def _chain(self, segment: Segment, name: str, view: StateView, g: int, since: tuple | None,
               packed: Callable[[bytes, tuple | None], dict | None] = lambda data, delta: None,
               waits: bool = False) -> _Chain:
        """Group ``g``'s chain in this checkpoint: the base's as it was (no key changed), with one
        more delta (the chain is short, its deltas stay smaller than its full file, or it ``waits``
        for its rewrite (:func:`outgrown_waits`), and it is not the group's turn:
        :func:`rewrite_turn`), or a new full file."""
        checkpoint_id, prev = segment.checkpoint_id, _built_on(since, g)
        if prev is not None and prev.adopted:
            prev = self._adopted(segment, name, g, prev, since[1].get(g))
        if prev is not None:
            keys = since[1].get(g)
            step = _step(prev, g, checkpoint_id, bool(keys))
            if step is _SAME:
                return prev
            if step is _DELTA:
                delta = view.delta(g, keys)
                data = pack_delta(*delta)
                if waits or _outgrown(prev, g, len(delta[0])) <= 1:
                    entry = packed(data, delta) or self._put(segment, f"{name}.delta", data)
                    return _Chain(prev.key, (*prev.files, entry), prev.full_bytes, prev.delta_bytes + len(data),
                                  prev.keys + len(delta[0]), prev.full_keys)
        data, count, first = view.full(g)   # in chunks: the PE's thread gets the GIL between them
        entry = packed(data, None) or self._put(segment, f"{name}.full", data)
        return _Chain(first, (entry,), len(data), 0, count, count)

    def _may_rewrite(self, groups: list[int], kept_of: dict, since: tuple | None, checkpoint_id: int,
                     waits: frozenset[int]) -> list[int]:
        """The groups :meth:`_chain` may write whole in this checkpoint (``StateView.reads_full``):
        its steps with each group's keys changed for its delta's length, which is never shorter
        (``_outgrown`` grows with it), so a group left out here gets a delta or stays as it was."""
        out = []
        for g in groups:
            base = kept_of[g] or since
            prev = _built_on(base, g)
            if prev is None or prev.adopted:
                out.append(g)
                continue
            keys = base[1].get(g)
            step = _step(prev, g, checkpoint_id, bool(keys))
            if step is _FULL or (step is _DELTA and not (kept_of[g] is None and g in waits)
                                 and _outgrown(prev, g, len(keys)) > 1):
                out.append(g)
        return out

    def _adopted(self, segment: Segment, name: str, g: int, received: _Chain, keys: Any) -> _Chain | None:
        """A group an import brought (:class:`~pescheduler.state.base.Received`) as this view's
        chain, which ``_chain`` then grows by the keys written since the import: a rescale's part's
        bytes written as its full file, into the PE's segment (the chain's delta may go into the
        PE's pack, which holds one file a group); a lazy restore's chain as it is when its files are
        this run's, each of another view's (the PE restored under another name: a placement
        fused anew on fewer workers) naming it (``"view"``, :func:`_link`). None when the keys
        since would outgrow it (:func:`outgrown_at`), or the files are another run's: then the
        group is written whole."""
        if _outgrown(received, g, len(keys or ())) > 1:
            return None
        if received.origin is not None:
            run, views = received.origin
            if run != segment.files.url.rsplit("/", 1)[-1]:
                return None
            mine = name.rsplit(".g", 1)[0]
            chain = tuple(f if v == mine else {**f, "view": v} for f, v in zip(received.files, views))
            return replace(received, files=chain, origin=None)
        entry = self._put(segment, f"{name}.full", received.received)
        return replace(received, files=(entry,), received=None)

    def _put(self, segment: Segment, name: str, data: bytes) -> dict:
        """A key-group file into the storage (its PE's segment), and a copy kept on this worker."""
        entry = segment.put(name, data)
        self._keep(segment.files, entry, data)
        return entry

    def _keep(self, files: StateFiles, entry: dict, data: bytes) -> None:
        """A copy of a file written into ``files`` kept on this worker (local recovery)."""
        if self.local is not None and "data" not in entry:
            self.local.keep(files.url.rsplit("/", 1)[-1], entry, data)

    def abandon(self, checkpoint_id: int) -> None:
        """Checkpoint ``checkpoint_id`` was aborted: a write of it still going stops at its next
        group; the groups written whole so far stay, for the next attempt to build on."""
        with self._lock:
            self._abandoned.add(checkpoint_id)

    def confirm(self, checkpoint_id: int) -> Callable[[], None]:
        """Checkpoint ``checkpoint_id`` is complete: its chains are what the next ones build on.
        Returns what it let go of, to free later (:func:`_let_go`: the interval's keys, a slice at
        a time): nothing reaches them any more, and their sinks' commit need not wait for them."""
        with self._lock:
            dropped, gone = self._confirm(checkpoint_id)
            bases = list(self._base.values())
            kept = [k.chain for groups in self._kept.values() for k in groups.values()]
            self._restored_base = self._restored.pop(checkpoint_id, set())
            for older in [i for i in self._restored if i < checkpoint_id]:
                del self._restored[older]
        if self.local is not None and bases:       # copies no base (nor a later attempt's chain) references go
            keep = {physical(f) for c in [*(c for b in bases for c in b.chains.values()), *kept] for f in c.files}
            keep |= self._restored_base             # a lazy restore may still read them here
            for run in {b.run for b in bases}:
                self.local.prune(run, keep, checkpoint_id)
        return partial(_let_go, dropped, gone)

    def _confirm(self, checkpoint_id: int) -> tuple[list["_Union"], list[Changes]]:
        """The lock held: checkpoint ``checkpoint_id``'s chains become the base; the unions no
        later write builds on, for :func:`_free`, and the snapshots' Changes no chain needs any
        more, for :func:`_emptied` (both once the lock is let go)."""
        dropped, gone = [], []
        for token, written in self._pending.pop(checkpoint_id, {}).items():
            self._base[token] = written
            seen = self._seen.get(token, {})
            gone += [seen.pop(s) for s in [s for s in seen if s <= written.seq]]
            dropped += self._pop_unions(token, lambda seq, upto=written.seq: seq < upto)
        for older in [i for i in self._pending if i < checkpoint_id]:
            del self._pending[older]
        for token, groups in list(self._kept.items()):    # the complete one's chains supersede them
            for g in [g for g, k in groups.items() if k.checkpoint_id <= checkpoint_id]:
                del groups[g]
            if not groups:
                del self._kept[token]
        self._abandoned = {i for i in self._abandoned if i > checkpoint_id}
        return dropped, gone


def _let_go(unions: list["_Union"], changes: list[Changes]) -> None:
    """What a complete checkpoint let go of (:meth:`ChainWriter.confirm`), freed: its unions'
    keys (:func:`_free`) and its intervals' (:func:`_emptied`). After the fill at 10^7 keys on
    ``disk`` this was 3.0 s of a checkpoint's end (py-spy: a slice at a time, giving way to the
    PE's turns), and the end's call, which the sinks' commit follows, timed out after 3 s."""
    _free(unions)
    _emptied(changes)


def _free(unions: list["_Union"]) -> None:
    """Let ``unions`` go a key group at a time (in the caller's thread: a checkpoint's write or
    end, never the worker's loop). After a rescale at 10^7 keys the keys changed since the last
    complete checkpoint are 2-3 M, and one ``del`` of their union freed them all in one C call
    holding the GIL: the largest holder in the stream's gap at the first checkpoint after the
    Release (py-spy, session 33). Each group's keys are dropped in turn, the GIL free between two;
    nothing of a union is changed (a write still going may read it: then it frees them)."""
    parts = [keys for u in unions for keys in u.groups.values()]
    unions.clear()
    while parts:
        parts.pop()


def _emptied(changes: list[Changes]) -> None:
    """Let ``changes`` go, a disk store's keys (``{encoded key: pickled value}`` of every key
    written in a snapshot's interval) :data:`SLICE_KEYS` at a time, when nothing else holds them
    (their Changes, nor the dict itself: a lazy view may still read a snapshot's keys, through the
    store's journal): freed in one C call, the keys of a checkpoint's interval after a rescale at
    10^7 keys (0.5-3 M) held the GIL 14-15 ms per 10^6 keys in the writer's lock (in process; the
    largest gap between outputs at the end of that checkpoint, 18-26 ms deployed). Each slice is
    a C call; the GIL may change hands between two."""
    while changes:
        c = changes.pop()
        if sys.getrefcount(c) == 2:         # ours alone: its keys are ours to take
            keys, c.keys = c.keys, ()
            if type(keys) is dict:
                let_go(keys)
            elif sys.getrefcount(keys) == 2 and hasattr(keys, "let_go"):   # a backend's own form
                keys.let_go()               # (memory's _Keys): its dicts, each as let_go does
            del keys
        del c


def empty(entries: dict) -> None:
    """``entries`` emptied :data:`SLICE_KEYS` at a time, each slice one C call: the GIL may change
    hands between two. A ``del`` of a dict of 10^5 entries the PE also holds is one C call of a
    cache miss per key and value (12-15 ms at 78,000 of a 10^7-key window: perf)."""
    popitem, none = entries.popitem, ()
    while entries:                      # from the end: a pop from the front leaves a dummy its next slice steps over
        deque(itertools.starmap(popitem, itertools.repeat(none, min(len(entries), SLICE_KEYS))), maxlen=0)
        give_way()


def let_go(entries: dict) -> None:
    """``entries`` (keys and values a checkpoint or a fold is done with) emptied a slice at a time
    (:func:`empty`) when nothing but the caller holds them, else only let go: then nothing can
    reach them meanwhile. Their last ``del`` was one C call over every entry: a memory state's
    interval at 10^7 keys (10^5 keys with their values) 24-39 ms at the end of every checkpoint
    (perf, session 54)."""
    if sys.getrefcount(entries) == 3:       # the caller's, this argument's and getrefcount's
        empty(entries)


def _see(seen: dict, changes: Changes) -> None:
    """``changes`` into ``seen`` (``{seq: Changes}``), with those it carries of snapshots no
    checkpoint wrote (``Changes.before``): the keys since the chains' files hold theirs too."""
    todo = [changes]
    while todo:
        c = todo.pop()
        c.taken = True                  # its view's release hands nothing back now
        seen.setdefault(c.seq, c)
        todo.extend(c.before)
        c.before = ()                   # kept in seen until a complete checkpoint: no chain of them


def _group_map(run: str, name: str, checkpoint_id: int, chains: dict, base: _Written | None) -> tuple:
    """``(GroupMap, anchors)`` of one view's ``chains`` against the map of ``base`` (the last
    complete checkpoint's): a group whose chain only grew is named under its new files, one whose
    chain is new, or whose turn it is (:func:`rewrite_turn`: so a restore never walks back much
    more than ``max-deltas`` maps), with its key and whole chain; ``anchors`` the checkpoint whose
    map holds each group's whole chain."""
    max_deltas = config.get("checkpoint.max-deltas")
    put, grown, anchors, shared = {}, {}, {}, {}
    for g, c in chains.items():
        paths = tuple(f["path"] for f in c.files)
        was = None if base is None else base.chains.get(g)
        old = None if was is None else tuple(f["path"] for f in was.files)
        if (old is not None and g in base.anchors and paths[:len(old)] == old
                and not rewrite_turn(g, checkpoint_id, max_deltas)):
            if len(paths) > len(old):
                added = tuple(_link(f) for f in c.files[len(old):])
                grown.setdefault(shared.setdefault(added, added), []).append(g)
            anchors[g] = base.anchors[g]
        else:
            chain = tuple(_link(f) for f in c.files)
            put[g] = (c.key, shared.setdefault(chain, chain))     # equal chains pickled once
            anchors[g] = checkpoint_id
    gmap = GroupMap(run, name, None if base is None else base.checkpoint_id, put,
                    {added: tuple(gs) for added, gs in grown.items()}, sum(1 << g for g in chains))
    return gmap, anchors


def _built_on(since: tuple | None, group: int) -> _Chain | None:
    """The chain group ``group`` builds on from ``since`` (``_changed``'s), or None: written whole."""
    return None if since is None or group in since[2] else since[0].get(group)


_SAME, _DELTA, _FULL = "same", "delta", "full"      # _step's


def _step(prev: _Chain, group: int, checkpoint_id: int, changed: bool) -> str:
    """What a group's chain ``prev`` gets in checkpoint ``checkpoint_id``: nothing (``_SAME``: no
    key changed and not its turn: :func:`rewrite_turn`; even unchanged, a turn missed would be made
    up later, beside other groups' turns), a delta when it fits (``_DELTA``: fewer than
    ``checkpoint.max-deltas`` deltas, not its turn), else its full file again (``_FULL``)."""
    max_deltas = config.get("checkpoint.max-deltas")
    deltas = len(prev.files) - 1
    turn = deltas and rewrite_turn(group, checkpoint_id, max_deltas) and \
        not _lasts(prev, checkpoint_id, max_deltas, changed)
    if not changed and not turn:
        return _SAME
    return _DELTA if deltas < max_deltas and not turn else _FULL


def _lasts(chain: _Chain, checkpoint_id: int, max_deltas: int, grows: bool) -> bool:
    """Whether a chain at its turn may wait for its next one: grown on at the rate it grew since
    its full file (this checkpoint's delta, ``grows``, counted), it would still hold at most
    ``max_deltas`` deltas, together holding no more keys than its full file. When 1 % of 10^3 keys
    change, a group gets a delta every ~13 checkpoints: at its turn its 3-4 deltas (a key each)
    were rewritten as the whole group (~8 keys), 2-3 groups a checkpoint, the largest part of a
    checkpoint's bytes. A chain that grows at every checkpoint (1 % of 10^5 keys and more touch
    every group) never waits, so the turns stay spread."""
    age, deltas = checkpoint_id - chain.files[0]["chk"], len(chain.files) - 1
    now = deltas + grows
    if age <= 0 or not deltas:
        return False
    later = (age + max(1, max_deltas)) / age
    return now * later <= max_deltas and (chain.keys - chain.full_keys) * now / deltas * later <= chain.full_keys


SQUEEZE_DELTA = 64      # a delta larger than this is compressed if that makes it smaller (pack_delta)
PACK_DELTA = 1024       # a key-group file (whole or delta) at most this large goes into its PE's .state (_Pack)
PACK_MAX = 64 << 10     # ... while the pack holds at most this many bytes: a group's restore reads whole packs


class _Pack:
    """One PE's small deltas of one checkpoint, held in its ``.state`` file (``"deltas"``:
    ``{(view, group): delta bytes}``): one file per PE per checkpoint, one manifest entry. At
    10^3-10^4 keys with 1 % changed, a steady checkpoint's deltas hold a key or two each, and
    each was a file (or carried in the manifest: 48 bytes and less, ``state/files.INLINE``)
    named by a manifest entry of 60-140 bytes: the manifest was most of what the checkpoint
    wrote (bench/state.py, session 22: 11-22 % of the state, 2-6 % without it). A chain's link
    to a packed delta is ``(id, PACKED)``, the same for every group of that checkpoint (its map
    names them together, as it did its deltas). Only small deltas (:data:`PACK_DELTA`), and
    :data:`PACK_MAX` bytes at most: a lazy restore of one group reads the ``.state`` files its
    chain names whole (``read_group``, each once per restore: ``packs``); at 10^6 keys and more
    a delta is 1-40 KB and keeps its own file. Its entry is filled in once the ``.state`` is
    written (``ChainWriter.write_pe``); an attempt aborted before that keeps none of its chains
    that name it (``ChainWriter._unkeep``)."""

    def __init__(self, checkpoint_id: int, name: str) -> None:
        self.entry = {"path": f"chk-{checkpoint_id:06d}/{name}", "chk": checkpoint_id, "bytes": 0, "sha256": ""}
        self.deltas: dict[int, dict] = {}          # view -> {group: full file's bytes, or delta}
        self.size = 0

    def add(self, view: int, group: int, data: bytes, delta: tuple | None = None) -> dict | None:
        """The entry of the PE's ``.state`` if it takes this group's file (``data``: its bytes as
        a file of its own; ``delta``: ``(puts, deletes)`` when it is a delta, None when it is the
        group whole), else None.

        A delta whose ``puts`` are a dict of the view's values is held as ``data`` unpickled,
        never as those values: the ``.state`` is pickled after the view is released, and from
        then on a ``memory`` state's ``get`` hands out the objects the view held, which an
        operator changes in place (the count window's fold): a restore then found a tuple after
        the barrier already counted (unpickling at most :data:`PACK_DELTA` bytes: a few
        microseconds, in the writer's thread). A backend's own form (disk's ``RawDelta``: its
        stored bytes) is kept as it is."""
        if len(data) > PACK_DELTA or self.size + len(data) > PACK_MAX:
            return None
        if delta is None:
            self.deltas.setdefault(view, {})[group] = data
        else:
            puts, deletes = unpack_delta(data) if type(delta[0]) is dict else delta    # (the state's objects)
            self.deltas.setdefault(view, {})[group] = (puts, list(deletes)) if deletes else puts
        self.size += len(data)
        return self.entry


def unpack_packed(deltas: dict, name: str, group: int) -> bytes | tuple[dict, Any]:
    """View ``name``'s (``<pe>.<n>``) file of ``group`` among a ``.state`` file's (:class:`_Pack`):
    a full file's bytes, or a delta's ``(puts, deleted keys)``."""
    try:
        delta = deltas[int(name.rsplit(".", 1)[1])][group]
        return (delta, ()) if type(delta) is dict else delta
    except KeyError:
        raise CheckpointDamaged(f"the .state file a chain of {name} names holds no delta of group {group}") from None


def pack_delta(puts: dict, deletes: list) -> bytes:
    """A delta file's bytes: ``puts`` alone when no key was deleted (else ``(puts, deletes)``),
    pickled without protocol 4's frame header (9 bytes; the unpickler takes a pickle with or
    without frames). A steady checkpoint at 10^3-10^4 keys writes deltas of one or two keys, and
    ``((puts, []))`` framed was ~36 bytes, half of it overhead. A larger one is compressed (zlib,
    level 1, the GIL let go) as a disk store's full file is (``disk.RawPart``): a group's delta
    after 1 % of 10^7 keys changed (780 keys) 2.4-2.8x fewer bytes."""
    data = pickle.dumps(puts if not deletes else (puts, deletes), _PICKLE)
    if len(data) < 1 << 16 and data[2:3] == pickle.FRAME:     # one frame: its header is the only one
        data = data[:2] + data[11:]
    if len(data) > SQUEEZE_DELTA:
        squeezed = zlib.compress(data, 1)
        if len(squeezed) < len(data):
            return squeezed
    return data


def unpack_delta(data: bytes) -> tuple[dict, Any]:
    """``(puts, deleted keys)`` of a delta file (:func:`pack_delta`'s, or earlier versions' pair;
    a pickle starts with its PROTO opcode, a zlib stream with 0x78)."""
    delta = pickle.loads(zlib.decompress(data) if data[:1] == b"\x78" else data)
    return (delta, ()) if type(delta) is dict else delta


def still_restored(restored: dict, run: str) -> tuple[dict, list]:
    """Key groups a lazy restore has not loaded yet (``GroupsSnapshot.restored``: unchanged
    since the checkpoint they were restored from) as a new checkpoint holds them: ``({group:
    (key, GroupRef)}, manifest entries of their files)``; the entries name their run when it is
    not ``run`` (a run started from another's checkpoint: its files stay where they are)."""
    groups, entries = {}, []
    for g, (key, ref) in restored.items():
        groups[g] = (key, replace(ref, files=()))
        entries += [{**e, "role": "group", **({"run": ref.run} if ref.run != run else {})} for e in ref.files]
    return groups, entries


SLICE_KEYS = 4096      # changed keys the writer reads or sorts by group in one call


def slices(keys: Iterable, size: int = SLICE_KEYS) -> Iterator[list]:
    """``keys`` as lists of at most ``size``, so that the thread reading them lets the GIL
    go between two. One call over all of them holds it whole: ``dict.fromkeys`` of memory's
    :class:`~pescheduler.state.memory._Keys` (a generator's ``yield from`` of a dict, which never
    checks for a switch) held the PE's thread 0.5 s per 10^6 keys changed, and at 10^7 keys a
    steady checkpoint reads 10^5 of them (1 %) before its first file; the keys sorted by group
    (``by_group``: a list, numpy's array and back) the same way."""
    it = iter(keys)
    while part := list(itertools.islice(it, size)):
        yield part
        give_way()                      # a checkpoint's writer waits for the PEs' turns (foreground.py)


def _more_than(chains: dict, count: int, changed: Iterator) -> bool:
    """Whether more keys changed (``changed``: each snapshot's keys) than ``chains`` hold: then
    their deltas would outgrow their full files, and the groups are written whole without reading
    the keys by group first. After a fill that came after the last complete checkpoint that read
    was O(keys filled), in every attempt, before its first file (bench 10^6: attempts aborted
    with no file written)."""
    held = sum(c.keys for c in chains.values())
    if count > held:
        return True
    changed = list(changed)
    try:                                # at most as many as each one's ``most`` (a disk store's Written):
        if count + sum(k.most if hasattr(k, "most") else len(k) for k in changed) <= held:
            return False                # no keys made one dict to count them
    except TypeError:                   # a backend's keys without a length: read them as before
        return False
    for keys in changed:
        try:
            count += len(keys)
        except TypeError:               # a backend's keys without a length: read them as before
            return False
        if count > held:
            return True
    return False


class _Later:
    """The groups of one view that an aborted checkpoint wrote after the last complete one: for
    each, its chain and the keys changed since (by snapshot number, each read once)."""

    def __init__(self, writer: ChainWriter, changes: Changes, view: StateView) -> None:
        self.writer, self.changes, self.view = writer, changes, view
        with writer._lock:
            self.kept = dict(writer._kept.get(changes.token, {}))
        self._by_seq: dict[int, tuple | None] = {}

    def since(self, g: int) -> tuple[dict, dict, set] | None:
        """``_chain``'s ``since`` for group ``g`` from its kept chain, or None (none, or a
        snapshot since it was not seen here)."""
        kept = self.kept.get(g)
        if kept is None or kept.seq > self.changes.seq:
            return None
        if kept.seq not in self._by_seq:
            chains = {h: k.chain for h, k in self.kept.items() if k.seq == kept.seq}
            changed = self.writer._changed(self.changes, kept.seq, chains, self.view.by_group)
            self._by_seq[kept.seq] = None if changed is None else \
                (changed[1], changed[2], {h: c for h, c in changed[0].items() if c.adopted})
        changed = self._by_seq[kept.seq]
        if changed is None:
            return None
        keys, whole, adopted = changed      # a group an import brought since the kept chain: from it
        return {g: adopted.get(g, kept.chain)}, keys, whole


# -- the restore, on the worker ---------------------------------------------------------------------

def read_group(files: StateFiles, ref: GroupRef, local: LocalCopies | None = None,
               packs: dict | None = None, counts: list | None = None) -> tuple[bytes | dict, int]:
    """One key group from its chain, every file checked first (a local copy when there is a good
    one): its full file's bytes (:func:`pack_group`'s) when it has no delta, else its entries with
    the deltas applied (not packed again: ``import_groups`` takes either); and how many files were
    read locally. A ``.state`` file holding a delta (:class:`_Pack`) is read once into ``packs``
    (given: a restore's, for all its groups) and its group's delta taken from it. ``counts``
    (:func:`_resolved`'s): its third counts the files read from the storage."""
    datas, here = [], 0
    packs = {} if packs is None else packs
    for entry, view in zip(ref.files, ref.views):
        packed = entry["path"].endswith(".state")
        deltas = packs.get((ref.run, entry["path"])) if packed else None
        if deltas is None:
            data = None if local is None else local.read(ref.run, entry)
            here += data is not None
            if data is None:
                data = files.read(entry, ref.run)
                if counts is not None:
                    counts[2] += 1
            if packed:
                deltas = packs[(ref.run, entry["path"])] = load_state_file(data).get("deltas", {})
        datas.append(unpack_packed(deltas, view, ref.group) if packed else data)
    if len(datas) == 1:
        return datas[0], here
    entries = unpack_group(datas[0])
    for data in datas[1:]:
        puts, deletes = unpack_delta(data) if type(data) is bytes else data     # a tuple: from a .state
        for key in deletes:
            entries.pop(key, None)
        entries.update(puts)
    return entries, here


def resolve_restore(restore: dict, local: LocalCopies | None = None) -> tuple[int, int]:
    """In place: the :class:`GroupRef` in each operator's saved state (``spec.restore``) replaced
    by its key group's bytes, read from the storage its ``"storage"`` names or from this
    worker's copies (in a worker thread, before the PE is built). ``(files, read locally)``."""
    counts, packs = [0, 0, 0], {}
    for saved in restore.values():
        storage = saved.get("storage")
        if storage is not None:
            saved["state"] = _resolved(saved["state"], StateFiles(storage), local, counts, packs=packs)
    return counts[0], counts[1]


def resolve_part(state: Any, storage: str, local: LocalCopies | None = None,
                 prepare: Callable[[int, dict], Any] | None = None, packs: dict | None = None,
                 counts: list | None = None) -> Any:
    """A lazy restore's one part (``worker/lazy_restore.py``): ``state`` (an operator's saved state
    cut down to a few key groups) with each :class:`GroupRef` replaced by its group's entries, read,
    checked and unpickled here, in the worker thread that calls it; ``prepare(group, entries)``,
    when given, makes them ready for the store here too (the backend's ``prepare_group``), so the
    PE's turn that imports them only installs them. ``packs``: the packs read so far by this
    restore (:func:`read_group`), kept across its parts; ``counts``: ``[files named, read from
    this worker's copies, read from the storage]`` (a pack of small files is read once for all it
    holds), added to."""
    return _resolved(state, StateFiles(storage), local, [0, 0, 0] if counts is None else counts,
                     unpacked=prepare or True, packs=packs)


def _read_from(prepared: Any, ref: GroupRef) -> Any:
    """``prepared`` (a backend's ``PreparedEntries``) naming the files it was read from
    (:class:`~pescheduler.state.base.Received`'s ``ref``): the restored state's checkpoints grow
    that chain (``ChainWriter._adopted``). After a SIGKILL at 10^7 keys the checkpoints during and
    after the lazy restore rewrote every group whole as it came in (14-32 a checkpoint, 1.6-4.3 s)."""
    return came_from(prepared, ref=ref) if ref.files else prepared


def ref_groups(value: Any) -> set[int]:
    """The key groups of every :class:`GroupRef` in an operator's saved state (none: nothing to
    read lazily)."""
    if type(value) is GroupRef:
        return {value.group}
    if type(value) is dict:
        return set().union(*map(ref_groups, value.values())) if value else set()
    if type(value) in (list, tuple):
        return set().union(*map(ref_groups, value)) if value else set()
    return set()


def _resolved(value: Any, files: StateFiles, local: LocalCopies | None, counts: list,
              unpacked: bool | Callable[[int, dict], Any] = False, packs: dict | None = None) -> Any:
    """``unpacked``: each group's entries as a dict, or (a callable) what it makes of them."""
    if type(value) is GroupRef:
        data, here = read_group(files, value, local, packs, counts)
        counts[0] += len(value.files)
        counts[1] += here
        if not unpacked:
            return data
        if callable(unpacked):              # a lazy restore's: its chain goes on from these files
            return _read_from(unpack_prepared(value.group, data, unpacked), value)
        return data if type(data) is dict else unpack_group(data)
    if type(value) is dict:
        return {k: _resolved(v, files, local, counts, unpacked, packs) for k, v in value.items()}
    if type(value) in (list, tuple):
        return type(value)(_resolved(v, files, local, counts, unpacked, packs) for v in value)
    return value
