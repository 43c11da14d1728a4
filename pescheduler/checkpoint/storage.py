"""Where checkpoints live: any fsspec URL (a local directory by default, ``memory://`` in tests).

Layout under the storage root (docs/checkpoints.md), one directory per run as
Flink's ``<dir>/<job-id>/chk-N``::

    run-20261128T004512123456-3fa9c1/      one run of the app (made by deploy)
        chk-000001/                        one directory per checkpoint id
            <pe>.state                     a PE's operator states and source positions (cloudpickle),
                                           keyed state as references to key-group files
            <pe>.<n>.g<NNN>.full|.delta    one key group of a KEYED operator: whole, or what changed
                                           (written by the worker; later manifests may reference it)
            placement.pkl                  the placement that took it, operator parameters left out
            MANIFEST.json                  written last, fsynced, atomically: the checkpoint is complete
            LINK.json                      a manifest no longer kept, that kept ones' walks still read
        chk-000002/...

A run writes, prunes and (on recovery) restores only its own directory, plus
the one checkpoint of another run it was explicitly started from (``origin``),
so two runs of one app never touch each other's files and a fresh run never
restores a previous run's state. The manifest lists each file with its size,
SHA-256 and the checkpoint it lives in (a later incremental checkpoint can
list files of earlier ones) and is signed (HMAC-SHA256 with a key that never
touches the storage, keys.py): a file is proven written by this deployment
when its digest matches the signed manifest's, which needs no key where the
file is written (a worker can write its own). Nothing is unpickled before that. On a local disk files are created
owner-only (0600, directories 0700) and fsynced before the manifest, which is
written to a temporary name, fsynced, renamed and its directory fsynced; on
object stores a single PUT of the final object is atomic as well.

A manifest holds what changed since its predecessor's (the previous one this
store wrote: its id and SHA-256, ``base``): the files listed since and the
files dropped, not every file referenced (at 10^3 keys a whole list was 44.5
KB a checkpoint, more than the state). A restore and retention walk back
(:meth:`CheckpointStore.manifest`), at most :data:`TURNS` manifests: each
file still referenced is listed again at its turn (a slice of the files per
manifest, by a hash of its path, as the key-group maps' turns), so every
referenced file is listed in the newest ``TURNS`` manifests, and no manifest
restates them all at once (``bench/state.py``'s column is the largest
checkpoint). Delta Lake's log does the same with a whole checkpoint every ten
commits; a whole list at once is what the turns avoid.
"""

from __future__ import annotations

import base64
import hashlib
import json
import logging
import os
import re
import secrets
import time
import uuid
import zlib
from dataclasses import dataclass
from typing import Any

from ..errors import CheckpointDamaged, CheckpointError
from ..state.files import CHECKPOINT_DIR, StateFiles, physical
from .keys import sign, signed_by

logger = logging.getLogger(__name__)

MANIFEST = "MANIFEST.json"
LINK = "LINK.json"            # a pruned checkpoint's manifest, kept while a kept one's walk reads it
FORMAT = 3                    # manifest format: what changed since the predecessor's (2: every file)
TURNS = 48                    # a referenced file is listed again every TURNS manifests: a walk reads at most TURNS
                              # (as many as a key-group map's walk reads .state files at max-deltas 48: the
                              # directories a kept checkpoint reaches are much the same)
_RUN = re.compile(r"run-[0-9T]+-[0-9a-f]+$")


def default_location(app_name: str) -> str:
    """``<state-dir>/../checkpoints/<app name>``: a local directory the user can find."""
    from .. import config

    base = os.path.dirname(os.path.expanduser(config.get("state-dir")).rstrip("/"))
    return os.path.join(base, "checkpoints", app_name)


def new_run_id() -> str:
    """``run-<UTC time to the microsecond>-<random>``: runs sort by their start."""
    now = time.time()
    stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime(now)) + f"{int(now % 1 * 1e6):06d}"
    return f"run-{stamp}-{secrets.token_hex(3)}"


def manifest_at(url: str, key: bytes | None = None) -> dict:
    """The manifest of the checkpoint whose directory is ``url`` (``dep.checkpoints()``'s ``url``),
    walked and checked as a restore reads it (``key``: this machine's checkpoint key)."""
    from .keys import checkpoint_key

    run_dir, _, folder = str(url).rstrip("/").rpartition("/")
    storage, _, run = run_dir.rpartition("/")
    return CheckpointStore(storage, key or checkpoint_key(), run).manifest(int(CHECKPOINT_DIR.search(folder).group(1)))


