"""A real, small tmpfs for the disk-full tests: mounted by the fixture, unmounted by it.

``mounted(size)`` mounts a tmpfs of ``size`` bytes on a fresh temporary
directory (the kernel's own, so ``ENOSPC`` is the real one a full disk gives)
and yields its path; ``fill(folder)`` writes a filler file until the
filesystem is full and returns its path (remove it to make room again).
Mounting needs root (CI runs the suite as root, as it installs Debian packages).
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import subprocess
import tempfile


@contextlib.contextmanager
def mounted(size: int):
    folder = tempfile.mkdtemp(prefix="pescheduler-tmpfs-")
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", "tmpfs", folder], check=True)
    try:
        yield folder
    finally:
        subprocess.run(["umount", "-l", folder], check=True)
        shutil.rmtree(folder, ignore_errors=True)


def fill(folder: str, name: str = "filler", leave: int = 0) -> str:
    """Write ``folder/name`` until the filesystem has no byte left, then give back ``leave``
    bytes (a later write then fits only in part, as on a disk filling up); its path."""
    path = os.path.join(folder, name)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        for block in (1 << 16, 1 << 10, 1):
            while True:
                try:
                    os.write(fd, b"x" * block)
                except OSError as exc:
                    if exc.errno != errno.ENOSPC:
                        raise
                    break
        os.ftruncate(fd, max(0, os.fstat(fd).st_size - leave))
    finally:
        os.close(fd)
    return path
