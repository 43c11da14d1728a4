"""Metrics: what PE hosts report, turned into the immutable snapshot policies receive.

PE hosts report cumulative counters (tuples, busy seconds in operator code,
seconds blocked on downstream credit, seconds idle waiting for input) plus
psutil figures for their worker process and host. :class:`Monitor` keeps the previous
report per PE and turns differences into per-second rates and fractions of
wall time, as Flink's busy/backPressured/idle ms-per-second: ``busy +
backpressure + idle`` is about 1, the rest being framework time (decoding,
routing) and, on a contended core, time waiting for a CPU. Busy excludes that
wait (``worker/busy.py``: wall time minus the thread's run-queue wait; blocking
calls count), so ``tuples_in_per_s / busy`` is the true processing rate (DS2)
however many processes share the core; whether more CPU is there to be had is the host's
``cpu`` (:meth:`~pescheduler.metrics.MetricsSnapshot.saturated`). A late or lost report costs
precision, never correctness.

A host's ``cpu`` is the deployment's own: the CPU of its processes over the
cores they may use. A lab host's workers share its quota (each is told its
part). Hosts without a quota on one machine (the embedded cluster, the
``local`` manager's hosts, the lab's bridge host) are names for processes on
the same cores: their workers and this deploying process (the scheduler and
control loop) are added up per machine (its boot id) over the machine's core
budget less the lab quotas lent on it. Everything else the machine runs is ``machine_cpu``,
for ``status``: on a shared machine other users' load says nothing about
whether the deployment has used what it may (counted in, every Replicate was
refused at load 8 while the deployment used a core of two), and busy time is
CPU time, so a copy's figures do not depend on it either.

Sampling costs one RPC per worker per interval and a few counters per batch
(never per tuple).
"""

from __future__ import annotations

import time
from collections import defaultdict, deque
from types import MappingProxyType
from typing import Callable, Mapping

import psutil

from ..metrics import HostMetrics, MetricsSnapshot, OperatorMetrics, PEMetrics, WorkerMetrics
from ..plan.placement import Placement
from ..worker.cgroup import machine_id


def host_figures(hosts: Mapping[str, list[dict]], here: str, here_cpu: float) -> dict[str, HostMetrics]:
    """Each host's figures from its workers' ``process`` reports (see the module docstring):
    a host whose workers all have a ``share`` of a quota uses their CPU over their shares;
    any other uses what the deployment's other processes on its machine use (``here_cpu``, this
    process's, counts on machine ``here``) over that machine's cores less the quotas lent on it.
    The lab's hosts are cut from the same cores, and their cgroups get their quota first: with a
    lab host of half a core on two cores, the embedded host has a core and a half (issue 15: counted
    at two, a copy went to the embedded host, where neither instance got its core)."""
    used: dict[str, float] = defaultdict(float)     # machine -> CPU of processes not under a quota
    lent: dict[str, float] = defaultdict(float)     # machine -> cores of quotas on it
    used[here] += here_cpu
    for procs in hosts.values():
        for p in procs:
            machine = p.get("machine", "")
            if p.get("share"):
                lent[machine] += p["share"]
            else:
                used[machine] += p.get("cpu", 0.0)
    figures = {}
    for host, procs in hosts.items():
        shares = [p.get("share") for p in procs]
        if all(shares):
            cpu = sum(p.get("cpu", 0.0) for p in procs) / sum(shares)
        else:
            machine = procs[0].get("machine", "")
            cpu = used[machine] / max(procs[0].get("machine_cores", 1) - lent[machine], 0.5)
        figures[host] = HostMetrics(host, min(1.0, cpu), max(p.get("host_memory", 0.0) for p in procs),
                                    tuple(p["worker"] for p in procs),
                                    max(p.get("host_cpu", 0.0) for p in procs))
    return figures


