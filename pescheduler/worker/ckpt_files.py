"""The worker's side of writing a checkpoint: PE snapshots held, then written straight to storage.

A PE's snapshot (``barriers.py``: small state pickled, keyed state as views)
is taken off the PE by ``pe_ckpt_wait`` and held here while the coordinator
still holds the reconfiguration lock; ``pe_ckpt_write`` then writes it, in a
worker thread, into the checkpoint storage the coordinator names, and answers
only the manifest entries (path, checkpoint, bytes, SHA-256): the deploying
process signs a manifest listing them and never holds state bytes
(docs/checkpoints.md). What a checkpoint that ended without being written
held is released at its end.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import threading
from typing import Callable

import psutil

from .. import allocator
from ..errors import CheckpointError
from ..state.files import StateFiles
from ..state.foreground import FOREGROUND
from ..state.incremental import ChainWriter
from ..state.settings import local_copies


class CheckpointFiles:
    """Per deployment: snapshots taken and not yet written, and the key-group chains written."""

    def __init__(self) -> None:
        self._taken: dict[tuple[str, int], dict[str, dict]] = {}    # (deployment, id) -> pe_id -> result
        self._writers: dict[str, ChainWriter] = {}
        self._writing: dict[tuple[str, int], StateFiles] = {}      # (deployment, id) being written -> its files
        self._lock = threading.Lock()               # holds on the worker's loop, writes and ends in threads
        self._trims = Trims()

    def hold(self, deployment: str, checkpoint_id: int, pe_id: str, result: dict) -> dict:
        """Keep a PE's result until written; what ``pe_ckpt_wait`` answers for it (no state)."""
        if "error" in result:
            return result
        with self._lock:
            self._taken.setdefault((deployment, checkpoint_id), {})[pe_id] = result
        return {"taken": True}

    def write(self, deployment: str, checkpoint_id: int, pe_ids: list[str], storage: str) -> dict:
        """Write the PEs' held snapshots under ``storage`` (the run's directory); in a thread.
        ``{pe_id: {"files": [...], "positions": {...}} or {"error": ...}}``."""
        with self._lock:
            taken = self._taken.pop((deployment, checkpoint_id), {})
            writer = self._writers.get(deployment) or self._writers.setdefault(
                deployment, ChainWriter(local_copies(deployment)))
        files, out = StateFiles(storage), {}
        self._writing[deployment, checkpoint_id] = files
        try:
            with FOREGROUND.background():               # the PEs' turns first (state/foreground.py)
                for pe_id in pe_ids:
                    result = taken.pop(pe_id, None)
                    if result is None:
                        out[pe_id] = {"error": f"PE {pe_id}: no snapshot of checkpoint {checkpoint_id} held here"}
                        continue
                    try:
                        out[pe_id] = writer.write_pe(files, checkpoint_id, pe_id, result)
                    except CheckpointError as exc:      # aborted meanwhile: the rest is not written
                        out[pe_id] = {"error": str(exc)}
        finally:
            self._writing.pop((deployment, checkpoint_id), None)
        _release(taken)
        self._trims.after_write()
        return out

    def progress(self, deployment: str, checkpoint_id: int) -> int | None:
        """Bytes of files :meth:`write` has put so far for ``checkpoint_id``; None when no write of
        it is going on here (not begun, or ended). Read on the worker's loop while the write runs
        in its thread: an int read."""
        files = self._writing.get((deployment, checkpoint_id))
        return None if files is None else files.written

    def end(self, deployment: str, checkpoint_id: int, complete: bool) -> None:
        """Checkpoint ``checkpoint_id`` is over (:meth:`settle`), and what it let go of freed."""
        self.settle(deployment, checkpoint_id, complete)()

    def settle(self, deployment: str, checkpoint_id: int, complete: bool) -> Callable[[], None]:
        """Checkpoint ``checkpoint_id`` is over: complete ones are what later chains build on, an
        aborted one's write stops (its groups written so far are built on); snapshots still held
        of it (or older ones) are released. Returns the freeing of what it let go of (the
        interval's keys, a slice at a time giving way to the PEs' turns), for the caller to run
        once the checkpoint's end has been answered (``PEHost.pe_ckpt_end``)."""
        with self._lock:
            stale = [k for k in self._taken if k[0] == deployment and k[1] <= checkpoint_id]
            held = [self._taken.pop(k) for k in stale]
            writer = self._writers.get(deployment)
        let_go = _nothing
        with FOREGROUND.background():   # outside the lock (the writer has its own)
            if complete and writer is not None:
                let_go = writer.confirm(checkpoint_id)
            elif writer is not None:
                writer.abandon(checkpoint_id)
        for results in held:
            _release(results)
        return functools.partial(_in_background, let_go)

    def forget(self, deployment: str) -> None:
        """The deployment is over here."""
        with self._lock:
            self._writers.pop(deployment, None)
            held = [self._taken.pop(k) for k in [k for k in self._taken if k[0] == deployment]]
        for results in held:
            _release(results)


