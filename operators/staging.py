"""Epochs of staged output: the bookkeeping the two-phase-commit file sinks share.

Between two checkpoint barriers a sink writes one *epoch* of output into a
staging area (hidden, next to its output). ``pre_commit(id)`` seals the open
epoch under checkpoint ``id``; ``commit(id)`` publishes every sealed epoch of
an id up to ``id``, oldest first. Epochs are numbered, so a restored sink can
tell the epochs its snapshot knew (keep: they wait for their commit) from the
ones written after it (discard: the stream replays them). Flink's
``TwoPhaseCommitSinkFunction`` keeps the same list (pending transactions per
checkpoint) in its state.
"""

from __future__ import annotations

import functools
import os
import shutil
import threading
import time
from dataclasses import dataclass, field

from pescheduler import config
from pescheduler.errors import DeliveryFailed
from pescheduler.restart import Backoff


@dataclass
class Epochs:
    """The open epoch's number and the sealed epochs waiting for their checkpoint to complete.

    ``pending`` holds ``[checkpoint_id, epoch, size]`` lists (JSON-friendly: the state
    travels in checkpoints); ``size`` is what the sink wrote in that epoch (bytes, or rows).
    """

    current: int = 0
    pending: list = field(default_factory=list)

    def seal(self, checkpoint_id: float, size: int) -> None:
        """The open epoch is complete under ``checkpoint_id`` (kept if it wrote anything); the
        next one opens."""
        if size:
            self.pending.append([checkpoint_id, self.current, size])
        self.current += 1

    def due(self, checkpoint_id: float) -> list:
        """The sealed epochs of checkpoints up to ``checkpoint_id``, oldest first. They stay
        pending until :meth:`published` says the external system confirmed each: a commit that
        fails part-way forgets nothing, and calling it again finishes the job."""
        return sorted((p for p in self.pending if p[0] <= checkpoint_id), key=lambda p: p[0])

    def published(self, epoch: int) -> None:
        """The external system confirmed ``epoch``'s output: it is no longer pending."""
        self.pending = [p for p in self.pending if p[1] != epoch]

    def state(self) -> dict:
        return {"current": self.current, "pending": [list(p) for p in self.pending]}

    @classmethod
    def of(cls, state: dict) -> "Epochs":
        return cls(state["current"], [list(p) for p in state["pending"]])

    def known(self, epoch: int) -> bool:
        """Whether ``epoch`` was staged before the snapshot this bookkeeping came from."""
        return epoch == self.current or any(p[1] == epoch for p in self.pending)


def staging_dir(path: str, writer: str = "") -> str:
    """The hidden staging folder beside ``path`` (readers and Spark skip ``.``-names)."""
    parent, name = os.path.split(os.path.abspath(path))
    return os.path.join(parent, f".{name}{'.' + writer if writer else ''}.staging")


def epoch_of(name: str) -> int | None:
    """The epoch number of a staging entry named ``e<epoch>...``, else None."""
    digits = name[1:].split(".", 1)[0]
    return int(digits) if name.startswith("e") and digits.isdigit() else None


def clear(folder: str) -> None:
    """Remove a staging folder and everything in it (a fresh start)."""
    shutil.rmtree(folder, ignore_errors=True)



def retried(what: str, call, transient: tuple = (OSError,)):
    """``call()``, again after a growing pause while it raises one of ``transient``
    (``pescheduler.sinks.retry.*``); then :class:`~pescheduler.errors.DeliveryFailed` naming
    ``what``, which fails the PE (a checkpointed run restores and commits again). ``call`` must
    be safe to repeat: the commits that use this undo a part-done step before they raise.
    The settings are read only after a failure (a sink calls this per batch). The pauses sleep
    in the caller's thread: an operator that calls this sets ``may_block``, so its PE works in a
    thread of its own and the worker's event loop never waits out the backoff."""
    try:
        return call()
    except transient as exc:
        error = exc
    backoff = Backoff(config.get_seconds("sinks.retry.backoff"), config.get_seconds("sinks.retry.max-backoff"),
                      float(config.get("sinks.retry.backoff-multiplier")))
    attempts = int(config.get("sinks.retry.attempts"))
    for attempt in range(1, attempts):
        time.sleep(backoff.delay(attempt - 1))
        try:
            return call()
        except transient as exc:
            error = exc
    raise DeliveryFailed(f"{what} failed {attempts} times, last: {type(error).__name__}: {error}") from error


def serialized(method):
    """Run ``method`` under the instance's re-entrant lock: a coordinator may call ``commit`` from
    another thread than the PE's, and a commit must not interleave with a snapshot (the snapshot
    records the published size and the staged epochs, which a commit changes together)."""
    @functools.wraps(method)
    def locked(self, *args, **kwargs):
        with self.__dict__.setdefault("_commit_lock", threading.RLock()):
            return method(self, *args, **kwargs)
    return locked
