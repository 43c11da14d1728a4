"""Exactly-once through Kafka with real crashes (issue 14): a SIGKILLed worker, a crash between a
checkpoint's completion and the sink's commit, a SIGKILLed deploying process.

The output topic is read as a complete ``read_committed`` consumer reads it: from the log's own
COMMIT/ABORT control records (``brokers.committed_log``), because Tansu's read_committed was seen
to return the records of aborted transactions (a fenced producer's), which every crash here
leaves behind. So these tests neither pass because of that gap (an aborted transaction's
records would show up as duplicates) nor fail only because of it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

import pescheduler
from pescheduler import Application

from brokers import committed_log, create_topic, produce, start_tansu
from waiting import gone, until

pytestmark = [pytest.mark.integration, pytest.mark.broker]

WAIT = 120
T0 = 1_700_000_000_000                      # event time of record 0 (ms, a whole second)
TESTS = str(Path(__file__).parent.parent)


@pytest.fixture(scope="module")
def kafka():
    with start_tansu() as broker:
        yield broker.address


def numbered(n: int, keys: int) -> list[dict]:
    return [{"n": i, "key": i % keys, "ts": T0 + i} for i in range(n)]


def committed(address: str, topic: str) -> list:
    return [json.loads(v) for values in committed_log(address, topic).values() for v in values]


def window_reference(n: int, keys: int) -> list:
    """Plain Python: 1 s event-time windows per key of count and sum of ``n``."""
    windows: dict = {}
    for r in numbered(n, keys):
        c, s = windows.get((r["key"], r["ts"] // 1000 * 1000), (0, 0))
        windows[(r["key"], r["ts"] // 1000 * 1000)] = (c + 1, s + r["n"])
    return sorted((k, w, c, s) for (k, w), (c, s) in windows.items())


def read_everything(dep, partitions: int) -> None:
    """Wait until the (restored) source has read every record of its topic."""
    def done() -> bool:
        lag = dep.snapshot().operators.get("kafka-1")
        return lag is not None and len(lag.lag) == partitions and not any(lag.lag.values())
    until(done, WAIT, "the source to read the whole topic")


def restart_of(dep) -> dict:
    until(lambda: dep.recovery.restarts and "first_output_s" in dep.recovery.restarts[-1], WAIT,
          "a restart with output after it")
    return dep.recovery.restarts[-1]


def test_window_worker_killed_mid_stream_gives_the_reference_exactly(kafka, tmp_path):
    n, keys = 24_000, 12
    create_topic(kafka, "eos-win-in", 3)
    create_topic(kafka, "eos-win-out", 2)
    produce(kafka, "eos-win-in", numbered(n, keys), partition_of=lambda r: r["n"] % 3)
    app = Application("kafka-eos-window")
    (app.source("kafka", topic="eos-win-in", bootstrap_servers=kafka, event_time="ts", max_delay="100ms",
                rate=3_000)
        .key_by("key")
        .window(size="1s", aggregates={"c": ("count", "n"), "s": ("sum", "n")}, id="win")
        .sink("kafka", topic="eos-win-out", bootstrap_servers=kafka, key="key", exactly_once=True))
    with pescheduler.deploy(app, workers=3, policies=[], checkpoint=str(tmp_path / "ckpt"),
                            checkpoint_interval="0.5s") as dep:
        until(lambda: len(dep.checkpoints()) >= 2, WAIT, "two complete checkpoints")
        assert sum(dep.snapshot().operators["kafka-1"].lag.values()) > 0, "killed after the input was read"
        placement = dep.placement()
        os.kill(dep.worker_info[placement.pes[placement.pe_of("win")].worker]["pid"], signal.SIGKILL)
        record = restart_of(dep)
        read_everything(dep, 3)
        status = dep.stop()                # drains: the last windows fire, the open transaction commits
    assert status["late_events"] == 0
    assert record["checkpoint"] >= 2
    out = committed(kafka, "eos-win-out")
    assert sorted((r["key"], r["window_start"], r["c"], r["s"]) for r in out) == window_reference(n, keys)


def test_a_crash_between_checkpoint_completion_and_the_commit_loses_and_repeats_nothing(kafka, tmp_path):
    """The sink's worker SIGKILLs itself when checkpoint k's commit reaches it: checkpoint k is
    complete, its transaction never committed, and the records of k are past the restored
    source positions. Only the records carried in k's snapshot, published again by the restored
    sink because the marker group says k was not, can bring them back."""
    n = 15_000
    flag = tmp_path / "crashed-at"
    create_topic(kafka, "eos-gap-in", 2)
    create_topic(kafka, "eos-gap-out", 2)
    produce(kafka, "eos-gap-in", numbered(n, 10), partition_of=lambda r: r["n"] % 2)
    app = Application("kafka-eos-gap")
    (app.source("kafka", topic="eos-gap-in", bootstrap_servers=kafka, event_time="ts", rate=2_500)
        .map(lambda t: {"n": t["n"], "twice": 2 * t["n"]})
        .sink("kafka_commit_crash", crash_flag=str(flag), after=2, topic="eos-gap-out",
              bootstrap_servers=kafka, key="n", exactly_once=True))
    with pescheduler.deploy(app, workers=3, policies=[], plugins=["kafka_faults"],
                            checkpoint=str(tmp_path / "ckpt"), checkpoint_interval="0.5s") as dep:
        record = restart_of(dep)
        crashed_at = int(flag.read_text())
        read_everything(dep, 2)
        dep.stop()
    assert record["checkpoint"] == crashed_at, "not restored from the checkpoint whose commit was lost"
    out = committed(kafka, "eos-gap-out")
    assert sorted(r["n"] for r in out) == list(range(n)), "lost or doubled around the crash"
    assert all(r["twice"] == 2 * r["n"] for r in out)