def _nothing() -> None:
    pass


def _in_background(work: Callable[[], None]) -> None:
    """``work`` giving way to the PEs' turns between its slices (state/foreground.py)."""
    with FOREGROUND.background():
        work()


def _release(results: dict[str, dict]) -> None:
    for result in results.values():
        for snap in result.get("views", ()):
            snap.view.release()


TRIM_GROWTH = 64 << 20         # RSS grown since the last trim that makes the next one worth it
TRIM_SHARE = 8                  # ... or 1 / this of the RSS the last trim left, if more


def _rss() -> int:
    return psutil.Process().memory_info().rss


class Trims:
    """When a checkpoint's write ends with :func:`give_back`: only once the process's RSS grew past
    what the last trim left by :data:`TRIM_GROWTH` (or 1 / :data:`TRIM_SHARE` of it, if more).

    A trim takes each malloc arena's lock in turn, and a PE thread that allocates meanwhile waits:
    at 10^6 keys on ``memory``, whose steady checkpoints free little, the stream's stall at a
    checkpoint was 23.0 / 30.3 ms with a trim after every write and 15.8 / 21.2 ms without
    (session 21, deployed, quiet). Where writes do leave the arenas growing (10^7 keys on ``disk``:
    363 -> 521 -> 706 MB over three checkpoints untrimmed), the RSS crosses the bound and the
    trim comes; the RSS then stays within the bound of what trimming every time would hold.
    Reading the RSS takes no arena lock (``/proc``)."""

    def __init__(self) -> None:
        self.left: int | None = None            # RSS after the last trim (None: none yet)
        self.trimmed = 0
        self._lock = threading.Lock()           # two deployments' writes may end at once

    def due(self, rss: int) -> bool:
        return self.left is None or rss > self.left + max(TRIM_GROWTH, self.left // TRIM_SHARE)

    def after_write(self) -> bool:
        """Trim if due (in the writer's thread); whether it did."""
        with self._lock:
            if not self.due(_rss()):
                return False
            if give_back():
                self.trimmed += 1
            self.left = _rss()
            return True


@functools.cache
def _malloc_trim():
    """glibc's ``malloc_trim``, or None (another C library; or jemalloc preloaded, which gives memory
    back as it decays, in threads of its own: glibc's arenas then hold nothing to trim,
    ``pescheduler/allocator.py``)."""
    if allocator.in_use() == "jemalloc":
        return None
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim
    except (OSError, AttributeError):
        return None


def give_back() -> bool:
    """Hand the memory a checkpoint's write freed back to the system (glibc's ``malloc_trim``), in
    the writer's thread after its write. Each thread that packs groups or calls into RocksDB
    allocates from a malloc arena of its own, and glibc keeps what is freed there: at 10^7 keys on
    disk the worker's RSS went 363 -> 521 -> 706 MB over three checkpoints with a 512 MB cache,
    and a trim after each gave back 23, 78 and 151 MB (16-67 ms, the GIL released: a ctypes call).
    False where there is no ``malloc_trim`` or the process runs on jemalloc
    (``pescheduler.pe.allocator``, the default where the machine has it: nothing to trim)."""
    trim = _malloc_trim()
    if trim is None:
        return False
    trim(0)
    return True
