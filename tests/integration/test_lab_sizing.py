"""Elastic sizing on lab hosts: one step, at most one instance over the oracle, relief within two
monitor windows; and after the hot spot shifts, the new one relieved and the old one's copies gone.

Every instance of the hot operators runs on a lab host (a network namespace whose cgroup gives it
half a core and puts it first in line for it, ``lab_net.CpuGroup``), so what an instance can
process does not depend on how loaded this shared machine is. The oracle is not a calibration
taken beforehand: it is what the monitor measured, the hot operator's tuples per busy (CPU)
second and the cores its instances' workers report, against the offered rate:

    oracle = ceil(offered / (tuples per CPU second * cores per instance))

The issue asks relief within two windows, and this test asks it (RELIEF_WINDOWS): window 1 is the
one the decision falls in. It allowed three while a paced source waiting for its schedule, with one
routed channel out of credit, counted as blocked, and a source skipped for a full channel waited a
source poll once it had room; with the wait counted as backpressure only while the flow holds input
back, and held-back input taken as soon as a channel has room (worker/runtime.py), it passed 5 of 5
runs at a load average of 5-7.5 with two. The bench prints the window it took.

Relief is read almost as the bench reads it (bench/elastic.py): the monitor window, counted from
the scaling decision, from which the operator's sender is blocked on credit less than 10 % of the
time, that window and on average the next two. The load is switched between the two branches by a file the gates
read (a test-controlled step, not a timer), so the hot spot moves when the test says so.
"""

from __future__ import annotations

import math
import os
import time

import dask.config
import pytest

import pescheduler
from pescheduler import Application
from pescheduler.actions import BorrowHosts, Move, Release, Replicate, Split
from tests.waiting import until

pytestmark = [pytest.mark.integration, pytest.mark.lab]

HOST_CPU = 0.5            # cores of each lab host's quota
COST_S = 0.0002           # CPU seconds the hot operators spend per tuple: about 5,000 per CPU second
LOAD = 1.25               # offered, in lab hosts' capacity
WAIT = 90                 # seconds: the bound on every wait for the policies
RELIEVED_BP = 0.1


def gate(path: str, name: str):
    """Pass tuples on only while the file at ``path`` names this branch (read every 0.2 s)."""
    seen = {"at": 0.0, "on": False}

    def through(e):
        now = time.monotonic()
        if now - seen["at"] > 0.2:
            seen["at"] = now
            try:
                with open(path) as f:
                    seen["on"] = f.read().strip() == name
            except OSError:
                seen["on"] = False
        return [e] if seen["on"] else []
    return through


def burn(e):
    """``COST_S`` of this thread's CPU time per tuple (CPU, not wall: the same work under any load)."""
    end = time.thread_time() + COST_S
    while time.thread_time() < end:
        pass
    return {"car": e["car"], "ts": e["ts"]}


def cpu_rate(n: int = 2_000) -> float:
    """Tuples ``burn`` processes per CPU second of this thread (what the load is set from)."""
    t0 = time.thread_time()
    for i in range(n):
        burn({"car": i, "ts": i})
    return n / (time.thread_time() - t0)


def two_branches(flag: str, out, rate: float) -> Application:
    app = Application("lab-sizing")
    src = app.source("generator", events=10_000_000, keys=100, seed=5, rate=rate, id="src")
    for b in ("a", "b"):
        (src.flat_map(gate(flag, b), id=f"gate_{b}")
            .map(burn, id=f"hot_{b}")
            .sink("jsonl", path=str(out / f"{b}.jsonl"), id=f"sink_{b}"))
    return app


def hot(flag, branch: str) -> None:
    """Send the load to ``branch`` (the gates read the file; replaced whole, never half written)."""
    tmp = flag.with_suffix(".new")
    tmp.write_text(branch)
    os.replace(tmp, flag)


def onto(dep, op: str, worker: str) -> None:
    """Run ``op`` alone in a PE on ``worker`` (moved, or split out of the PE it shares)."""
    pl = dep.placement()
    pe = pl.pe_of(op)
    action = Move(pe, worker) if pl.pes[pe].operators == (op,) else Split(pe, (op,), worker)
    rec = dep.apply(action, timeout=60)
    assert rec.applied, rec.reason
    assert dep.placement().pes[dep.placement().pe_of(op)].worker == worker


RELIEF_WINDOWS = 2


class Windows:
    """Monitor windows as the test reads them: the sender's backpressure and the instances."""

    def __init__(self, dep, op: str, upstream: str) -> None:
        self.dep, self.op, self.upstream, self.seen = dep, op, upstream, []

    def next(self):
        snap = self.dep.next_snapshot(timeout=30)
        pl = self.dep.placement()
        pe = snap.pes.get(pl.pe_of(self.upstream))
        self.seen.append({"t": snap.time, "bp": pe.backpressure if pe else 0.0,
                          "n": len(pl.instances(self.op)), "snap": snap, "placement": pl})
        return self.seen[-1]

    def relief(self, since: float) -> int | None:
        """The window after ``since`` (1 = the first) from which the sender is unblocked: that
        window under ``RELIEVED_BP`` and the mean of it and the next two too (one window at 0.11
        among zeros, seen at a load average of 28 here, is not being held back; backpressure
        that stays is)."""
        after = [w for w in self.seen if w["t"] > since]
        for k in range(1, len(after) - 1):
            three = [w["bp"] for w in after[k - 1:k + 2]]
            if three[0] < RELIEVED_BP and sum(three) / 3 < RELIEVED_BP:
                return k
        return None


