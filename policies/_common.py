"""Figures the built-in policies share: an operator's load over its instances, spare slots, settings.

The monitor reports every operator *instance* (the original ``X`` and each copy
``X#k``) on its own; policies reason about the operator, so these helpers sum
over :meth:`Placement.instances`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping

from dask.utils import parse_timedelta

from pescheduler.actions import Fuse, Hold, Replicate, ReturnHost
from pescheduler import config
from pescheduler.config import get, section
from pescheduler.metrics import MetricsSnapshot
from pescheduler.operator import Parallelism
from pescheduler.plan.placement import Placement


STARVED = 0.05         # an instance idle and blocked less than this share of a window had input all of it


@dataclass(frozen=True)
class Load:
    """One operator over the last interval, all its instances together."""

    op: str
    instances: int
    tuples_in: float          # tuples/s into every instance
    tuples_out: float
    busy: float               # cores: busy fractions summed over instances
    hottest: float            # the busiest instance's busy fraction of the CPU it can use
    capacity: float = 1.0     # cores the weakest instance can use
    cores: float = 1.0        # cores all its instances can use together, as its routing lets them (View.load)
    got_capacity: float = 1.0  # as ``capacity`` and ``cores``, counting what instances really got (View.got)
    got: float = 1.0


class View:
    """The placement indexed once per decision (the policies decide in milliseconds at 10,000 operators).

    ``originals``: the operators the user wrote, in topological order;
    ``instances[X]``: ``X`` and its copies; ``upstream[X]``: original
    operators feeding ``X``; ``pe_of[op]``: the PE running any instance.
    """

    def __init__(self, snapshot: MetricsSnapshot, placement: Placement) -> None:
        self.snapshot, self.placement = snapshot, placement
        ops = placement.plan.ops
        self.originals = [o for o, op in ops.items() if op.copy_of is None]
        self.instances: dict[str, list[str]] = {o: [o] for o in self.originals}
        for o, op in ops.items():
            if op.copy_of is not None:
                self.instances[op.copy_of].append(o)
        self.upstream: dict[str, list[str]] = {o: [] for o in self.originals}
        for s, _p, d in placement.plan.edges:
            if ops[s].copy_of is None and ops[d].copy_of is None and s not in self.upstream[d]:
                self.upstream[d].append(s)
        self.pe_of = {op: p for p, pe in placement.pes.items() for op in pe.operators}
        self._loads: dict[str, Load | None] = {}
        self._saturated: set[str] | None = None
        self._behind: set[str] | None = None

    _last: "View | None" = None

    @classmethod
    def of(cls, snapshot: MetricsSnapshot, placement: Placement) -> "View":
        """The view of this snapshot and placement, built once for all the policies of a round
        (both are immutable, so the last view built is reused while they are the same objects)."""
        last = cls._last
        if last is None or last.snapshot is not snapshot or last.placement is not placement:
            last = cls._last = cls(snapshot, placement)
        return last

    def load(self, op: str) -> Load | None:
        """``op``'s load summed over its instances; None when the monitor has not seen it yet."""
        if op in self._loads:
            return self._loads[op]
        metrics, names = self.snapshot.operators, self.instances[op]
        if len(names) == 1:                       # the common case, kept cheap: 10,000 per decision
            m = metrics.get(op)
            cores = self.cores(self.worker(op)) if m is not None else 1.0
            got = self.got(op, m, cores) if m is not None else 1.0
            found = None if m is None else Load(op, 1, m.tuples_in_per_s, m.tuples_out_per_s, m.busy,
                                                m.busy / cores, cores, cores, got, got)
        else:
            seen = [(metrics[i], self.cores(self.placement.pes[self.pe_of[i]].worker)) for i in names if i in metrics]
            got = [self.got(i, m, c) for i, (m, c) in zip((i for i in names if i in metrics), seen)]
            weakest, weakest_got = min((c for _m, c in seen), default=1.0), min(got, default=1.0)
            missing = len(names) - len(seen)
            found = Load(op, len(names), sum(m.tuples_in_per_s for m, _c in seen),
                         sum(m.tuples_out_per_s for m, _c in seen), sum(m.busy for m, _c in seen),
                         max(m.busy / c for m, c in seen), weakest,
                         (sum(c for _m, c in seen) + missing * weakest if self.by_credit(op)
                          else len(names) * weakest),
                         weakest_got,
                         (sum(got) + missing * weakest_got if self.by_credit(op)
                          else len(names) * weakest_got)) if seen else None
        self._loads[op] = found
        return found

    def got(self, instance: str, m, cores: float) -> float:
        """The cores ``instance`` really got, of the ``cores`` its worker may give one PE (the
        ``rate`` policy sizes by it, ``Load.got``): an instance whose PE had input all window
        (idle and backpressure together under ``STARVED``, input still queued at the sample)
        and was busy 0.6 of it had 0.6 of a core, whatever took the rest (other processes on
        its cores, the framework's own time). Sized at a full core it looked 60 % busy while its
        input backed up, and the hot spot was never relieved (issue 15). When the share comes
        back the instance idles and counts at ``cores`` again (rate.py holds what that would
        take away). A PE not running, or busy under ``STARVED`` (too little to tell), counts at
        ``cores``."""
        pe = self.snapshot.pes.get(self.pe_of.get(instance, ""))
        if pe is None or pe.state != "running" or m.busy < STARVED or m.busy >= cores \
                or pe.idle + pe.backpressure >= STARVED or not pe.queue_batches:
            return cores
        return m.busy

    def crowded(self, op: str) -> bool:
        """Does a host running ``op`` have no CPU left at all, other tenants' use included (its
        ``machine_cpu`` over ``policies.saturated-cpu``)? A share an instance lost there went to
        other processes: a copy beside it would only take theirs, and go again when their load
        does (bench/elastic.py at load 7.6: seven flip-flops in one phase)."""
        limit = get("policies.saturated-cpu")
        return any((h := self.snapshot.hosts.get(host)) is not None and h.machine_cpu > limit for host in self.hosts(op))

    def headroom(self, op: str) -> float:
        """Cores the hosts running ``op`` have left (their workers' cores times the share of its
        cores the deployment does not use): what instances of ``op`` could get on top of what
        they use now, however many of them there are on those hosts; infinite when a host's
        figures are missing (nothing known against it)."""
        left = 0.0
        for host in self.hosts(op):
            h = self.snapshot.hosts.get(host)
            if h is None:
                return math.inf
            left += max(0.0, 1.0 - h.cpu) * sum(self.cores(w) for w in h.workers)
        return left

    def by_credit(self, op: str) -> bool:
        """Are ``op``'s batches routed by credit (STATELESS, plan/routing.py)? Then its instances'
        CPU adds up: each takes what it can. Otherwise each gets an equal share, and the weakest
        instance sets what all of them can do."""
        return self.placement.plan.ops[op].parallelism is Parallelism.STATELESS

    def replicable(self, op: str) -> bool:
        """Copies could help: not a source (a copy would read the input twice), not SINGLETON."""
        lop = self.placement.plan.ops[op]
        return lop.copy_of is None and lop.parallelism is not Parallelism.SINGLETON and bool(self.upstream[op])

    def worker(self, op: str) -> str:
        return self.placement.pes[self.pe_of[op]].worker

    def cores(self, worker: str) -> float:
        """CPU one instance on ``worker`` can use: a core, or its share of its host's quota (a lab
        host of half a core): what sizing by CPU seconds divides by."""
        m = self.snapshot.workers.get(worker)
        return m.cores if m is not None and m.cores > 0 else 1.0

    def workers(self, op: str) -> set[str]:
        """The workers running ``op`` or one of its copies."""
        return {self.placement.pes[self.pe_of[i]].worker for i in self.instances[op] if i in self.pe_of}

    def hosts(self, op: str) -> set[str]:
        """The hosts running ``op`` or one of its copies."""
        return {self.placement.pes[self.pe_of[i]].host for i in self.instances[op] if i in self.pe_of}

    def backlogged(self, op: str, blocked: float = 0.1) -> bool:
        """``op`` has more input than it takes: a full input window on an instance, or a sender
        in another PE blocked on it, or a source before it far behind (:meth:`behind`). Its
        figures then understate its load (zero when stalled), so policies never scale it down on
        them."""
        pes, metrics = self.placement.pes, self.snapshot.pes
        mine = {self.pe_of[i] for i in self.instances[op] if i in self.pe_of}
        for p in mine:
            m = metrics.get(p)
            if m is not None and m.max_queue_batches and m.queue_batches >= m.max_queue_batches:
                return True
        senders = {self.pe_of[u] for u in self.upstream[op] if u in self.pe_of} - mine
        return any(p in metrics and metrics[p].backpressure >= blocked for p in senders if p in pes) \
            or op in self.behind()

    def behind(self) -> set[str]:
        """Sources that report lag and are more than a monitor window of their output behind, and the
        operators after them: those process a backlog (a source far behind need not be blocked:
        on a starved host it reads less than it is offered), so nothing is scaled down on their
        figures, as the Flink autoscaler scales nothing down while a source processes backlog
        (bench/elastic.py: a Release 1.1M tuples behind, then a Replicate, then a Release)."""
        if self._behind is None:
            ops, window = self.snapshot.operators, max(self.snapshot.interval_s, 1.0)
            late = set()
            for op in self.originals:
                if self.upstream[op]:
                    if any(u in late for u in self.upstream[op]):
                        late.add(op)
                    continue
                seen = [ops[i] for i in self.instances[op] if i in ops and ops[i].lag]
                if seen and sum(sum(m.lag.values()) for m in seen) > window * sum(m.tuples_out_per_s for m in seen):
                    late.add(op)
            self._behind = late
        return self._behind

    def free_slots(self) -> list[str]:
        """Workers of the standard slots holding no copy on hosts with CPU to spare, in slot order
        (a copy on a saturated host would only share its cores: such slots are not spare)."""
        hot = self.saturated_hosts()
        return [s.worker for s in self.placement.slots.values() if not s.copies and s.host not in hot]

    def saturated_hosts(self) -> set[str]:
        """Hosts of standard slots using more of their CPU than ``policies.saturated-cpu``."""
        if self._saturated is None:
            limit = get("policies.saturated-cpu")
            self._saturated = {s.host for s in self.placement.slots.values()
                               if self.snapshot.saturated(s.host, limit)}
        return self._saturated

    def cool_hosts(self) -> tuple[str, ...] | None:
        """Where copies should land (``Replicate(hosts=...)``): the slot hosts with CPU to spare,
        or None (anywhere) when no slot host is saturated."""
        hot = self.saturated_hosts()
        if not hot:
            return None
        return tuple(dict.fromkeys(s.host for s in self.placement.slots.values() if s.host not in hot))


