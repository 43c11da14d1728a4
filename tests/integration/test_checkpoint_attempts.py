"""A first checkpoint longer than ``pescheduler.checkpoint.timeout`` completes while it writes; one
whose writer stops is aborted, and the next attempt builds on the files it wrote.

A count window holding one pending tuple of each of K keys on the disk backend, on a real
2-worker embedded cluster. No checkpoint is taken during the fill (the interval is an hour): after
it the source holds (the state stops changing) and the test takes checkpoints with
``dep.checkpoint()``, so every attempt meets the same state and the first has nothing earlier to
reference.

The timeout bounds a write that makes no progress (``checkpoint/coordinator.py``, ``_watched``):
the coordinator asks each worker still writing how many bytes it has put. So a first checkpoint
that takes longer than the timeout to write completes at its first attempt. That test's timeout
(2 s) stays above the gaps in which a loaded machine schedules neither the writer nor the worker's
loop that answers (at 0.15 s one attempt was aborted at load 10.6, its write no slower than the
gap; at 0.5 s one was, at load 8.7 in a loaded suite, with 0 bytes asked 0.5 s after the trigger;
at 1 s one was at load 8.6, its worker giving "no answer in 0.75 s" after 1.8 MB written);
its state (400,000 keys of 150 random bytes each) still takes about two of them to write on a
quiet machine (200 bytes a key wrote in 5.7 s there). Before, every attempt was
aborted at the timeout and only the files each left let them converge (a first checkpoint at 10^7
keys on ``memory`` took 27-35 s against the 30 s default: two attempts).

A writer that stops is still given up: here the window's worker is stopped (SIGSTOP: a process
frozen mid-write, as a VM paused or swapping) once its segment holds a key group. The checkpoint
is aborted a timeout after the last byte; the worker goes on (SIGCONT), its write stops at its
next key group, and the key groups it wrote whole stay for the next attempt, which writes only the
rest and completes. The window's worker is then SIGKILLed: the restore reads groups from the
aborted attempt's files, checked against the complete checkpoint's signed manifest, and the output
matches a plain-Python reference exactly.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import glob
import json
import os
import signal

import dask.config
import pytest

import pescheduler
from pescheduler import Application
from pescheduler.checkpoint.storage import manifest_at
from pescheduler.errors import CheckpointError
from waiting import killed_and_restored, until

pytestmark = pytest.mark.integration

WAIT = 180
KEYS = 300_000          # the stalled write's state
LONG_KEYS = 400_000     # the long write's: each holding LONG_PAD random bytes (session 79: 200 bytes
LONG_PAD = 150          # a key, 400,000 keys: 100 MB written in 5.7 s quiet, the fill 7.4 s; 4 x 10^6
                        # keys of a few bytes wrote in about 4 s, but their fill took 50 s quiet and
                        # outlasted its 180 s in a loaded CI)
WINDOW = 2              # tuples per window: at the hold every key holds one
TIMEOUT = 2.0           # seconds without progress (the write of the whole state outlasts it)
STALL_TIMEOUT = 1.0     # the stalled write's (its snapshots, under load too, well within it)
ATTEMPTS = 100          # at most, each bounded by the timeout


def checkpoint_after_attempts(dep) -> tuple[int, int]:
    """``dep.checkpoint()`` until one completes: its id and how many were aborted before it."""
    for tried in range(ATTEMPTS):
        try:
            return dep.checkpoint(timeout=WAIT), tried
        except CheckpointError:
            continue
    raise AssertionError(f"no checkpoint completed in {ATTEMPTS} attempts")


def expected_rows(keys: int) -> list[tuple]:
    rows, count = [], 2 * keys * WINDOW
    for key in range(keys):
        ns = list(range(key, count, keys))
        rows += [(key, ns[w * WINDOW], ns[w * WINDOW + WINDOW - 1] + 1, sum(ns[w * WINDOW:(w + 1) * WINDOW]))
                 for w in range(len(ns) // WINDOW)]
    return sorted(rows)


@contextlib.contextmanager
def filled(tmp_path, monkeypatch, timeout: float, keys: int, pad: int = 0):
    """The deployment, its window operator's name and its files, once every one of ``keys`` keys
    is in (the source then holds until ``release`` exists, then sends as much again), each holding
    ``pad`` random bytes (as hex) beside its sum; stopped at the end."""
    monkeypatch.setenv("PESCHEDULER__STATE__DIR", str(tmp_path / "stores"))
    out, ckpt, release = tmp_path / "out.jsonl", tmp_path / "ckpt", tmp_path / "release"
    app = Application("attempts")
    aggregates = {"total": ("sum", "n"), **({"pad": ("max", "pad")} if pad else {})}
    (app.source("numbers", count=2 * keys * WINDOW, keys=keys, hold_at=keys, release=str(release), pad=pad)
        .key_by("key").window(count=WINDOW, aggregates=aggregates).sink("jsonl", path=str(out)))
    with dask.config.set({"pescheduler.checkpoint.timeout": f"{timeout}s"}), \
            pescheduler.deploy(app, workers=2, plugins=["support_ops"], policies=[], state="disk",
                               checkpoint=str(ckpt), checkpoint_interval="1h") as dep:
        op = next(x for x in dep.placement().plan.ops if x.startswith("count_window"))
        until(lambda: op in (ops := dep.snapshot().operators) and ops[op].tuples_in >= keys, WAIT,
              "the fill of every key")
        assert not dep.checkpoints() and not dep.status()["checkpoints"]["aborted"]
        yield dep, op, out, ckpt, release


def write_aborts(dep) -> list[str]:
    """The events of checkpoints aborted in their write (not in their snapshots)."""
    return [e["text"] for e in dep.status().get("events", ()) if "writing it to" in e["text"]]


def test_a_first_checkpoint_longer_than_the_timeout_completes_at_its_first_attempt(tmp_path, monkeypatch):
    with filled(tmp_path, monkeypatch, TIMEOUT, LONG_KEYS, LONG_PAD) as (dep, op, out, ckpt, release):
        done_id, tried = checkpoint_after_attempts(dep)
        done = next(c for c in dep.checkpoints() if c["id"] == done_id)
        print(f"checkpoint {done_id} in {done['duration_s']:.2f} s after {tried} aborted, load {os.getloadavg()[0]:.1f}")
        assert not write_aborts(dep), f"a write making progress was aborted: {write_aborts(dep)}"
        assert done["duration_s"] > TIMEOUT, "the write fitted in the timeout: this test shows nothing, raise LONG_PAD"
        release.touch()
        until(lambda: dep.snapshot().operators[op].tuples_in > LONG_KEYS, WAIT, "the stream going on past the hold")


def test_a_write_stopped_midway_is_aborted_and_the_next_attempt_builds_on_it_and_restores_exactly(
        tmp_path, monkeypatch):
    with filled(tmp_path, monkeypatch, STALL_TIMEOUT, KEYS) as (dep, op, out, ckpt, release):
        placement = dep.placement()
        pe_id = placement.pe_of(op)
        window_worker = dep.worker_info[placement.pes[pe_id].worker]["pid"]
        stopped = False
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            attempts = pool.submit(checkpoint_after_attempts, dep)
            try:
                until(lambda: any(os.path.getsize(f) for f in glob.glob(f"{ckpt}/*/chk-*/{pe_id}.seg*")), WAIT,
                      "the window's first key group in its segment")
                os.kill(window_worker, signal.SIGSTOP)
                stopped = True
                until(lambda: write_aborts(dep), WAIT, "the stopped write's abort")
            finally:
                if stopped:
                    os.kill(window_worker, signal.SIGCONT)
            done_id, tried = attempts.result(WAIT)
        assert tried >= 1 and dep.status()["checkpoints"]["aborted"] == tried
        stalled = write_aborts(dep)
        print(f"{tried} attempts aborted before checkpoint {done_id} completed, load {os.getloadavg()[0]:.1f}; "
              f"{stalled}")
        assert len(stalled) == 1 and f"no progress writing it to {ckpt}" in stalled[0] and \
            f"for {STALL_TIMEOUT:g} s" in stalled[0]
        done = next(c for c in dep.checkpoints() if c["id"] == done_id)
        referenced = {e["chk"] for e in manifest_at(done["url"])["files"] if e["role"] == "group"}
        assert referenced - {done_id}, "the complete checkpoint references no aborted attempt's files"
        killed_and_restored(dep, window_worker, WAIT)
        release.touch()
        status = dep.wait(timeout=WAIT)
    assert status["state"] == "finished"
    with open(out) as f:
        rows = sorted((r["key"], r["window_start"], r["window_end"], r["total"]) for r in map(json.loads, f))
    assert rows == expected_rows(KEYS)
