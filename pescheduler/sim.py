"""A discrete-time fluid simulator: real placements, real snapshots, real actions, no cluster.

Operators are described by what a policy cares about (CPU seconds per tuple,
selectivity, parallelism, key skew); the simulator places them on simulated
workers ("sim://h{h}/w{c}", one core each) and hosts ("h{h}"), and each
:meth:`Simulation.step` produces the :class:`~pescheduler.metrics.MetricsSnapshot`
the monitor would for one interval. :meth:`Simulation.apply` takes the same
actions the runtime takes (Fuse/Split/Move go through
:func:`pescheduler.plan.transforms.transform`), so policy code runs unchanged at any
scale.

The model, per step (steady state; no transients, no randomness):

* Rates are linear in the source rates: ``in(op) = sum(out(upstream))``,
  ``out(op) = in(op) * selectivity``; a source's input is what it emits.
* Copies follow the runtime's convention: a copy of ``X`` is operator ``X#k``
  of the physical plan (``LogicalOp.copy_of == "X"``, same edges as ``X``),
  run by a PE ``X#k`` (``PE.copy_of == "X"``) on a standard slot
  (``slots_per_host`` per host, in :attr:`Placement.slots`). Each instance
  reports its own :class:`OperatorMetrics`, as the monitor does.
* Each operator instance (the operator in its PE, plus one PE per copy) costs
  ``cost_s * its share of in(op)`` CPU seconds per second on its worker. A
  worker has one core, shared by all PEs on it (proportionally when
  overloaded). Copies share an operator's input equally; for KEYED operators
  the original instance takes at least ``key_skew`` (the hottest key group).
* Backpressure: every source is throttled by a factor ``f <= 1`` so that no
  worker is loaded beyond its core; a source is slowed by the tightest worker
  downstream of it (fan-out blocks on the slowest branch). The throttle is
  found by a few multiplicative rounds (decrease to feasible, then raise
  while slack remains).
* A PE on a saturated worker is CPU-bound: ``busy`` = its CPU, no idle, no
  backpressure (the rest of its wall time it waits for the core). A PE with an
  operator upstream of a saturated PE (in another PE) is blocked on credit:
  ``backpressure = 1 - busy``. Any other PE is ``idle = 1 - busy``. A source
  keeps to its pace with catch-up, as the runtime's do (a schedule, a declared
  ``rate``, a broker's backlog): throttled to ``f < 1`` of its rate it falls
  behind, always has input ready and is blocked whenever not busy, never
  idle (a source that idles has caught up: policies/rate.py).
* Queues: a blocked or CPU-bound PE has its credit window full
  (``credits`` batches per input channel); otherwise the M/M/1 mean
  ``u / (1 - u)`` batches, capped by the window.
"""

from __future__ import annotations

import asyncio
import heapq
import math
import random
from dataclasses import dataclass, replace
from types import MappingProxyType
from typing import Mapping

from .actions import (Action, ActionRefused, BorrowHosts, Fuse, Move, Release, Replicate,
                      ReturnHost, Split)
from .metrics import HostMetrics, MetricsSnapshot, OperatorMetrics, PEMetrics, WorkerMetrics
from .operator import Parallelism
from .plan.placement import PE, LogicalOp, LogicalPlan, Placement
from .control.protocol import ApplyRecord
from .resources import ResourceView
from .plan.transforms import transform, with_slots

__all__ = ["SimOperator", "Simulation", "LogEntry"]

_EPS = 1e-9
_SATURATED = 1.0 - 1e-6          # a worker this loaded counts as CPU-bound


@dataclass(frozen=True)
class SimOperator:
    """What the simulator knows of an operator."""

    cost_s: float = 1e-5                      # CPU seconds per input tuple on one core
    selectivity: float = 1.0                  # tuples out per tuple in
    parallelism: Parallelism = Parallelism.STATELESS
    key_skew: float | None = None             # KEYED: share of input in the hottest key group


@dataclass(frozen=True)
class LogEntry:
    interval: int
    action: Action
    applied: bool
    reason: str