def hosts_for(slots_needed: int, placement: Placement, budget: Mapping[str, Any] | None = None) -> int:
    """Hosts to borrow for ``slots_needed`` more copies (at least one). A copy takes one slot
    per worker (:func:`take_slots`), so a host lends no more than its workers (the manager's
    ``workers_per_host``, when its budget says: a lab host of half a core runs one worker)."""
    hosts = {s.host for s in placement.slots.values()} or {""}
    per_host = max(1, len(placement.slots) // len(hosts))
    workers = (budget or {}).get("workers_per_host")
    if workers:
        per_host = min(per_host, int(workers))
    return max(1, math.ceil(slots_needed / per_host))


def settings(name: str, config: Mapping[str, Any]) -> dict:
    """Policy ``name``'s settings: ``config`` over the declared ``pescheduler.policies.<name>``,
    each value in the form of its declared default (an integer, a number; a duration in seconds),
    so a policy reads ``cfg["max-copies"]`` where it uses it, with no conversion of its own.

    The defaults live in pescheduler.yaml only; a caller passing ``{}`` (a test,
    the simulator) gets them too.
    """
    declared = section(f"policies.{name}")
    return {key: _like(declared.get(key), value) for key, value in section(f"policies.{name}", config).items()}


def _like(default: Any, value: Any) -> Any:
    """``value`` in the form of ``default`` (a setting given as ``"3"`` or ``3.0`` where 3 is declared)."""
    if value is None or isinstance(default, bool) or default is None:
        return value
    if isinstance(default, int):
        return int(value)
    if isinstance(default, float):
        return float(value)
    if isinstance(default, str) and default[:1].isdigit():          # a duration: "10s", "500ms"
        return seconds(value)
    return value


def seconds(value: Any) -> float:
    """A duration setting (``"10s"``, ``"500ms"``, a number of seconds) in seconds."""
    return float(parse_timedelta(value, default="seconds"))


def take_slots(free: list[str], n: int, avoid: str | set[str]) -> int:
    """Take up to ``n`` of the ``free`` slot workers that are not in ``avoid`` (the workers
    running the operator already), one per worker: a second instance in one worker process
    shares its GIL and its host's CPU, so it adds no core (the placement spreads copies the same
    way, ``transforms.pick_slots``); ``free`` shrinks; returns how many were taken."""
    avoid = {avoid} if isinstance(avoid, str) else set(avoid)
    got, i = 0, 0
    while got < n and i < len(free):
        if free[i] not in avoid:
            avoid.add(free.pop(i))
            got += 1
        else:
            i += 1
    return got


def idle_returns(placement: Placement, resources, planned: list) -> list:
    """``ReturnHost`` for the borrowed hosts that this decision's fusions empty, or that have run
    nothing (no PE, no copy) for ``policies.idle-return-after`` (a host just borrowed is empty
    until something moves there: the ReturnHost's ``Hold``, counted by the controller, waits).
    A host this decision's copies may go to is not returned (bench/elastic.py's soak: a
    Replicate steered to lab-2 and lab-2's return, its hold just over, applied in one round)."""
    idle_s = config.get_seconds("policies.idle-return-after")
    leaving = {a.pe_b for a in planned if isinstance(a, Fuse)}
    had = {placement.hosts.get(pe.worker, pe.host) for pe in placement.pes.values()}
    used = {placement.hosts.get(pe.worker, pe.host) for p, pe in placement.pes.items() if p not in leaving}
    used |= {s.host for s in placement.slots.values() if s.copies}
    for a in planned:       # copies placed in this decision may land on a host that is empty now
        if isinstance(a, Replicate):
            used |= set(a.hosts) if a.hosts else {s.host for s in placement.slots.values()}
    actions = []
    for h in resources.borrowed:
        if h in used:
            continue
        if h in had:
            actions.append(ReturnHost(h, figures={"pes_left": 0},
                                      reason=f"borrowed host {h} runs nothing once fused: return it"))
        else:
            actions.append(ReturnHost(h, figures={"idle_s": idle_s}, hold=Hold(seconds=idle_s),
                                      reason=f"borrowed host {h} has run nothing for {idle_s:.0f} s"))
    return actions
