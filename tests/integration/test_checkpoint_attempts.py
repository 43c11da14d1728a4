"""A first checkpoint longer than ``pescheduler.checkpoint.timeout`` completes after a few attempts.

A count window holding one pending tuple of each of K keys on the disk backend, on a real
2-worker embedded cluster, with a checkpoint timeout too short to write the K keys' groups in one
attempt. No checkpoint is taken during the fill (the interval is an hour): after it the source
holds (the state stops changing) and the test takes checkpoints one after another with
``dep.checkpoint()``, so every attempt meets the same state and the first has nothing earlier to
reference: each is aborted at the timeout, its write stops, and the key groups it wrote whole stay
for the next attempt to reference, which writes only the rest; one completes. (Checkpoints taken by
the interval during the fill wrote most groups ahead on a quick machine, and the first attempt after
the fill then fitted in the timeout: CI, "shows nothing".) Before, an aborted
attempt's files were thrown away and every attempt wrote the whole state again: none completed
(the 10^7 row of bench/state.py's table). The window's worker is then SIGKILLed: the restore reads
groups from the aborted attempts' files, checked against the complete checkpoint's signed
manifest, and the output matches a plain-Python reference exactly.
"""

from __future__ import annotations

import json
import os
import signal

import dask.config
import pytest

import pescheduler
from pescheduler import Application
from pescheduler.checkpoint.storage import manifest_at
from pescheduler.errors import CheckpointError
from waiting import until

pytestmark = pytest.mark.integration

WAIT = 180
KEYS = 300_000          # their groups take several timeouts to write whole (2 workers, loaded or not)
WINDOW = 2              # tuples per window: at the hold every key holds one
COUNT = 2 * KEYS * WINDOW
TIMEOUT = "0.15s"       # quiet, writing the K keys' groups whole takes 0.3-0.6 s
ATTEMPTS = 100          # at most, each bounded by the timeout


def checkpoint_after_attempts(dep) -> tuple[int, int]:
    """``dep.checkpoint()`` until one completes: its id and how many were aborted before it."""
    for tried in range(ATTEMPTS):
        try:
            return dep.checkpoint(timeout=WAIT), tried
        except CheckpointError:
            continue
    raise AssertionError(f"no checkpoint completed in {ATTEMPTS} attempts of {TIMEOUT}")


def expected_rows() -> list[tuple]:
    rows = []
    for key in range(KEYS):
        ns = list(range(key, COUNT, KEYS))
        rows += [(key, ns[w * WINDOW], ns[w * WINDOW + WINDOW - 1] + 1, sum(ns[w * WINDOW:(w + 1) * WINDOW]))
                 for w in range(len(ns) // WINDOW)]
    return sorted(rows)


def test_a_first_checkpoint_longer_than_the_timeout_completes_after_a_few_attempts_and_restores_exactly(
        tmp_path, monkeypatch):
    monkeypatch.setenv("PESCHEDULER__STATE__DIR", str(tmp_path / "stores"))
    out, ckpt, release = tmp_path / "out.jsonl", tmp_path / "ckpt", tmp_path / "release"
    app = Application("attempts")
    (app.source("numbers", count=COUNT, keys=KEYS, hold_at=KEYS, release=str(release)).key_by("key")
        .window(count=WINDOW, aggregates={"total": ("sum", "n")}).sink("jsonl", path=str(out)))
    with dask.config.set({"pescheduler.checkpoint.timeout": TIMEOUT}), \
            pescheduler.deploy(app, workers=2, plugins=["support_ops"], policies=[], state="disk",
                               checkpoint=str(ckpt), checkpoint_interval="1h") as dep:
        op = next(x for x in dep.placement().plan.ops if x.startswith("count_window"))
        until(lambda: op in (ops := dep.snapshot().operators) and ops[op].tuples_in >= KEYS, WAIT,
              "the fill of every key")
        assert not dep.checkpoints() and not dep.status()["checkpoints"]["aborted"]
        done_id, tried = checkpoint_after_attempts(dep)
        assert dep.status()["checkpoints"]["aborted"] == tried
        assert tried >= 1, "the first attempt fitted in the timeout: this test shows nothing, raise KEYS"
        print(f"{tried} attempts aborted before checkpoint {done_id} completed, load {os.getloadavg()[0]:.1f}")
        done = next(c for c in dep.checkpoints() if c["id"] == done_id)
        referenced = {e["chk"] for e in manifest_at(done["url"])["files"] if e["role"] == "group"}
        assert referenced - {done_id}, "the complete checkpoint references no aborted attempt's files"
        placement = dep.placement()
        os.kill(dep.worker_info[placement.pes[placement.pe_of(op)].worker]["pid"], signal.SIGKILL)
        until(lambda: dep.status()["checkpoints"]["restart"]["restarts"], WAIT, "the restore after the SIGKILL")
        release.touch()
        status = dep.wait(timeout=WAIT)
    assert status["state"] == "finished"
    with open(out) as f:
        rows = sorted((r["key"], r["window_start"], r["window_end"], r["total"]) for r in map(json.loads, f))
    assert rows == expected_rows()