def _state_hook(self, *args):          # pragma: no cover - never called: the sim moves no state
    raise NotImplementedError


# One dummy operator class per parallelism: LogicalOp.parallelism reads cls.parallelism; the
# state hooks make KEYED and MERGEABLE operators replicable for the runtime's transforms.
_CLASSES = {p: type(f"Sim{p.name.title()}Operator", (), {
    "parallelism": p, "__module__": __name__, "split_state": _state_hook, "merge_states": _state_hook,
    "take_partials": _state_hook, "absorb": _state_hook}) for p in Parallelism}


def _topological(ops: Mapping[str, SimOperator], edges: list[tuple[str, str]]) -> list[str]:
    """Kahn's order, stable in the given operator order; refuses cycles and unknown ids."""
    indeg = {op: 0 for op in ops}
    down: dict[str, list[str]] = {op: [] for op in ops}
    for s, d in edges:
        if s not in ops or d not in ops:
            raise ValueError(f"edge {s!r} -> {d!r} names an unknown operator")
        indeg[d] += 1
        down[s].append(d)
    pos = {op: i for i, op in enumerate(ops)}
    ready = [(pos[op], op) for op, n in indeg.items() if n == 0]
    heapq.heapify(ready)
    order = []
    while ready:
        _, op = heapq.heappop(ready)
        order.append(op)
        for d in down[op]:
            indeg[d] -= 1
            if indeg[d] == 0:
                heapq.heappush(ready, (pos[d], d))
    if len(order) != len(ops):
        raise ValueError("the graph has a cycle")
    return order


