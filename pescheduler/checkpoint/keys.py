"""The key checkpoint files are signed with: an HMAC key that never touches the checkpoint storage.

Write access to the storage must not be code execution in the deploying
process, so nothing read from it is unpickled unless it is proven written by
this deployment: each checkpoint's manifest carries an HMAC-SHA256 taken with
this key, and lists every file's SHA-256 (storage.py). The key is either

- ``pescheduler.checkpoint.key``: a secret the user gives (the same one on
  every machine that restores the run's checkpoints), or
- when that is null, a random 32-byte key in the file ``checkpoint.key``
  beside ``pescheduler.state-dir`` (``~/.cache/pescheduler/checkpoint.key``),
  created owner-only (0600) on first use. A key file others can read is
  refused: whoever can read it can forge checkpoints.

A restore on another machine is given the key by copying that file, or by
setting ``pescheduler.checkpoint.key`` on both (docs/checkpoints.md).
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
import stat
import tempfile

from .. import config
from ..errors import CheckpointError

KEY_FILE = "checkpoint.key"
_CONTEXT = b"pescheduler checkpoint files v1"     # binds a user's secret to this one use


def key_path() -> str:
    """``<state-dir>/../checkpoint.key``: beside the default checkpoint directory."""
    base = os.path.dirname(os.path.expanduser(config.get("state-dir")).rstrip("/"))
    return os.path.join(base, KEY_FILE)


def checkpoint_key() -> bytes:
    """The signing key: derived from ``pescheduler.checkpoint.key``, or the key file's (made if missing)."""
    secret = config.get("checkpoint.key")
    if secret:
        return hmac.new(str(secret).encode(), _CONTEXT, hashlib.sha256).digest()
    return _key_file(key_path())


def _key_file(path: str) -> bytes:
    """The key in ``path``, created owner-only with a fresh random key if there is none.

    The key is written whole to a file of its own (``mkstemp``: 0600) and linked to ``path``,
    which fails if another process's key is there first: that one is read. Creating ``path``
    itself (``O_EXCL``) and then writing let a process that came in between read it empty."""
    folder = os.path.dirname(path)
    os.makedirs(folder, mode=0o700, exist_ok=True)
    if not os.path.exists(path):
        fd, mine = tempfile.mkstemp(dir=folder, prefix=f".{KEY_FILE}.")
        try:
            with os.fdopen(fd, "w") as f:
                f.write(secrets.token_hex(32) + "\n")
                f.flush()
                os.fsync(f.fileno())
            try:
                os.link(mine, path)
            except FileExistsError:
                pass
        finally:
            os.unlink(mine)
    return _read_key(path)


def _read_key(path: str) -> bytes:
    mode = os.stat(path).st_mode
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise CheckpointError(f"checkpoint key file {path} is readable by others (mode {stat.filemode(mode)}): "
                              f"anyone who can read it can forge checkpoints; chmod 600 it")
    with open(path) as f:
        text = f.read().strip()
    try:
        key = bytes.fromhex(text)
    except ValueError:
        key = b""
    if not key:
        raise CheckpointError(f"checkpoint key file {path} does not hold a hex key")
    return key


def sign(key: bytes, data: bytes) -> str:
    """HMAC-SHA256 of ``data`` (hex)."""
    return hmac.new(key, data, hashlib.sha256).hexdigest()


def signed_by(key: bytes, data: bytes, digest: str) -> bool:
    return hmac.compare_digest(sign(key, data), str(digest))