def canonical(body: dict) -> bytes:
    """The bytes a manifest's signature covers (JSON, keys sorted)."""
    return json.dumps(body, sort_keys=True, separators=(",", ":")).encode()


class CheckpointStore:
    """One run's checkpoints under one fsspec URL, and the checkpoint it started from (``origin``)."""

    def __init__(self, url: str, key: bytes, run: str | None = None) -> None:
        self.storage = str(url).rstrip("/")
        self.key = key
        self.run = run or new_run_id()
        self.origin: tuple[str, int] | None = None    # (run, id) this run was started from
        self.borrowed: dict[int, str] = {}            # id -> run: other runs' checkpoints it may restore
        self.files = StateFiles(self.storage)         # the integrity rules (state/files.py)
        self.fs, self.root, self.local = self.files.fs, self.files.root, self.files.local
        self.files.makedirs(self.root)
        self.prune_error: str | None = None           # the last pruning failure (retried next time)
        self._committed: dict[str, dict] = {}         # name -> entry of the newest manifest written here
        self._newest: _Newest | None = None           # that manifest: what the next one is written against
        self._checked: dict[tuple, dict] = {}         # (id, SHA-256 of its bytes) -> a manifest verified: a
                                                      # prune walks retain x TURNS of them at each checkpoint

    @property
    def url(self) -> str:
        """This run's directory."""
        return f"{self.storage}/{self.run}"

    # -- paths ------------------------------------------------------------------------------
    def _run_dir(self, run: str) -> str:
        return f"{self.root}/{run}"

    def _dir(self, checkpoint_id: int, run: str | None = None) -> str:
        return f"{self._run_dir(run or self.borrowed.get(checkpoint_id, self.run))}/chk-{checkpoint_id:06d}"

    def describe(self, checkpoint_id: int) -> str:
        """``checkpoint 12 of run run-... in URL``: which files a restore reads."""
        return f"checkpoint {checkpoint_id} of run {self.borrowed.get(checkpoint_id, self.run)} in {self.storage}"

    def start_from(self, restore: Any) -> None:
        """Start this run from the checkpoint ``restore`` names (:meth:`resolve`). With ``"latest"``
        the older complete checkpoints of that run are kept to fall back on if it proves damaged
        when read; an id named explicitly is restored or fails."""
        run, checkpoint_id = self.origin = self.resolve(restore)
        older = [i for i in self.completed(run) if i < checkpoint_id] if restore == "latest" else []
        self.borrowed = {i: run for i in [*older, checkpoint_id]}

    # -- writing ----------------------------------------------------------------------------
    def put(self, checkpoint_id: int, name: str, data: bytes, reuse: bool = False) -> dict:
        """Store one file of checkpoint ``checkpoint_id``; its manifest entry (path relative to the
        run, the checkpoint it lives in, size, SHA-256: the signed manifest vouches for it). With
        ``reuse``, when the newest manifest written here lists a file of that name with these very
        bytes, its entry instead: the new manifest references it, as an unchanged key group's (the
        placement between rescales: 1.2 KB a checkpoint, 7 % of a 10^3-key state)."""
        if reuse:
            earlier = self._committed.get(name)
            if earlier is not None and earlier["bytes"] == len(data) and \
                    earlier["sha256"] == hashlib.sha256(data).hexdigest():
                return {k: earlier[k] for k in ("path", "chk", "bytes", "sha256")}
        return StateFiles(self.url).put(checkpoint_id, name, data)

    def commit_manifest(self, checkpoint_id: int, manifest: dict) -> int:
        """Sign and write the manifest last (temporary name, fsync, rename, fsync the directory):
        the checkpoint is complete; the bytes it took. Its files must be written (and synced)
        before. ``manifest["files"]`` lists every file the checkpoint references; what is written
        is what changed since the newest manifest written here (its ``base``), with the files at
        their turn listed again (module docstring), or every file when there is none."""
        files = {e["path"]: e for e in manifest.get("files", ())}
        placement, prev = manifest.get("placement"), self._newest
        body = {k: v for k, v in manifest.items() if k != "files"}
        seq = 0 if prev is None else prev.seq + 1
        if prev is None:
            listed, dropped = list(files.values()), []
        else:
            listed = [e for p, e in files.items() if not _same(prev.files.get(p), e) or _turn(p, seq, TURNS)]
            dropped = [p for p in prev.files if p not in files]
            body["base"] = {"id": prev.id, "sha256": prev.sha256}
            if placement == prev.placement and seq % TURNS:   # (as turns: the walk's newest manifest says how many)
                body.pop("placement", None)          # unchanged: the walk finds it at most TURNS back
        body.update(format=FORMAT, run=self.run, seq=seq, turns=TURNS, listed=_packed(listed, checkpoint_id, placement),
                    dropped=_folders(dropped))
        body = json.loads(json.dumps(body, default=repr))
        data = json.dumps({**body, "hmac": sign(self.key, canonical(body))}, separators=(",", ":")).encode()
        where = self._dir(checkpoint_id)
        self.files.makedirs(where)
        self.files.sync_dir(where)                    # the state files' names are durable first
        tmp = f"{where}/.{MANIFEST}.{uuid.uuid4().hex}"
        self.files.write(tmp, data)
        self.fs.mv(tmp, f"{where}/{MANIFEST}")
        self.files.sync_dir(where)
        self._committed = {e["path"].rsplit("/", 1)[-1]: e for e in files.values()}
        self._newest = _Newest(checkpoint_id, hashlib.sha256(data).hexdigest(), seq, files, placement)
        return len(data)

    # -- reading (verified) -----------------------------------------------------------------
    def manifest(self, checkpoint_id: int, run: str | None = None) -> dict:
        """The manifest, its signature checked (:class:`CheckpointDamaged` if it does not match),
        with ``files`` every file it references: the manifests it builds on walked back (each
        signed, each its successor's ``base`` SHA-256), at most :data:`TURNS`; ``walked`` their ids."""
        doc = self._signed(checkpoint_id, run, (MANIFEST,))
        if "files" in doc:                            # format 2: every file listed
            return doc
        newest, files, gone, walked, placement = doc, {}, set(), [], doc.get("placement")
        while True:
            walked.append(doc["id"])
            for path, packed in _unpacked_listed(doc["listed"]):
                if path not in gone and path not in files:
                    files[path] = packed
            gone.update(p for p in _unpacked_dropped(doc["dropped"]) if p not in files)
            placement = placement if placement is not None else doc.get("placement")
            base = doc.get("base")
            if base is None or newest["seq"] - doc["seq"] >= newest["turns"] - 1:
                break
            try:
                prev = self._signed(base["id"], doc["run"], (MANIFEST, LINK), base["sha256"])
            except CheckpointDamaged as exc:
                raise CheckpointDamaged(f"checkpoint {checkpoint_id}'s manifest builds on checkpoint "
                                        f"{base['id']}'s, which is damaged: {exc}") from None
            if prev.get("seq") != doc["seq"] - 1:
                raise CheckpointDamaged(f"checkpoint {doc['id']}'s manifest builds on {base['id']}'s, "
                                        f"which is not its predecessor (seq {prev.get('seq')})")
            doc = prev
        out = {k: v for k, v in newest.items() if k not in ("listed", "dropped")}
        out["placement"] = placement
        out["files"] = [_entry(p, packed, checkpoint_id, placement) for p, packed in files.items()]
        out["walked"] = walked
        return out

    def _signed(self, checkpoint_id: int, run: str | None, names: tuple, sha256: str | None = None) -> dict:
        """The first of ``names`` there is in checkpoint ``checkpoint_id``'s directory, its
        signature, id and (given) SHA-256 checked; without its ``hmac``."""
        where = self._dir(checkpoint_id, run)
        path = f"{where}/{names[0]}"
        try:
            for name in names:
                path = f"{where}/{name}"
                if name == names[-1] or self.fs.exists(path):
                    break
            raw = self.fs.cat_file(path)
            sha = hashlib.sha256(raw).hexdigest()
            if sha256 is not None and sha != sha256:
                raise CheckpointDamaged(f"{path} is not the manifest its successor was written against (SHA-256)")
            if (checkpoint_id, sha) in self._checked:     # these very bytes verified before
                return dict(self._checked[(checkpoint_id, sha)])
            doc = json.loads(raw)
            digest = doc.pop("hmac")
        except (OSError, ValueError, KeyError, AttributeError, TypeError) as exc:
            raise CheckpointDamaged(f"{path} unreadable: {type(exc).__name__}: {exc}") from None
        if not signed_by(self.key, canonical(doc), digest):
            raise CheckpointDamaged(f"{path} is not signed with this deployment's checkpoint key "
                                    f"(tampered, or written with another key: see pescheduler.checkpoint.key)")
        if doc.get("id") != checkpoint_id:
            raise CheckpointDamaged(f"{path} is checkpoint {doc.get('id')}'s manifest, not {checkpoint_id}'s")
        self._checked[(checkpoint_id, sha)] = doc
        while len(self._checked) > 4 * TURNS:              # prune walks retain x TURNS of them each time
            del self._checked[next(iter(self._checked))]
        return dict(doc)

    def read(self, entry: dict, run: str) -> bytes:
        """A file a (verified) manifest lists, its size and SHA-256 checked before anyone unpickles it."""
        return self.files.read(entry, run)

    def verify(self, checkpoint_id: int, run: str | None = None) -> dict:
        """The manifest, checked, and every file it lists present with its size (no state read)."""
        manifest = self.manifest(checkpoint_id, run)
        for entry in (e for e in manifest["files"] if "data" not in e):    # a small delta is in the manifest
            base = self._run_dir(entry.get("run", manifest["run"]))    # a restored group's file of another run
            path, end = f"{base}/{physical(entry)}", entry.get("at", 0) + entry["bytes"]
            try:
                size = self.fs.size(path)
            except OSError:
                size = None
            if "in" not in entry and size != entry["bytes"]:
                raise CheckpointDamaged(f"{path}: {size} bytes, its manifest says {entry['bytes']}")
            if "in" in entry and (size or 0) < end:          # a segment: the entry's range in it
                raise CheckpointDamaged(f"{path}: {size} bytes, its manifest says {entry['path']} ends at byte "
                                        f"{end} of it")
        return manifest

    # -- listing ----------------------------------------------------------------------------
    def ids(self, run: str | None = None) -> list[int]:
        """Every checkpoint directory's id of ``run`` (this one), complete or not, ascending."""
        try:
            names = self.fs.ls(self._run_dir(run or self.run), detail=False)
        except FileNotFoundError:
            return []
        found = (CHECKPOINT_DIR.search(n.rstrip("/")) for n in names)
        return sorted(int(m.group(1)) for m in found if m)

    def completed(self, run: str | None = None) -> list[int]:
        """Ids of ``run``'s (this run's) complete checkpoints (their manifest exists), ascending."""
        run = run or self.run
        return [i for i in self.ids(run) if self.fs.exists(f"{self._dir(i, run)}/{MANIFEST}")]

    def restorable(self) -> list[int]:
        """What a recovery may restore, oldest first: the checkpoint this run started from (and
        the ones before it to fall back on), then the ones it completed (ids go on from the
        origin's, so they never clash)."""
        return sorted(self.borrowed) + self.completed()

    def next_id(self) -> int:
        return max([0, *self.borrowed, *self.ids()]) + 1

    def runs(self) -> list[str]:
        """The runs in the storage, oldest first."""
        try:
            names = self.fs.ls(self.root, detail=False)
        except FileNotFoundError:
            return []
        return sorted(n.rstrip("/").rsplit("/", 1)[-1] for n in names if _RUN.search(n.rstrip("/")))

    # -- choosing what to restore ------------------------------------------------------------
    def resolve(self, restore: Any) -> tuple[str, int]:
        """The checkpoint ``restore`` names, verified: ``"latest"`` (the newest intact one of the
        newest run that has one; damaged ones are skipped with a logged reason), an id (in the
        newest run that has it complete) or ``"RUN/ID"``."""
        if restore == "latest":
            return self._latest()
        run, wanted = self._parse(restore)
        runs = [run] if run else list(reversed(self.runs()))
        for candidate in runs:
            if wanted in self.completed(candidate):
                try:
                    self.verify(wanted, candidate)
                except CheckpointDamaged as exc:
                    raise CheckpointError(f"checkpoint {wanted} of run {candidate} is damaged: {exc}") from None
                return candidate, wanted
        raise CheckpointError(f"checkpoint {restore} is not complete in {self.storage} "
                              f"(complete ones: {self._listing() or 'none'})")

    def _latest(self) -> tuple[str, int]:
        skipped = []
        for run in reversed(self.runs()):
            for checkpoint_id in reversed(self.completed(run)):
                try:
                    self.verify(checkpoint_id, run)
                    return run, checkpoint_id
                except CheckpointDamaged as exc:
                    logger.warning("checkpoint %s of run %s skipped: %s", checkpoint_id, run, exc)
                    skipped.append(f"{run}/{checkpoint_id}: {exc}")
        damaged = f" (damaged: {'; '.join(skipped)})" if skipped else ""
        raise CheckpointError(f"no complete checkpoint in {self.storage} to restore{damaged}; "
                              f"deploy without --restore to start from the beginning")

    def _parse(self, restore: Any) -> tuple[str | None, int]:
        run, _, number = str(restore).rpartition("/")
        try:
            return run or None, int(number)
        except (TypeError, ValueError):
            raise CheckpointError(f"--restore {restore!r}: give 'latest', a checkpoint id or RUN/ID "
                                  f"(complete ones in {self.storage}: {self._listing() or 'none'})") from None

    def _listing(self) -> str:
        return ", ".join(f"{run}/{i}" for run in self.runs() for i in self.completed(run))

    # -- removing ---------------------------------------------------------------------------
    def discard(self, checkpoint_id: int) -> None:
        """Remove one of this run's checkpoint directories (aborted, or beyond ``retain``)."""
        try:
            self.fs.rm(self._dir(checkpoint_id, self.run), recursive=True)
        except FileNotFoundError:
            pass

    def withdraw(self, checkpoint_id: int) -> None:
        """Remove one of this run's manifests (a checkpoint given up after it was written): it is
        incomplete again, its files left to :meth:`prune` (a later attempt may reference them)."""
        self._committed, self._newest = {}, None      # what put(reuse=True) and the next manifest refer to
        try:
            self.fs.rm(f"{self._dir(checkpoint_id, self.run)}/{MANIFEST}")
        except FileNotFoundError:
            pass

    def prune(self, retain: int) -> list[int]:
        """Keep this run's newest ``retain`` complete checkpoints; remove its older ones and
        incomplete ones older than the newest complete one, except the files a kept one still
        references (an unchanged key group's file: the dropped checkpoint's directory stays,
        without its manifest, until nothing references them). The ids whose directory went. A
        removal that fails is logged (and kept in :attr:`prune_error`) and tried again at the
        next prune: it never stops checkpointing. Other runs' directories are never touched."""
        self.prune_error = None
        try:
            done = self.completed()
            ids = self.ids()
            keep = set(done[-retain:]) if retain > 0 else set()
            if not keep:
                self._committed, self._newest = {}, None    # nothing put(reuse=True) nor a manifest refers to stays
            kept = [self.manifest(i) for i in sorted(keep)]
        except CheckpointDamaged as exc:
            self._newest = None                     # the next manifest lists every file: a chain not through it
            return self._prune_failed(f"a kept checkpoint's manifest is damaged, nothing removed; the next "
                                      f"manifest lists every file: {exc}")
        except OSError as exc:
            return self._prune_failed(f"listing {self.url}: {type(exc).__name__}: {exc}")
        referenced = {physical(e) for m in kept for e in m["files"] if "run" not in e and "data" not in e}
        walked = {i for m in kept for i in m.get("walked", ())} - keep
        newest = done[-1] if done else 0
        gone = []
        for i in (i for i in ids if i not in keep and (i in done or i < newest)):
            try:
                if self._drop(i, referenced, i in walked):
                    gone.append(i)
            except OSError as exc:
                self._prune_failed(f"removing {self._dir(i, self.run)}: {type(exc).__name__}: {exc}")
        return gone

    def _drop(self, checkpoint_id: int, referenced: set[str], walked: bool) -> bool:
        """Remove checkpoint ``checkpoint_id``'s directory, or (while a kept checkpoint references
        some of its files) its manifest and every other file; True if the directory went. A
        manifest a kept one's walk reads stays as :data:`LINK` (not complete: never restored)."""
        prefix = f"chk-{checkpoint_id:06d}/"
        if not walked and not any(p.startswith(prefix) for p in referenced):
            self.discard(checkpoint_id)
            return True
        where = self._dir(checkpoint_id, self.run)
        if walked and self.fs.exists(f"{where}/{MANIFEST}"):
            self.fs.mv(f"{where}/{MANIFEST}", f"{where}/{LINK}")
            self.files.sync_dir(where)
        for path in self.fs.ls(where, detail=False):
            name = path.rstrip("/").rsplit("/", 1)[-1]
            if prefix + name not in referenced and not (walked and name == LINK):
                self.fs.rm(path)
        return False

    def _prune_failed(self, what: str) -> list[int]:
        self.prune_error = f"pruning old checkpoints failed ({what}); tried again after the next checkpoint"
        logger.warning("%s", self.prune_error)
        return []


