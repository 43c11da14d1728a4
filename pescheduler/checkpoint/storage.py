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
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import secrets
import time
import uuid
from typing import Any

from ..errors import CheckpointDamaged, CheckpointError
from ..state.files import StateFiles
from .keys import sign, signed_by

logger = logging.getLogger(__name__)

MANIFEST = "MANIFEST.json"
FORMAT = 2                    # manifest format: per-run layout, signed files
_DIR = re.compile(r"chk-(\d+)$")
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

    def commit_manifest(self, checkpoint_id: int, manifest: dict) -> None:
        """Sign and write the manifest last (temporary name, fsync, rename, fsync the directory):
        the checkpoint is complete. Its files must be written (and synced) before."""
        body = json.loads(json.dumps({**manifest, "format": FORMAT, "run": self.run}, default=repr))
        data = json.dumps({**body, "hmac": sign(self.key, canonical(body))}, indent=1).encode()
        where = self._dir(checkpoint_id)
        self.files.makedirs(where)
        self.files.sync_dir(where)                    # the state files' names are durable first
        tmp = f"{where}/.{MANIFEST}.{uuid.uuid4().hex}"
        self.files.write(tmp, data)
        self.fs.mv(tmp, f"{where}/{MANIFEST}")
        self.files.sync_dir(where)
        self._committed = {e["path"].rsplit("/", 1)[-1]: e for e in manifest.get("files", ())}

    # -- reading (verified) -----------------------------------------------------------------
    def manifest(self, checkpoint_id: int, run: str | None = None) -> dict:
        """The manifest, its signature checked (:class:`CheckpointDamaged` if it does not match)."""
        where = self._dir(checkpoint_id, run)
        try:
            doc = json.loads(self.fs.cat_file(f"{where}/{MANIFEST}"))
            digest = doc.pop("hmac")
        except (OSError, ValueError, KeyError, AttributeError) as exc:
            raise CheckpointDamaged(f"{where}/{MANIFEST} unreadable: {type(exc).__name__}: {exc}") from None
        if not signed_by(self.key, canonical(doc), digest):
            raise CheckpointDamaged(f"{where}/{MANIFEST} is not signed with this deployment's checkpoint key "
                                    f"(tampered, or written with another key: see pescheduler.checkpoint.key)")
        if doc.get("id") != checkpoint_id:
            raise CheckpointDamaged(f"{where}/{MANIFEST} is checkpoint {doc.get('id')}'s manifest, not {checkpoint_id}'s")
        return doc

    def read(self, entry: dict, run: str) -> bytes:
        """A file a (verified) manifest lists, its size and SHA-256 checked before anyone unpickles it."""
        return self.files.read(entry, run)

    def verify(self, checkpoint_id: int, run: str | None = None) -> dict:
        """The manifest, checked, and every file it lists present with its size (no state read)."""
        manifest = self.manifest(checkpoint_id, run)
        for entry in manifest["files"]:
            base = self._run_dir(entry.get("run", manifest["run"]))    # a restored group's file of another run
            try:
                size = self.fs.size(f"{base}/{entry['path']}")
            except OSError:
                size = None
            if size != entry["bytes"]:
                raise CheckpointDamaged(f"{base}/{entry['path']}: {size} bytes, its manifest says {entry['bytes']}")
        return manifest

    # -- listing ----------------------------------------------------------------------------
    def ids(self, run: str | None = None) -> list[int]:
        """Every checkpoint directory's id of ``run`` (this one), complete or not, ascending."""
        try:
            names = self.fs.ls(self._run_dir(run or self.run), detail=False)
        except FileNotFoundError:
            return []
        found = (_DIR.search(n.rstrip("/")) for n in names)
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
        self._committed = {}                          # what put(reuse=True) refers to must stay complete
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
                self._committed = {}                  # nothing put(reuse=True) may refer to stays
            referenced = {e["path"] for i in keep for e in self.manifest(i)["files"] if "run" not in e}
        except (OSError, CheckpointDamaged) as exc:
            return self._prune_failed(f"listing {self.url}: {type(exc).__name__}: {exc}")
        newest = done[-1] if done else 0
        gone = []
        for i in (i for i in ids if i not in keep and (i in done or i < newest)):
            try:
                if self._drop(i, referenced):
                    gone.append(i)
            except OSError as exc:
                self._prune_failed(f"removing {self._dir(i, self.run)}: {type(exc).__name__}: {exc}")
        return gone

    def _drop(self, checkpoint_id: int, referenced: set[str]) -> bool:
        """Remove checkpoint ``checkpoint_id``'s directory, or (while a kept checkpoint references
        some of its files) its manifest and every other file; True if the directory went."""
        prefix = f"chk-{checkpoint_id:06d}/"
        if not any(p.startswith(prefix) for p in referenced):
            self.discard(checkpoint_id)
            return True
        where = self._dir(checkpoint_id, self.run)
        for path in self.fs.ls(where, detail=False):
            if prefix + path.rstrip("/").rsplit("/", 1)[-1] not in referenced:
                self.fs.rm(path)
        return False

    def _prune_failed(self, what: str) -> list[int]:
        self.prune_error = f"pruning old checkpoints failed ({what}); tried again after the next checkpoint"
        logger.warning("%s", self.prune_error)
        return []
