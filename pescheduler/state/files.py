"""Checkpoint files under one fsspec URL, written and read with the integrity rules of every one.

Both sides of a checkpoint use it: a worker writes its PEs' state files
straight into the checkpoint storage (``state/incremental.py``), the
deploying process writes the placement and the signed manifest
(``checkpoint/storage.py``); whoever reads a file checks it against its
manifest entry. Neutral ground: ``worker/`` may not import ``checkpoint/``.

The rules: on a local disk directories are created owner-only (0700), files
owner-only (0600) and fsynced before anything names them; an entry is
``{"path", "chk", "bytes", "sha256"}`` (path relative to the run's directory);
a read checks size and SHA-256 before anyone unpickles the bytes.

A key-group delta of at most :data:`INLINE` bytes is not a file: its entry
carries its bytes (``"data"``, base64), and the signed manifest with it. At
10^3-10^4 keys with 1 % changed, a steady checkpoint's deltas hold one key
each (~17 bytes), and each was a file (one fsync) whose manifest entry, its
SHA-256 above all, was four times its size.

A checkpoint's key-group files of one PE are written back to back into one
file, a segment (:class:`Segment`, Flink's file merging): an entry names its
segment (``"in"``, a file in the same folder) and where its bytes start in it
(``"at"``), and is read as that range. At 10^7 keys a steady checkpoint wrote
about 130 files a PE, each a new inode and an fsync: a fifth of the writer's
CPU, most of it ext4 looking for a free inode among those retention had just
deleted (docs/state-log.md, session 55). A segment is a file as long as any entry
in it is referenced (retention and local copies go by :func:`physical`).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
import re

import fsspec
from fsspec.implementations.local import LocalFileSystem

from ..errors import CheckpointDamaged

CHECKPOINT_DIR = re.compile(r"chk-(\d+)$")     # a checkpoint's folder (chk-000042) at the end of a path: its id

CHUNK = 1 << 20           # bytes hashed at a time when a file is checked without being kept
INLINE = 48               # a .delta file this small is carried in its entry (and the manifest), not written
SEGMENT_MAX = 64 << 20    # a segment holds files until this many bytes; the next file starts another
PART_BYTES = 8 << 20      # on an object store a segment goes up in parts of this many bytes as it is
                          # written (S3's multipart upload: 5 MiB a part at least)


def physical(entry: dict) -> str:
    """The path (relative, as ``entry["path"]``) of the file that holds ``entry``'s bytes: its
    own, or the segment it is in (``"in"``, in the same folder)."""
    segment = entry.get("in")
    return entry["path"] if segment is None else f"{entry['path'].rsplit('/', 1)[0]}/{segment}"


class StateFiles:
    """Files under ``url`` (a run's directory, or the storage root): put, read and check them."""

    def __init__(self, url: str) -> None:
        self.url = str(url).rstrip("/")
        self.fs, root = fsspec.core.url_to_fs(self.url)
        self.root = root.rstrip("/")
        self.local = isinstance(self.fs, LocalFileSystem)
        # bytes of the files put so far, through :meth:`put` or a segment's (a small delta carried in
        # its entry too): a checkpoint writer's progress, read from another thread (the worker's
        # ``pe_ckpt_progress``; the coordinator aborts a write only once it stops growing)
        self.written = 0

    def makedirs(self, path: str) -> None:
        """``path`` (absolute in the file system) and its missing parents; locally each 0700."""
        if not self.local:
            self.fs.makedirs(path, exist_ok=True)
            return
        missing = []
        while path and not os.path.isdir(path):
            missing.append(path)
            path = os.path.dirname(path)
        for directory in reversed(missing):
            try:
                os.mkdir(directory, 0o700)
            except FileExistsError:
                pass

    def write(self, path: str, data: bytes) -> None:
        """Write ``path`` (absolute) whole; on a local disk owner-only and fsynced."""
        if not self.local:
            self.fs.pipe_file(path, data)
            return
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())

    def sync_dir(self, path: str) -> None:
        """Make the names in a local directory durable (a no-op on object stores)."""
        if self.local:
            fd = os.open(path, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)

    def put(self, checkpoint_id: int, name: str, data: bytes) -> dict:
        """``chk-NNNNNN/name`` under this run's directory; its manifest entry (a small delta's
        carries its bytes instead: :data:`INLINE`)."""
        entry = _entry(checkpoint_id, name, data)
        if "data" not in entry:
            folder = f"{self.root}/chk-{checkpoint_id:06d}"
            self.makedirs(folder)
            self.write(f"{folder}/{name}", data)
        self.written += len(data)
        return entry

    def read(self, entry: dict, run: str | None = None) -> bytes:
        """The file ``entry`` names (under ``run``'s directory when this is the storage root),
        its size and SHA-256 checked against the entry before anyone unpickles it."""
        path, at = self._path(entry, run), entry.get("at", 0)
        try:
            data = base64.b64decode(entry["data"]) if "data" in entry else \
                self.fs.cat_file(path, start=at, end=at + entry["bytes"]) if "in" in entry else self.fs.cat_file(path)
        except OSError as exc:
            raise CheckpointDamaged(f"{path} unreadable: {type(exc).__name__}: {exc}") from None
        matches(_named(path, entry), len(data), hashlib.sha256(data).hexdigest(), entry)
        return data

    def check(self, entry: dict, run: str | None = None) -> None:
        """:meth:`read`'s checks, the file hashed in chunks and not kept (memory independent of its size)."""
        if "data" in entry:
            self.read(entry, run)
            return
        path, digest, size = self._path(entry, run), hashlib.sha256(), 0
        left = entry["bytes"] if "in" in entry else None     # a segment's range, else the file
        try:
            with self.fs.open(path, "rb") as f:
                f.seek(entry.get("at", 0))
                while chunk := f.read(CHUNK if left is None else min(CHUNK, left)):
                    digest.update(chunk)
                    size += len(chunk)
                    if left is not None and not (left := left - len(chunk)):
                        break
        except OSError as exc:
            raise CheckpointDamaged(f"{path} unreadable: {type(exc).__name__}: {exc}") from None
        matches(_named(path, entry), size, digest.hexdigest(), entry)

    def _path(self, entry: dict, run: str | None) -> str:
        return f"{self.root}/{run}/{physical(entry)}" if run else f"{self.root}/{physical(entry)}"

    def segment(self, checkpoint_id: int, name: str) -> "Segment":
        """A :class:`Segment` of checkpoint ``checkpoint_id`` named ``name`` (a PE's id)."""
        return Segment(self, checkpoint_id, name)