@dataclass(frozen=True)
class _Newest:
    """The newest manifest a store wrote: what the next one is written against."""

    id: int
    sha256: str                 # of its bytes: the next one's base names it
    seq: int                    # manifests since the last that lists every file
    files: dict                 # path -> entry of every file it references
    placement: dict | None


def _same(a: dict | None, b: dict) -> bool:
    return a is not None and all(a.get(k) == b.get(k) for k in ("bytes", "sha256", "run"))


def _turn(path: str, seq: int, turns: int) -> bool:
    """Whether manifest ``seq`` lists ``path`` again, unchanged: once every ``turns``, the files'
    turns spread by a hash of their path."""
    return zlib.crc32(path.encode()) % turns == seq % turns


def _derived(name: str, chk: int, checkpoint_id: int, placement: dict | None) -> dict:
    """What an entry's name says of it in checkpoint ``checkpoint_id``'s manifest: its role (a
    ``.state`` file of this checkpoint is a PE's state, an earlier one a key-group map it walks),
    its PE and that PE's operators."""
    if name == "placement.pkl":
        return {"role": "placement"}
    if not name.endswith(".state"):
        return {"role": "group"}
    pe = name[:-len(".state")]
    if chk != checkpoint_id:
        return {"role": "map", "pe": pe}
    operators = (placement or {}).get(pe, {}).get("operators")
    return {"role": "state", "pe": pe, **({"operators": operators} if operators is not None else {})}


