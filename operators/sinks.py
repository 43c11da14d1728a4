"""Built-in sinks: ``jsonl`` (one JSON object per line, atomic per batch) and ``print``."""

from __future__ import annotations

import json
import os
import sys
from typing import Any

from pescheduler.operator import Emitter, Sink

# One encoder built once: json.dumps with non-default arguments builds a new
# encoder on every call, which dominates the cost of small tuples.
_encode = json.JSONEncoder(separators=(",", ":"), default=str).encode


def _lines(batch: list) -> str:
    return "\n".join(map(_encode, batch)) + "\n"


class JsonlSink(Sink):
    """Write tuples to ``path``, one compact JSON object per line (``default=str``).

    ``open`` creates the parent directories and truncates the file, unless the
    sink was restored from a snapshot (it moved to another PE or worker): then
    it appends where its predecessor stopped. Each batch
    is one ``os.write`` on an ``O_APPEND`` descriptor, so a reader (or a
    ``jsonl`` source following the file) never sees half a batch from a
    crash-free writer; ``flush`` fsyncs, so a finished stream is on disk.
    """

    name = "jsonl"

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = os.fspath(path)
        self._fd: int | None = None
        self._continue = False

    def open(self, context: Any) -> None:
        super().open(context)
        parent = os.path.dirname(self.path)
        if parent:
            os.makedirs(parent, exist_ok=True)
        truncate = 0 if self._continue else os.O_TRUNC
        self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | truncate | os.O_APPEND, 0o644)

    def snapshot(self) -> dict:
        """Every batch is already in the file: a successor only needs to append."""
        if self._fd is not None:
            os.fsync(self._fd)
        return {"continue": True}

    def restore(self, state: dict | None) -> None:
        self._continue = bool(state and state.get("continue"))

    def process(self, batch: list, emit: Emitter) -> None:
        data = _lines(batch).encode()
        written = os.write(self._fd, data)
        while written < len(data):          # a short write (signal, huge batch): finish it
            written += os.write(self._fd, data[written:])

    def flush(self, emit: Emitter) -> None:
        if self._fd is not None:
            os.fsync(self._fd)

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


class PrintSink(Sink):
    """Print each tuple as one compact JSON line on standard output (one write per batch)."""

    name = "print"

    def process(self, batch: list, emit: Emitter) -> None:
        sys.stdout.write(_lines(batch))

    def flush(self, emit: Emitter) -> None:
        sys.stdout.flush()


class DiscardSink(Sink):
    """Count tuples and drop them (Flink's DiscardingSink): for benchmarks and dry runs.

    The count is the operator's ``tuples_in`` in the status.
    """

    name = "discard"

    def process(self, batch: list, emit: Emitter) -> None:
        pass
