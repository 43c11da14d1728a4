"""Where checkpoints live: any fsspec URL (a local directory by default, ``memory://`` in tests).

Layout under the storage root (docs/checkpoints.md)::

    chk-000001/                 one directory per checkpoint id
        <pe>.state              a PE's operator states, progress and source positions (cloudpickle)
        placement.pkl           the placement that took it (cloudpickle), to map state on restore
        MANIFEST.json           written last, atomically: the checkpoint is complete iff it exists
    chk-000002/...

A checkpoint without ``MANIFEST.json`` was aborted or cut short by a crash and
is never restored; :meth:`CheckpointStore.prune` removes it with the
checkpoints beyond ``retain``. The manifest is written to a temporary name and
moved into place: a rename on a local disk (atomic); on object stores, whose
``mv`` copies, a single PUT of the final object is atomic as well.
"""

from __future__ import annotations

import json
import os
import re
import uuid
from typing import Any

import fsspec

from ..errors import CheckpointError

MANIFEST = "MANIFEST.json"
_DIR = re.compile(r"chk-(\d+)$")


def default_location(app_name: str) -> str:
    """``<state-dir>/../checkpoints/<app name>``: a local directory the user can find."""
    from .. import config

    base = os.path.dirname(os.path.expanduser(config.get("state-dir")).rstrip("/"))
    return os.path.join(base, "checkpoints", app_name)


class CheckpointStore:
    """Reads and writes checkpoints under one fsspec URL."""

    def __init__(self, url: str) -> None:
        self.url = str(url)
        self.fs, self.root = fsspec.core.url_to_fs(self.url)
        self.root = self.root.rstrip("/")
        self.fs.makedirs(self.root, exist_ok=True)

    def _dir(self, checkpoint_id: int) -> str:
        return f"{self.root}/chk-{checkpoint_id:06d}"

    def write(self, checkpoint_id: int, name: str, data: bytes) -> int:
        """Store one file of checkpoint ``checkpoint_id``; its size."""
        self.fs.makedirs(self._dir(checkpoint_id), exist_ok=True)
        self.fs.pipe_file(f"{self._dir(checkpoint_id)}/{name}", data)
        return len(data)

    def read(self, checkpoint_id: int, name: str) -> bytes:
        return self.fs.cat_file(f"{self._dir(checkpoint_id)}/{name}")

    def commit_manifest(self, checkpoint_id: int, manifest: dict) -> None:
        """Write the manifest last, under a temporary name then moved: the checkpoint is complete."""
        tmp = f"{self._dir(checkpoint_id)}/.{MANIFEST}.{uuid.uuid4().hex}"
        self.fs.pipe_file(tmp, json.dumps(manifest, indent=1, default=repr).encode())
        self.fs.mv(tmp, f"{self._dir(checkpoint_id)}/{MANIFEST}")

    def manifest(self, checkpoint_id: int) -> dict:
        return json.loads(self.read(checkpoint_id, MANIFEST))

    def ids(self) -> list[int]:
        """Every checkpoint directory's id, complete or not, ascending."""
        try:
            names = self.fs.ls(self.root, detail=False)
        except FileNotFoundError:
            return []
        found = (_DIR.search(n.rstrip("/")) for n in names)
        return sorted(int(m.group(1)) for m in found if m)

    def completed(self) -> list[int]:
        """Ids of complete checkpoints (their manifest exists), ascending."""
        return [i for i in self.ids() if self.fs.exists(f"{self._dir(i)}/{MANIFEST}")]

    def resolve(self, restore: Any) -> int:
        """The id ``restore`` names: ``"latest"`` (the newest complete one) or an id."""
        done = self.completed()
        if restore == "latest":
            if not done:
                raise CheckpointError(f"no complete checkpoint in {self.url} to restore; "
                                      f"deploy without --restore to start from the beginning")
            return done[-1]
        try:
            wanted = int(restore)
        except (TypeError, ValueError):
            raise CheckpointError(f"--restore {restore!r}: give 'latest' or a checkpoint id "
                                  f"(complete ones in {self.url}: {done or 'none'})") from None
        if wanted not in done:
            raise CheckpointError(f"checkpoint {wanted} is not complete in {self.url} "
                                  f"(complete ones: {done or 'none'})")
        return wanted

    def discard(self, checkpoint_id: int) -> None:
        """Remove a checkpoint's directory (aborted, or beyond ``retain``)."""
        try:
            self.fs.rm(self._dir(checkpoint_id), recursive=True)
        except FileNotFoundError:
            pass

    def prune(self, retain: int) -> list[int]:
        """Keep the newest ``retain`` complete checkpoints; remove older ones and incomplete
        ones older than the newest complete one. The ids removed."""
        done = self.completed()
        keep = set(done[-retain:]) if retain > 0 else set()
        newest = done[-1] if done else 0
        gone = [i for i in self.ids() if i not in keep and (i in done or i < newest)]
        for i in gone:
            self.discard(i)
        return gone
