"""Local recovery: a worker keeps a copy of the key-group files it wrote, and reads them first.

Flink's local recovery: a restored PE placed on a worker that survived reads
its key groups from that worker's disk when the worker wrote them, and from
the checkpoint storage otherwise. The copies live in the deployment's
directory of the worker (``pescheduler.state.dir``, ``state/settings.py``),
so they go when the deployment ends there. A copy is only a cache: it is
read only when its size and SHA-256 are those of the signed manifest's
entry; anything else (missing, damaged) reads the storage's file. A file in
a segment (``state/files.Segment``) is copied into the same place of a copy
of its segment, and read as that range.
"""

from __future__ import annotations

import hashlib
import hmac
import os

from .files import CHECKPOINT_DIR, physical

LOCAL = "checkpoint-copies"


class LocalCopies:
    """Copies of one deployment's key-group files on this worker: ``<dir>/<run>/chk-N/<file>``."""

    def __init__(self, deployment_dir: str) -> None:
        """``deployment_dir``: ``state.settings.deployment_dir(deployment)`` on this worker."""
        self.root = os.path.join(deployment_dir, LOCAL)

    def _path(self, run: str, path: str) -> str:
        return os.path.join(self.root, run, *path.split("/"))

    def keep(self, run: str, entry: dict, data: bytes) -> None:
        """A copy of a file just written to the storage (owner-only; not fsynced: a cache); one
        in a segment at its place in the segment's copy."""
        path = self._path(run, physical(entry))
        os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | (0 if "in" in entry else os.O_TRUNC), 0o600)
        with os.fdopen(fd, "wb") as f:
            f.seek(entry.get("at", 0))
            f.write(data)

    def read(self, run: str, entry: dict) -> bytes | None:
        """The copy of ``entry``'s file if there is one matching its size and SHA-256, else None."""
        try:
            with open(self._path(run, physical(entry)), "rb") as f:
                f.seek(entry.get("at", 0))
                data = f.read(entry["bytes"]) if "in" in entry else f.read()
        except OSError:
            return None
        if len(data) != entry["bytes"] or not hmac.compare_digest(hashlib.sha256(data).hexdigest(),
                                                                 str(entry["sha256"])):
            return None
        return data

    def prune(self, run: str, keep: set[str], upto: int) -> None:
        """Remove the copies of ``run`` of checkpoints up to ``upto`` (the one just complete) whose
        path (``chk-N/<file>``, a segment's for the files in it:
        :func:`~pescheduler.state.files.physical`) is not in ``keep``. A later checkpoint's are
        left alone: its write may be going (it begins while the last one ends), and its copies are
        made before its chains name them; a segment's copy removed under it lost the files
        before."""
        base = os.path.join(self.root, run)
        for folder in listed(base):
            chk = CHECKPOINT_DIR.fullmatch(folder)
            if chk is None or int(chk.group(1)) > upto:
                continue
            for name in listed(os.path.join(base, folder)):
                if f"{folder}/{name}" not in keep:
                    try:
                        os.remove(os.path.join(base, folder, name))
                    except FileNotFoundError:
                        pass    # another PE's prune on this worker took it first: gone either way


def listed(folder: str) -> list[str]:
    """``folder``'s entries; none when it is gone (a concurrent prune, or the deployment's end)."""
    try:
        return os.listdir(folder)
    except (FileNotFoundError, NotADirectoryError):
        return []