def _packed(entries: list[dict], checkpoint_id: int, placement: dict | None) -> dict:
    """Entries as a manifest stores them: ``{folder: {name: [bytes, SHA-256 in base64, extras?]}}``,
    what the name says (:func:`_derived`) left out (~70 bytes a file, ~150 as a JSON dict); a
    small delta's bytes (``state.files.INLINE``) in place of its digest, after a ``=``."""
    out: dict = {}
    for e in entries:
        folder, name = e["path"].split("/", 1)
        derived = _derived(name, int(folder[4:]), checkpoint_id, placement)
        extra = {k: v for k, v in e.items()
                 if k not in ("path", "chk", "bytes", "sha256", "data") and derived.get(k) != v}
        sha = "=" + e["data"] if "data" in e else base64.b64encode(bytes.fromhex(e["sha256"])).decode().rstrip("=")
        out.setdefault(folder, {})[name] = [e["bytes"], sha, *([extra] if extra else [])]
    return out


def _unpacked_listed(listed: dict):
    for folder, names in listed.items():
        for name, packed in names.items():
            yield f"{folder}/{name}", packed


def _folders(paths: list[str]) -> dict:
    out: dict = {}
    for p in paths:
        folder, name = p.split("/", 1)
        out.setdefault(folder, []).append(name)
    return out


def _unpacked_dropped(dropped: dict):
    return (f"{folder}/{name}" for folder, names in dropped.items() for name in names)


def _entry(path: str, packed: list, checkpoint_id: int, placement: dict | None) -> dict:
    """A stored entry (:func:`_packed`) as the one the manifest was given."""
    size, sha, *extra = packed
    folder, name = path.split("/", 1)
    chk = int(folder[4:])
    inline = {"data": sha[1:]} if sha.startswith("=") else {}      # a small delta's bytes: its digest from them
    digest = hashlib.sha256(base64.b64decode(sha[1:])) if inline else None
    digest = digest.hexdigest() if inline else base64.b64decode(sha + "=" * (-len(sha) % 4)).hex()
    return {"path": path, "chk": chk, "bytes": size, "sha256": digest, **inline,
            **_derived(name, chk, checkpoint_id, placement), **(extra[0] if extra else {})}