def scaling(dep, op: str) -> list:
    return [d for d in dep.controller.decisions
            if d.outcome == "applied" and isinstance(d.action, (Replicate, Release)) and d.action.operator == op]


def measured_oracle(windows: list[dict], op: str, offered: float) -> tuple[int, float, float]:
    """``(oracle, tuples per CPU second, cores per instance)`` from the monitor's windows."""
    tuples = busy = 0.0
    cores = 1.0
    for w in windows:
        snap, pl = w["snap"], w["placement"]
        for inst in pl.instances(op):
            m = snap.operators.get(inst)
            if m is not None:
                tuples, busy = tuples + m.tuples_in_per_s, busy + m.busy
                worker = snap.workers.get(pl.pes[pl.pe_of(inst)].worker)
                cores = min(cores, worker.cores if worker else 1.0)
    rate = tuples / busy
    return math.ceil(offered / (rate * cores) - 1e-9), rate, cores


def until_scaled(windows: Windows):
    """Windows from the load step until the first scaling decision on the operator (bounded)."""
    deadline = time.monotonic() + WAIT
    while not scaling(windows.dep, windows.op):
        assert time.monotonic() < deadline, f"no scaling decision on {windows.op} within {WAIT} s: " + " ".join(
            f"{w['bp']:.2f}/{w['n']}" for w in windows.seen)
        windows.next()
    return scaling(windows.dep, windows.op)


def timeline(windows: Windows, since: float) -> list:
    return [(round(w["t"] - since, 1), round(w["bp"], 2), w["n"]) for w in windows.seen]


def run_until_relieved(windows: Windows, decided: float) -> int:
    """Windows after the decision until relief (bounded); returns which window it was."""
    deadline = time.monotonic() + WAIT
    while windows.relief(decided) is None:
        assert time.monotonic() < deadline, f"{windows.op} not relieved within {WAIT} s: " + " ".join(
            f"{w['bp']:.2f}/{w['n']}" for w in windows.seen if w["t"] > decided)
        windows.next()
    return windows.relief(decided)


def test_a_hot_operator_is_sized_in_one_step_and_relieved_and_a_shifted_hot_spot_is_too(tmp_path):
    flag = tmp_path / "hot"
    flag.write_text("")
    offered = LOAD * HOST_CPU * cpu_rate()          # 1.25 lab hosts' worth: 0.625 cores of work
    settings = {"pescheduler.rm.lab.cpu": HOST_CPU, "pescheduler.rm.lab.hosts": 3,
                "pescheduler.policies.copy.release-after": "3s",
                "pescheduler.policies.idle-return-after": "600s",      # the lab hosts stay for the test
                "pescheduler.policies.decision-log": str(tmp_path / "decisions.jsonl")}
    with dask.config.set(settings), pescheduler.deploy(two_branches(str(flag), tmp_path, offered), workers=2,
                                                       rm="lab", policies=["rate", "copy"]) as dep:
        rec = dep.apply(BorrowHosts(3), timeout=120)
        assert rec.applied, rec.reason
        lab = {h: dep.hosts.borrowed[h].workers[0] for h in ("lab-1", "lab-2", "lab-3")}
        onto(dep, "hot_a", lab["lab-1"])
        onto(dep, "hot_b", lab["lab-2"])

        # -- the hot spot on branch a ------------------------------------------------------
        a = Windows(dep, "hot_a", "gate_a")
        hot(flag, "a")
        (first,) = until_scaled(a)
        assert isinstance(first.action, Replicate), first.action
        k = run_until_relieved(a, first.t)
        for _ in range(3):                       # steady: no second step, measure the oracle
            a.next()
        steady = [w for w in a.seen if w["t"] > first.t][k:]
        oracle, rate, cores = measured_oracle(steady, "hot_a", offered)
        sizes = [w["n"] for w in a.seen]
        assert len(scaling(dep, "hot_a")) == 1, [d.text() for d in scaling(dep, "hot_a")]     # ONE step
        assert max(sizes) <= oracle + 1, (sizes, oracle, rate, cores)
        assert k <= RELIEF_WINDOWS, (k, timeline(a, first.t))
        assert cores == HOST_CPU                  # the workers report their quota: the oracle counts it

        # -- the hot spot moves to branch b --------------------------------------------------
        b = Windows(dep, "hot_b", "gate_b")
        hot(flag, "b")
        (first_b,) = until_scaled(b)
        assert isinstance(first_b.action, Replicate), first_b.action
        k_b = run_until_relieved(b, first_b.t)
        assert k_b <= RELIEF_WINDOWS, (k_b, timeline(b, first_b.t))
        until(lambda: not dep.placement().copies_of("hot_a"), WAIT, "hot_a's copies to be released")
        released = [d for d in scaling(dep, "hot_a") if isinstance(d.action, Release)]
        assert released and len(scaling(dep, "hot_b")) == 1, [d.text() for d in dep.controller.decisions]
        dep.stop()
