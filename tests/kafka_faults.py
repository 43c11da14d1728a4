"""Fault injection for the Kafka exactly-once tests, loaded with ``plugins=["kafka_faults"]``.

``sink("kafka_commit_crash", crash_flag=PATH, after=K, at=STEP, ...)`` is the Kafka sink with one
hook: the first time a checkpoint ``>= K`` completes and its ``commit`` reaches the sink, it writes
that checkpoint's id to ``crash_flag`` and SIGKILLs its own process (the Dask worker hosting
it) at ``STEP`` of the commit: ``"before"`` anything is committed (a real crash right between a
checkpoint's completion, its manifest written, and the sink's commit), or ``"after"`` Kafka
committed the transaction and before the sink's bookkeeping knows it, or ``"mid-commit-<N>ms"``:
N ms into Kafka's commit of the transaction (the EndTxn request in flight or being applied). ``crash_flag`` existing
disarms it, so the restored instance runs as the plain sink. ``kafka_step_crash`` does the same
to the at-least-once sink at each step of its commit path (:class:`StepCrashSink`).
"""

from __future__ import annotations

import json
import os
import signal
import threading

import pescheduler
from pescheduler.operators.kafka import KafkaSink


class CommitCrashSink(KafkaSink):
    name = "kafka_commit_crash"

    def __init__(self, crash_flag: str, after: int = 2, at: str = "before", **params) -> None:
        super().__init__(**params)
        self.crash_flag, self.after, self.at = crash_flag, after, at

    def commit(self, checkpoint_id: int) -> None:
        armed = checkpoint_id >= self.after and self._prepared and not os.path.exists(self.crash_flag)
        if armed and self.at == "before":
            self._crash(checkpoint_id)
        if armed and self.at == "after":
            # Kafka commits every parked transaction due, through the producers themselves (not
            # the sink's own commit helper, which the sink of 79842b7 lacked: there the hook never
            # fired), and the sink dies before its bookkeeping drops them.
            for cid in sorted(c for c in self._prepared if c <= checkpoint_id):
                self._prepared[cid][0].commit_transaction(self.timeout_s)
            self._crash(checkpoint_id)
        if armed and self.at.startswith("mid-commit-"):
            # SIGKILLed while Kafka commits: the EndTxn request may be on its way, in the broker,
            # or answered, as a kill at an arbitrary moment of a live run finds it.
            self._mark(checkpoint_id)
            delay_ms = int(self.at[len("mid-commit-"):-2])
            threading.Timer(delay_ms / 1000, os.kill, (os.getpid(), signal.SIGKILL)).start()
            for cid in sorted(c for c in self._prepared if c <= checkpoint_id):
                self._prepared[cid][0].commit_transaction(self.timeout_s)
            threading.Event().wait(60)               # the kill comes
        super().commit(checkpoint_id)

    def _crash(self, checkpoint_id: int) -> None:
        self._mark(checkpoint_id)
        os.kill(os.getpid(), signal.SIGKILL)

    def _mark(self, checkpoint_id: int) -> None:
        with open(self.crash_flag + ".tmp", "w") as f:
            f.write(str(checkpoint_id))
        os.replace(self.crash_flag + ".tmp", self.crash_flag)


class StepCrashSink(KafkaSink):
    """The at-least-once Kafka sink (no ``exactly_once``) that SIGKILLs its own process once, at
    ``at``, on the first checkpoint ``>= after`` (``crash_flag`` existing disarms it):
    ``"process"`` half-way through producing a batch, ``"pre_commit"`` before the barrier's
    flush, ``"flushed"`` after it (the snapshot not yet taken), ``"commit"`` when the complete
    checkpoint's commit reaches it. Before dying it writes to ``crash_flag`` the rows it had
    taken in and, per checkpoint it sealed, the rows taken in by its barrier: a restore from
    checkpoint ``c`` can repeat at most ``rows - sealed[c]`` of them."""

    name = "kafka_step_crash"

    def __init__(self, crash_flag: str, after: int = 2, at: str = "process", **params) -> None:
        super().__init__(**params)
        self.crash_flag, self.after, self.at = crash_flag, after, at
        self._rows, self._sealed = 0, {}

    def process(self, batch: list, emit) -> None:
        self._rows += len(batch)
        if self.at == "process" and self._armed(max(self._sealed, default=0)) and len(batch) > 1:
            super().process(batch[:len(batch) // 2], emit)
            self._crash()
        super().process(batch, emit)

    def pre_commit(self, checkpoint_id: int) -> None:
        self._sealed[checkpoint_id] = self._rows
        if self.at == "pre_commit" and self._armed(checkpoint_id):
            self._crash()
        super().pre_commit(checkpoint_id)
        if self.at == "flushed" and self._armed(checkpoint_id):
            self._crash()

    def commit(self, checkpoint_id: int) -> None:
        if self.at == "commit" and self._armed(checkpoint_id):
            self._crash()
        super().commit(checkpoint_id)

    def _armed(self, checkpoint_id: int) -> bool:
        return checkpoint_id >= self.after and not os.path.exists(self.crash_flag)

    def _crash(self) -> None:
        with open(self.crash_flag + ".tmp", "w") as f:
            json.dump({"rows": self._rows, "sealed": self._sealed}, f)
        os.replace(self.crash_flag + ".tmp", self.crash_flag)
        os.kill(os.getpid(), signal.SIGKILL)


@pescheduler.hookimpl
def pescheduler_operators():
    return [CommitCrashSink, StepCrashSink]
