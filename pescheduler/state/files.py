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
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os

import fsspec
from fsspec.implementations.local import LocalFileSystem

from ..errors import CheckpointDamaged

CHUNK = 1 << 20           # bytes hashed at a time when a file is checked without being kept
INLINE = 48               # a .delta file this small is carried in its entry (and the manifest), not written


class StateFiles:
    """Files under ``url`` (a run's directory, or the storage root): put, read and check them."""

    def __init__(self, url: str) -> None:
        self.url = str(url).rstrip("/")
        self.fs, root = fsspec.core.url_to_fs(self.url)
        self.root = root.rstrip("/")
        self.local = isinstance(self.fs, LocalFileSystem)

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
        entry = {"path": f"chk-{checkpoint_id:06d}/{name}", "chk": checkpoint_id, "bytes": len(data),
                 "sha256": hashlib.sha256(data).hexdigest()}
        if len(data) <= INLINE and name.endswith(".delta"):
            return {**entry, "data": base64.b64encode(data).decode()}
        folder = f"{self.root}/chk-{checkpoint_id:06d}"
        self.makedirs(folder)
        self.write(f"{folder}/{name}", data)
        return entry

    def read(self, entry: dict, run: str | None = None) -> bytes:
        """The file ``entry`` names (under ``run``'s directory when this is the storage root),
        its size and SHA-256 checked against the entry before anyone unpickles it."""
        path = self._path(entry, run)
        try:
            data = base64.b64decode(entry["data"]) if "data" in entry else self.fs.cat_file(path)
        except OSError as exc:
            raise CheckpointDamaged(f"{path} unreadable: {type(exc).__name__}: {exc}") from None
        matches(path, len(data), hashlib.sha256(data).hexdigest(), entry)
        return data

    def check(self, entry: dict, run: str | None = None) -> None:
        """:meth:`read`'s checks, the file hashed in chunks and not kept (memory independent of its size)."""
        if "data" in entry:
            self.read(entry, run)
            return
        path, digest, size = self._path(entry, run), hashlib.sha256(), 0
        try:
            with self.fs.open(path, "rb") as f:
                while chunk := f.read(CHUNK):
                    digest.update(chunk)
                    size += len(chunk)
        except OSError as exc:
            raise CheckpointDamaged(f"{path} unreadable: {type(exc).__name__}: {exc}") from None
        matches(path, size, digest.hexdigest(), entry)

    def _path(self, entry: dict, run: str | None) -> str:
        return f"{self.root}/{run}/{entry['path']}" if run else f"{self.root}/{entry['path']}"


def matches(path: str, size: int, sha256: str, entry: dict) -> None:
    """:class:`CheckpointDamaged` unless ``size`` and ``sha256`` are the entry's."""
    if size != entry["bytes"]:
        raise CheckpointDamaged(f"{path} has {size} bytes, its manifest says {entry['bytes']}")
    if not hmac.compare_digest(sha256, str(entry["sha256"])):
        raise CheckpointDamaged(f"{path} does not match its SHA-256 in the signed manifest (tampered)")