class Simulation:
    """A simulated deployment: graph + placement + hosts, stepped one monitor interval at a time.

    ``graph`` maps op_id -> :class:`SimOperator`; ``edges`` are ``(src, dst)``
    pairs (or ``(src, port, dst)`` triples). ``source_rate`` is tuples/s per
    source operator: one number for all sources, or a mapping op_id -> rate.
    Without ``placement``, one PE per operator is spread in topological order
    over the workers of ``hosts`` hosts (default: enough hosts for one worker
    per operator), workers holding a standard slot last. ``slots_per_host``
    standard slots per host take copies. ``host_pool`` bounds how many more
    hosts BorrowHosts may grant (None: unbounded).
    """

    def __init__(self, graph: Mapping[str, SimOperator], edges=(), placement: Placement | None = None,
                 hosts: int | None = None, cores_per_host: int = 4, source_rate: float | Mapping = 1000.0,
                 credits: int = 8, batch_size: int = 1000, flush_s: float = 0.005,
                 host_memory_bytes: int = 16 << 30, host_pool: int | None = None,
                 slots_per_host: int = 1, app_name: str = "sim") -> None:
        if cores_per_host < 1:
            raise ValueError("cores_per_host must be >= 1")
        edge_pairs = [(e[0], e[-1]) for e in edges]
        order = _topological(graph, edge_pairs)
        self.specs: dict[str, SimOperator] = {op: graph[op] for op in order}
        self.cores_per_host = cores_per_host
        self.credits, self.batch_size, self.flush_s = credits, batch_size, flush_s
        self.host_memory_bytes = host_memory_bytes
        self.host_pool = host_pool
        self.slots_per_host = slots_per_host
        self.interval = 0
        self.time = 0.0
        # throttle search: stop when no source's factor moves by more than this (relative)
        self.tolerance = 1e-4
        self.max_rounds = 20
        self.log: list[LogEntry] = []

        ups: dict[str, list[tuple[str, str]]] = {op: [] for op in order}
        plan_edges = []
        for e in edges:
            s, p, d = (e[0], "out", e[1]) if len(e) == 2 else e
            ups[d].append((s, p))
            plan_edges.append((s, p, d))
        ops = {op: LogicalOp(op, "sim", op, _CLASSES[spec.parallelism],
                             MappingProxyType({"cost_s": spec.cost_s, "selectivity": spec.selectivity,
                                               "key_skew": spec.key_skew}),
                             tuple(ups[op]), "key" if spec.parallelism is Parallelism.KEYED else None)
               for op, spec in self.specs.items()}
        self.plan = LogicalPlan(app_name, MappingProxyType(ops), tuple(plan_edges))

        # static graph arrays (index = topological position)
        self._ops = order
        self._idx = {op: i for i, op in enumerate(order)}
        self._up = [[self._idx[s] for s, _p in ups[op]] for op in order]
        self._down: list[list[int]] = [[] for _ in order]
        for i, u in enumerate(self._up):
            for j in u:
                self._down[j].append(i)
        self._cost = [self.specs[op].cost_s for op in order]
        self._sel = [self.specs[op].selectivity for op in order]
        self._sources = [i for i, u in enumerate(self._up) if not u]
        self.set_source_rate(source_rate)

        if placement is None:
            n_hosts = hosts if hosts is not None else max(1, math.ceil(len(order) / cores_per_host))
            self._host_names = [f"h{h}" for h in range(n_hosts)]
            workers = [f"sim://h{h}/w{c}" for h in range(n_hosts) for c in range(cores_per_host)]
            host_of = {w: w.split("/")[2] for w in workers}
            bare = Placement(self.plan, MappingProxyType({}), tuple(workers), MappingProxyType(host_of))
            slotted = with_slots(bare, slots_per_host)          # the runtime's slot layout
            # PEs go to workers without a standard slot first, so copies find a spare core
            on_slot = {s.worker for s in slotted.slots.values()}
            spread = [w for w in workers if w not in on_slot] + [w for w in workers if w in on_slot]
            pes = {}
            for i, op in enumerate(order):
                w = spread[i % len(spread)]
                pes[op] = PE((op,), w, host_of[w])
            placement = slotted.with_pes(pes)
        else:
            if {op for op, lop in placement.plan.ops.items() if lop.copy_of is None} != set(order):
                raise ValueError("placement and graph name different operators")
            self.plan = placement.logical
            seen: dict[str, None] = {}
            for w in placement.workers:
                seen.setdefault(placement.hosts.get(w, ""), None)
            self._host_names = list(seen)
        self._next_host = len(self._host_names)
        self._borrowed: set[str] = set()
        self._cum: dict[str, list[float]] = {}          # op instance -> [tuples in, tuples out]
        self._cum_bp: dict[str, float] = {}
        self._set_placement(placement)

    # ----------------------------------------------------------------- constructors

    @classmethod
    def chain(cls, n_ops: int, cost_s: float = 1e-4, costs: Mapping[int, float] | None = None,
              selectivity: float = 1.0, parallelism: Parallelism = Parallelism.STATELESS,
              **kw) -> "Simulation":
        """``op0 -> op1 -> ... -> op{n-1}``; ``costs`` overrides the cost of some positions."""
        costs = costs or {}
        graph = {f"op{i}": SimOperator(costs.get(i, cost_s), selectivity, parallelism) for i in range(n_ops)}
        edges = [(f"op{i}", f"op{i + 1}") for i in range(n_ops - 1)]
        return cls(graph, edges, **kw)

    @classmethod
    def random(cls, n_ops: int, n_hosts: int, seed: int = 0, cores_per_host: int = 4,
               sources: int | None = None, **kw) -> "Simulation":
        """A seeded random DAG: trees of short chains from ``sources`` sources, a few joins."""
        rng = random.Random(seed)
        n_src = sources if sources is not None else max(1, n_ops // 100)
        kinds = [Parallelism.STATELESS] * 5 + [Parallelism.KEYED] * 3 + [Parallelism.MERGEABLE, Parallelism.SINGLETON]
        graph, edges = {}, []
        for i in range(n_ops):
            op = f"op{i}"
            p = rng.choice(kinds)
            graph[op] = SimOperator(cost_s=rng.uniform(1e-6, 5e-5), selectivity=rng.uniform(0.5, 1.0),
                                    parallelism=p,
                                    key_skew=rng.uniform(0.05, 0.5) if p is Parallelism.KEYED else None)
            if i >= n_src:
                # mostly extend a recent operator (chains), sometimes any earlier one, sometimes join two
                j = max(0, i - 1 - int(rng.expovariate(0.2))) if rng.random() < 0.8 else rng.randrange(i)
                edges.append((f"op{j}", op))
                if rng.random() < 0.05:
                    k = rng.randrange(i)
                    if k != j:
                        edges.append((f"op{k}", op))
        kw.setdefault("source_rate", 10_000.0)
        return cls(graph, edges, hosts=n_hosts, cores_per_host=cores_per_host, **kw)

    # ----------------------------------------------------------------- inputs

    def set_source_rate(self, rate: float | Mapping[str, float]) -> None:
        """Tuples/s each source emits when nothing downstream holds it back."""
        if isinstance(rate, Mapping):
            unknown = set(rate) - {self._ops[i] for i in self._sources}
            if unknown:
                raise ValueError(f"not source operators: {sorted(unknown)}")
            old = getattr(self, "_rate", {})
            self._rate = {i: float(rate.get(self._ops[i], old.get(i, 0.0))) for i in self._sources}
        else:
            self._rate = {i: float(rate) for i in self._sources}

    def set_cost(self, costs: Mapping[str, float]) -> None:
        """CPU seconds per tuple of some operators from now on (a hot spot that moves)."""
        for op, cost in costs.items():
            self.specs[op] = replace(self.specs[op], cost_s=float(cost))
            self._cost[self._idx[op]] = float(cost)

    @property
    def source_rate(self) -> dict[str, float]:
        return {self._ops[i]: r for i, r in self._rate.items()}

    @property
    def hosts(self) -> list[str]:
        return list(self._host_names)

    def copies(self, op_id: str) -> int:
        """Copies of ``op_id`` beyond the original instance."""
        return len(self._inst[self._idx[op_id]]) - 1

    def resources(self) -> ResourceView:
        """The resource manager's view policies receive: hosts held and borrowed, pool left."""
        held = tuple(self._host_names)
        lendable = 1_000_000 if self.host_pool is None else self.host_pool
        return ResourceView(held=held, borrowed=tuple(h for h in held if h in self._borrowed),
                            lendable=lendable, manager="sim")

    # ----------------------------------------------------------------- placement index

    def _set_placement(self, placement: Placement) -> None:
        self.placement = placement
        pe_ids = list(placement.pes)
        pe_index = {p: k for k, p in enumerate(pe_ids)}
        workers = list(placement.workers)
        w_index = {w: k for k, w in enumerate(workers)}
        for pe in placement.pes.values():
            if pe.worker not in w_index:            # a placement naming a worker outside .workers
                w_index[pe.worker] = len(workers)
                workers.append(pe.worker)
        self._pe_ids, self._workers = pe_ids, workers
        self._pe_worker = [w_index[pe.worker] for pe in placement.pes.values()]
        plan_ops = placement.plan.ops
        # every operator of a PE as the index of the operator it does the work of
        pe_idx = [[self._idx[plan_ops[op].copy_of or op] for op in pe.operators]
                  for pe in placement.pes.values()]
        inst: list[list[int]] = [[] for _ in self._ops]
        inst_ops: list[list[str]] = [[op] for op in self._ops]
        home = [-1] * len(self._ops)
        for k, pe in enumerate(placement.pes.values()):
            if pe.copy_of is None:
                for i in pe_idx[k]:
                    home[i] = k
        for k, pe in enumerate(placement.pes.values()):
            if pe.copy_of is not None:
                for op, i in zip(pe.operators, pe_idx[k]):
                    inst[i].append(k)
                    inst_ops[i].append(op)
        for i in range(len(self._ops)):
            inst[i].insert(0, home[i])
        self._home, self._inst, self._inst_ops, self._pe_idx = home, inst, inst_ops, pe_idx
        # per-instance share of its operator's input
        weights = []
        for i, ks in enumerate(inst):
            n = len(ks)
            spec = self.specs[self._ops[i]]
            if n == 1:
                weights.append([1.0])
            elif spec.parallelism is Parallelism.KEYED and spec.key_skew:
                hot = max(1.0 / n, spec.key_skew)
                weights.append([hot] + [(1.0 - hot) / (n - 1)] * (n - 1))
            else:
                weights.append([1.0 / n] * n)
        self._weights = weights
        # input channels per PE (for the credit window): upstream operators outside the PE
        n_in = [0] * len(pe_ids)
        for k in range(len(pe_ids)):
            inside = set(pe_idx[k])
            n_in[k] = len({u for i in inside for u in self._up[i] if u not in inside})
        self._pe_inputs = n_in
        self._cum_bp = {p: v for p, v in self._cum_bp.items() if p in pe_index}

    # ----------------------------------------------------------------- the model

    def _rates(self, f: dict[int, float]) -> tuple[list[float], list[float]]:
        rin = [0.0] * len(self._ops)
        rout = [0.0] * len(self._ops)
        sel, up, rate = self._sel, self._up, self._rate
        for i in range(len(rin)):
            u = up[i]
            if not u:
                r = f[i] * rate[i]
            elif len(u) == 1:
                r = rout[u[0]]
            else:
                r = sum(rout[j] for j in u)
            rin[i] = r
            rout[i] = r * sel[i]
        return rin, rout

    def _load(self, rin: list[float]) -> list[float]:
        load = [0.0] * len(self._workers)
        pw, cost = self._pe_worker, self._cost
        for i, ks in enumerate(self._inst):
            c = cost[i] * rin[i]
            if c:
                if len(ks) == 1:
                    load[pw[ks[0]]] += c
                else:
                    for k, wt in zip(ks, self._weights[i]):
                        load[pw[k]] += c * wt
        return load

    def _solve(self) -> tuple[dict[int, float], list[float], list[float], list[float]]:
        """Source throttles such that no worker exceeds its core; returns rates and worker loads."""
        f = {i: 1.0 for i in self._sources}
        pw, down, inst = self._pe_worker, self._down, self._inst
        n = len(self._ops)
        for _round in range(self.max_rounds):
            rin, rout = self._rates(f)
            load = self._load(rin)
            room = [1.0 / l if l > _EPS else math.inf for l in load]
            m = [math.inf] * n
            for i in range(n - 1, -1, -1):
                ks = inst[i]
                v = room[pw[ks[0]]] if len(ks) == 1 else min(room[pw[k]] for k in ks)
                for d in down[i]:
                    if m[d] < v:
                        v = m[d]
                m[i] = v
            changed = False
            for s in self._sources:
                new = min(1.0, f[s] * m[s])
                if abs(new - f[s]) > self.tolerance * max(f[s], 1e-12):
                    changed = True
                f[s] = new
            if not changed:
                break
        rin, rout = self._rates(f)
        return f, rin, rout, self._load(rin)

    def step(self, dt: float = 1.0) -> MetricsSnapshot:
        """One monitor interval of ``dt`` seconds; the snapshot policies would receive."""
        f, rin, rout, load = self._solve()
        ops, pes_ = self._ops, self.placement.pes
        pw, inst, weights, cost = self._pe_worker, self._inst, self._weights, self._cost
        sat_w = [l >= _SATURATED for l in load]
        n_pe = len(self._pe_ids)
        pe_sat = [sat_w[pw[k]] for k in range(n_pe)]
        # an operator is blocked on credit when a downstream operator in another PE is
        # CPU-bound (any of its instances) or itself blocked
        home = self._home
        op_sat = [any(pe_sat[k] for k in ks) for ks in inst]
        blocked = [False] * len(ops)
        for i in range(len(ops) - 1, -1, -1):
            for d in self._down[i]:
                if blocked[d] or (op_sat[d] and (home[d] != home[i] or len(inst[d]) > 1)):
                    blocked[i] = True
                    break

        # per PE: busy (CPU), first/last operator rates, blocked
        pe_busy = [0.0] * n_pe
        pe_blocked = [False] * n_pe
        inst_in: dict[tuple[int, int], float] = {}
        for i, ks in enumerate(inst):
            if len(ks) == 1:
                k = ks[0]
                b = cost[i] * rin[i]
                pe_busy[k] += b
                if blocked[i]:
                    pe_blocked[k] = True
            else:
                for k, wt in zip(ks, weights[i]):
                    b = cost[i] * rin[i] * wt
                    pe_busy[k] += b
                    inst_in[(k, i)] = wt
                    if blocked[i]:
                        pe_blocked[k] = True

        # operators: one entry per instance (the original and each copy ``X#k``)
        pe_ids, cum = self._pe_ids, self._cum
        op_metrics = {}
        for i, names in enumerate(self._inst_ops):
            ks = inst[i]
            for k, name, wt in zip(ks, names, weights[i]):
                t_in, t_out = rin[i] * wt, rout[i] * wt
                c = cum.get(name)
                if c is None:
                    c = cum[name] = [0.0, 0.0]
                c[0] += t_in * dt
                c[1] += t_out * dt
                op_metrics[name] = OperatorMetrics(name, pe_ids[k], t_in, t_out, cost[i] * t_in,
                                                   int(c[0]), int(c[1]))

        # PEs
        idx, credits, bsize, flush = self._idx, self.credits, self.batch_size, self.flush_s
        pe_metrics = {}
        throttle = {k: f[i] for i in self._sources if (k := home[i]) >= 0}
        for k, (pe_id, pe) in enumerate(pes_.items()):
            first, last = self._pe_idx[k][0], self._pe_idx[k][-1]
            w_first = inst_in.get((k, first), 1.0)
            w_last = inst_in.get((k, last), 1.0)
            t_in, t_out = rin[first] * w_first, rout[last] * w_last
            busy = min(1.0, pe_busy[k])
            window = credits * self._pe_inputs[k]
            if pe_sat[k]:
                bp, idle, qb = 0.0, 0.0, window
            elif pe_blocked[k] and k in throttle:      # a paced source behind its pace: always ready
                bp, idle, qb = max(0.0, 1.0 - busy), 0.0, 0
            elif pe_blocked[k]:
                bp, idle, qb = max(0.0, 1.0 - busy), 0.0, window
            else:
                bp, idle = 0.0, max(0.0, 1.0 - busy)
                qb = min(window, int(busy / max(1.0 - busy, _EPS))) if window else 0
            per_batch = min(bsize, max(1.0, t_in * flush / max(self._pe_inputs[k], 1)))
            cum = self._cum_bp.get(pe_id, 0.0) + bp * dt
            self._cum_bp[pe_id] = cum
            pe_metrics[pe_id] = PEMetrics(pe_id, pe.operators, pe.worker, pe.host, "running",
                                          t_in, t_out, busy, bp, idle, qb, int(qb * per_batch), window, cum)

        # workers and hosts
        host_of = self.placement.hosts
        pes_on = [0] * len(self._workers)
        for k in range(n_pe):
            pes_on[pw[k]] += 1
        worker_metrics = {}
        by_host: dict[str, list] = {h: [0.0, 0, []] for h in self._host_names}
        for j, w in enumerate(self._workers):
            h = host_of.get(w, "")
            mem = 150_000_000 + 30_000_000 * pes_on[j]
            worker_metrics[w] = WorkerMetrics(w, h, min(1.0, load[j]), mem)
            acc = by_host.setdefault(h, [0.0, 0, []])
            acc[0] += min(1.0, load[j])
            acc[1] += mem
            acc[2].append(w)
        host_metrics = {h: HostMetrics(h, acc[0] / max(len(acc[2]), 1),
                                       min(1.0, acc[1] / self.host_memory_bytes), tuple(acc[2]))
                        for h, acc in by_host.items()}
        self.interval += 1
        self.time += dt
        return MetricsSnapshot(self.time, dt, MappingProxyType(op_metrics), MappingProxyType(pe_metrics),
                               MappingProxyType(worker_metrics), MappingProxyType(host_metrics))

    # ----------------------------------------------------------------- actions

    def apply(self, action: Action) -> bool:
        """Apply one action; False (with the reason in :attr:`log`) when refused."""
        try:
            if isinstance(action, (Fuse, Split, Move, Replicate, Release)):
                # the runtime's own transforms: the simulator and the runtime share one model
                self._set_placement(transform(self.placement, action))
                reason = action.reason
            elif isinstance(action, BorrowHosts):
                reason = self._borrow(action)
            elif isinstance(action, ReturnHost):
                reason = self._return(action)
            else:
                raise ActionRefused(f"{type(action).__name__} is not simulated")
        except ActionRefused as e:
            self.log.append(LogEntry(self.interval, action, False, str(e)))
            return False
        self.log.append(LogEntry(self.interval, action, True, reason or action.reason))
        return True

    def apply_all(self, actions) -> list[bool]:
        return [self.apply(a) for a in actions]

    async def apply_record(self, action: Action) -> ApplyRecord:
        """Apply ``action`` and answer as ``Deployment._apply`` does: the controller's ``apply``."""
        applied = self.apply(action)
        return ApplyRecord(action, applied, self.log[-1].reason)

    def control(self, controller, steps: int, before=None) -> list[MetricsSnapshot]:
        """``steps`` intervals of: ``before(sim, i)`` (change the load), step, controller tick.

        ``controller`` is a :class:`~pescheduler.control.controller.Controller` whose
        ``apply`` is :meth:`apply_record`; its decisions are in
        ``controller.decisions``. Returns the snapshots.
        """
        async def run() -> list[MetricsSnapshot]:
            seen = []
            for i in range(steps):
                if before is not None:
                    before(self, i)
                snap = self.step()
                seen.append(snap)
                await controller.tick(snap, self.placement)
            return seen
        return asyncio.run(run())

    @property
    def refusals(self) -> list[LogEntry]:
        return [e for e in self.log if not e.applied]

    def _borrow(self, action: BorrowHosts) -> str:
        if action.n < 1:
            raise ActionRefused(f"n must be >= 1 (got {action.n})")
        grant = action.n if self.host_pool is None else min(action.n, self.host_pool)
        if grant <= 0:
            raise ActionRefused("no hosts left to borrow")
        if self.host_pool is not None:
            self.host_pool -= grant
        workers = list(self.placement.workers)
        hosts = dict(self.placement.hosts)
        for _ in range(grant):
            h = f"h{self._next_host}"
            self._next_host += 1
            self._host_names.append(h)
            self._borrowed.add(h)
            for c in range(self.cores_per_host):
                w = f"sim://{h}/w{c}"
                workers.append(w)
                hosts[w] = h
        grown = replace(self.placement, workers=tuple(workers), hosts=MappingProxyType(hosts))
        self._set_placement(with_slots(grown, self.slots_per_host))
        return action.reason or f"granted {grant} of {action.n}"

    def _return(self, action: ReturnHost) -> str:
        h = action.host
        if h not in self._host_names:
            raise ActionRefused(f"unknown host {h!r}")
        busy = [p for p, pe in self.placement.pes.items() if pe.host == h
                or self.placement.hosts.get(pe.worker) == h]
        if busy:
            raise ActionRefused(f"host {h!r} still runs {len(busy)} PE(s), e.g. {busy[0]!r}; move them first")
        copies = [c for s in self.placement.slots.values() if s.host == h for c in s.copies]
        if copies:
            raise ActionRefused(f"host {h!r} still runs copies {copies}; release them first")
        workers = tuple(w for w in self.placement.workers if self.placement.hosts.get(w) != h)
        hosts = {w: hh for w, hh in self.placement.hosts.items() if hh != h}
        self._host_names.remove(h)
        self._borrowed.discard(h)
        if self.host_pool is not None:
            self.host_pool += 1
        self._set_placement(with_slots(replace(self.placement, workers=workers, hosts=MappingProxyType(hosts)),
                                       self.slots_per_host))
        return action.reason

