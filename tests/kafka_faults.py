"""Fault injection for the Kafka exactly-once tests, loaded with ``plugins=["kafka_faults"]``.

``sink("kafka_commit_crash", crash_flag=PATH, after=K, ...)`` is the Kafka sink with one hook:
the first time a checkpoint ``>= K`` completes and its ``commit`` reaches the sink, it writes
that checkpoint's id to ``crash_flag`` and SIGKILLs its own process (the Dask worker hosting
it), before anything is committed: a real crash right between a checkpoint's completion (its
manifest is written) and the sink's commit. ``crash_flag`` existing disarms it, so the
restored instance runs as the plain sink.
"""

from __future__ import annotations

import os
import signal

import pescheduler
from pescheduler.operators.kafka import KafkaSink


class CommitCrashSink(KafkaSink):
    name = "kafka_commit_crash"

    def __init__(self, crash_flag: str, after: int = 2, **params) -> None:
        super().__init__(**params)
        self.crash_flag, self.after = crash_flag, after

    def commit(self, checkpoint_id: int) -> None:
        if checkpoint_id >= self.after and self._prepared and not os.path.exists(self.crash_flag):
            with open(self.crash_flag + ".tmp", "w") as f:
                f.write(str(checkpoint_id))
            os.replace(self.crash_flag + ".tmp", self.crash_flag)
            os.kill(os.getpid(), signal.SIGKILL)
        super().commit(checkpoint_id)


@pescheduler.hookimpl
def pescheduler_operators():
    return [CommitCrashSink]