class Segment:
    """One writer's files of one checkpoint, back to back in one file of the checkpoint's folder
    (``<name>.seg<n>``, another past :data:`SEGMENT_MAX`). :meth:`put` answers each one's entry
    (``"in"``: the segment's name, ``"at"``: where its bytes start); :meth:`close` syncs the
    segment, which must come before anything names its entries. Locally the bytes are written as
    they come (a file descriptor held open); on an object store through the file system's writer
    (``fs.open(..., "wb")``), which uploads a part each :data:`PART_BYTES` (s3fs: a multipart
    upload) and completes the object at :meth:`close`. So a writer holds one part, not the whole
    segment (up to 64 MB a PE before), and its count of bytes written grows as parts go up (the
    coordinator aborts a write that stops growing it)."""

    def __init__(self, files: StateFiles, checkpoint_id: int, name: str) -> None:
        self.files, self.checkpoint_id, self.name = files, checkpoint_id, name
        self.folder = f"{files.root}/chk-{checkpoint_id:06d}"
        self.names: list[str] = []      # the segments begun, in order
        self._out = None                # the one being written: a local file, or an object store's writer
        self._size = 0

    def put(self, name: str, data: bytes) -> dict:
        """``name``'s bytes at the end of the segment; its entry (a small delta's carries its
        bytes instead, as :meth:`StateFiles.put`'s)."""
        entry = _entry(self.checkpoint_id, name, data)
        if "data" not in entry:
            if self._out is None or self._size + len(data) > SEGMENT_MAX and self._size:
                self._next()
            self._out.write(data)
            entry.update({"in": self.names[-1], "at": self._size})
            self._size += len(data)
        self.files.written += len(data)
        return entry

    def _next(self) -> None:
        self.close()
        self.names.append(f"{self.name}.seg{len(self.names)}")
        if self.files.local:
            self.files.makedirs(self.folder)
            fd = os.open(f"{self.folder}/{self.names[-1]}", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            self._out = os.fdopen(fd, "wb")
        else:
            self._out = self.files.fs.open(f"{self.folder}/{self.names[-1]}", "wb", block_size=PART_BYTES)
        self._size = 0

    def close(self) -> None:
        """Write out (and sync) the segment being written: its entries may be named from now on."""
        out, self._out = self._out, None
        if out is None:
            return
        if not self.files.local:
            out.close()                 # the last part, and the object completed
            return
        with out:
            out.flush()
            os.fsync(out.fileno())

    def abort(self) -> None:
        """Let the segment being written go unsynced (its entries are named by nothing); on an
        object store its upload aborted (s3fs's ``discard``: no part left stored and billed), not
        completed: its writer is then marked closed, since closing it would upload the rest."""
        out, self._out = self._out, None
        if out is None:
            return
        discard = getattr(out, "discard", None)        # an object store's writer (a local file has none)
        if discard is None:
            out.close()
            return
        try:
            discard()
        finally:
            out.closed = True


def _entry(checkpoint_id: int, name: str, data: bytes) -> dict:
    """The manifest entry of file ``chk-NNNNNN/name`` holding ``data``, with its bytes when it is
    a delta of at most :data:`INLINE` bytes (carried in the manifest, not written)."""
    entry = {"path": f"chk-{checkpoint_id:06d}/{name}", "chk": checkpoint_id, "bytes": len(data),
             "sha256": hashlib.sha256(data).hexdigest()}
    if len(data) <= INLINE and name.endswith(".delta"):
        entry["data"] = base64.b64encode(data).decode()
    return entry


def _named(path: str, entry: dict) -> str:
    """How a damage message names ``entry``'s bytes at ``path``: the file, or its range in a segment."""
    if "in" not in entry:
        return path
    return f"{entry['path']} (bytes {entry['at']}-{entry['at'] + entry['bytes']} of {path})"


def matches(path: str, size: int, sha256: str, entry: dict) -> None:
    """:class:`CheckpointDamaged` unless ``size`` and ``sha256`` are the entry's."""
    if size != entry["bytes"]:
        raise CheckpointDamaged(f"{path} has {size} bytes, its manifest says {entry['bytes']}")
    if not hmac.compare_digest(sha256, str(entry["sha256"])):
        raise CheckpointDamaged(f"{path} does not match its SHA-256 in the signed manifest (tampered)")