class Monitor:
    """Folds rounds of ``pe_stats`` answers into snapshots; keeps a bounded history."""

    def __init__(self, history: int = 60) -> None:
        self.history: deque[MetricsSnapshot] = deque(maxlen=history)
        self._last: dict[str, tuple[float, dict]] = {}          # pe -> (time, cumulative stats)
        self.latest = MetricsSnapshot(time.monotonic(), 0.0)
        self._machine = machine_id()                # this process's: its CPU counts on this machine
        self._process = psutil.Process()
        self._process.cpu_percent(None)
        # pe -> its part of the last complete checkpoint (``CompletedCheckpoint.pes``), read once
        # per update: the deployment sets it when it takes checkpoints
        self.checkpointed: Callable[[], Mapping[str, dict]] = dict

    def update(self, answers: list[dict], placement: Placement) -> MetricsSnapshot:
        """Fold one round of answers over ``placement`` (the Reconfigurer's, read now: the
        placement is held once); counters of PEs that went are dropped."""
        self.placement = placement
        self._last = {pe: v for pe, v in self._last.items() if pe in placement.pes}
        now = time.monotonic()
        ops: dict[str, OperatorMetrics] = {}
        pes: dict[str, PEMetrics] = {}
        workers: dict[str, WorkerMetrics] = {}
        hosts: dict[str, list[dict]] = {}
        stored = self.checkpointed()
        for answer in answers:
            worker = answer["worker"]
            host = self.placement.hosts.get(worker, answer.get("host", ""))
            proc = answer.get("process", {})
            workers[worker] = WorkerMetrics(worker, host, proc.get("cpu", 0.0), proc.get("memory_bytes", 0),
                                            proc.get("cores", 1.0))
            hosts.setdefault(host, []).append({**proc, "worker": worker})
            for pe_id, stats in answer["pes"].items():
                if self._current(pe_id, worker, stats):
                    pes[pe_id] = self._pe(pe_id, stats, now, ops, _same(stored.get(pe_id), self.placement, pe_id))
        snapshot = MetricsSnapshot(
            now, now - self.latest.time if self.history else 0.0,
            MappingProxyType(ops), MappingProxyType(pes), MappingProxyType(workers),
            MappingProxyType(host_figures(hosts, self._machine, self._process.cpu_percent(None) / 100)))
        self.latest = snapshot
        self.history.append(snapshot)
        return snapshot

    def _current(self, pe_id: str, worker: str, stats: dict) -> bool:
        """Whether ``stats`` are of the placement's PE ``pe_id``: on its worker, running its
        operators. While a reconfiguration replaces a PE, the old one (same id, other operators
        or worker) still answers for a moment; folding it in raised KeyError and mixed counters."""
        pe = self.placement.pes.get(pe_id)
        return pe is not None and pe.worker == worker and all(o in stats["operators"] for o in pe.operators)

    def _pe(self, pe_id: str, stats: dict, now: float, ops: dict, stored: dict | None) -> PEMetrics:
        t_prev, prev = self._last.get(pe_id, (now, None))
        if prev is None or _restarted(prev, stats):
            # A PE the monitor has not seen, or a new one under the same id (a Move keeps the
            # name, a restore restarts it): its counters start at zero, so its first window is
            # its own elapsed time. Deltas against the old PE's counters went negative (a
            # backpressure of -67 after a Release in bench/elastic.py).
            t_prev, prev = now - max(stats["elapsed_s"], 1e-9), None
        self._last[pe_id] = (now, stats)
        # The window is the PE's own clock between its two samples, not the monitor's: the answers
        # of a loaded worker arrive late by varying amounts, and a source's output and lag growth
        # (sampled together on the worker) summed to 7.8k and 18.8k/s in two windows of a 13.4k/s
        # schedule over the monitor's 1.8 and 1.3 s (bench/elastic.py, issue 15)
        dt = max(stats["elapsed_s"] - prev["elapsed_s"] if prev is not None else now - t_prev, 1e-9)
        prev = prev or {"operators": {}, "backpressure_s": 0.0, "idle_s": 0.0}
        busy = 0.0
        for op_id, o in stats["operators"].items():
            p = prev["operators"].get(op_id, {"tuples_in": 0, "tuples_out": 0, "busy_s": 0.0, "batches_in": 0})
            lag = o.get("lag", {})
            m = OperatorMetrics(op_id, pe_id,
                                tuples_in_per_s=(o["tuples_in"] - p["tuples_in"]) / dt,
                                tuples_out_per_s=(o["tuples_out"] - p["tuples_out"]) / dt,
                                busy=min(1.0, (o["busy_s"] - p["busy_s"]) / dt),
                                batches_in_per_s=(o.get("batches_in", 0) - p.get("batches_in", 0)) / dt,
                                tuples_in=o["tuples_in"], tuples_out=o["tuples_out"],
                                dead_letters=o["dead_letters"], late=o["side"].get("late", 0),
                                lag=lag, lag_per_s=(sum(lag.values()) - sum(p.get("lag", lag).values())) / dt)
            ops[op_id] = m
            busy += m.busy
        pe = self.placement.pes[pe_id]
        first, last = ops[pe.operators[0]], ops[pe.operators[-1]]
        return PEMetrics(
            pe_id, pe.operators, pe.worker, pe.host, stats["state"],
            tuples_in_per_s=first.tuples_in_per_s or first.tuples_out_per_s,
            tuples_out_per_s=last.tuples_out_per_s,
            busy=min(1.0, busy),
            backpressure=min(1.0, (stats["backpressure_s"] - prev["backpressure_s"]) / dt),
            idle=min(1.0, (stats["idle_s"] - prev["idle_s"]) / dt),
            queue_batches=stats["queue_batches"], queue_tuples=stats["queue_tuples"],
            max_queue_batches=stats["max_queue_batches"], backpressure_s=stats["backpressure_s"],
            threaded=stats.get("threaded", False), threaded_because=stats.get("threaded_because", ""),
            state_bytes=stored["state_bytes"] if stored else None)


def _same(stored: dict | None, placement: Placement, pe_id: str) -> dict | None:
    """``stored`` (a PE's part of the last complete checkpoint) if it was of the PE that has that
    id now: its operators the same (a Fuse or Split since may give a new PE an old one's id)."""
    return stored if stored is not None and stored["operators"] == list(placement.pes[pe_id].operators) else None


def _restarted(prev: dict, stats: dict) -> bool:
    """Whether ``stats`` come from a newer PE than ``prev`` under the same id: its clock or a
    cumulative counter went back."""
    if stats["elapsed_s"] < prev["elapsed_s"] or stats["backpressure_s"] < prev["backpressure_s"] \
            or stats["idle_s"] < prev["idle_s"]:
        return True
    before = prev["operators"]
    return any(o["tuples_in"] < before[op]["tuples_in"] or o["busy_s"] < before[op]["busy_s"]
               for op, o in stats["operators"].items() if op in before)
