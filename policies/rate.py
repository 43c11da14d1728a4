"""``rate``: size every operator for the offered load in one step (the DS2 method).

DS2 (Kalavri et al., OSDI 2018) measures each operator's *true* processing
rate, tuples processed per second of busy time, which does not depend on
backpressure or idling. One pass in topological order then pushes the
sources' offered rate through the observed selectivities and gives every
operator the number of instances that runs it at ``target-utilisation``:

    instances(X) = ceil(target_in(X) / (true_rate(X) * target * cores))

``cores`` is what one instance can use: a core, or less on a host with a CPU
quota (a lab host of half a core), or what it really got: an instance that
had input all window and was busy 0.6 of it had 0.6 of a core (``View.got``:
the rest went to other processes on its cores or to the framework). A STATELESS operator's batches go by
credit (plan/routing.py), so its instances' cores add up: a copy of half a
core adds half a core. Any other operator's instances get equal shares of
the input, so the weakest instance, copies' slots included, sets it.

Scaling is in one step, up or down, through Replicate/Release of copies on
standard slots. No change while the projected utilisation at the current size
stays inside ``target ± tolerance``, so small swings are never chased. Up at
once; down only after ``down-after`` windows in a row say so (one noisy
window of a busy machine must not take copies away: the Release carries a
``Hold`` the controller counts, so the policy keeps no memory), and never
while the operator is backlogged (its figures then understate its load, down to zero
when it is stalled), nor while the instances left would not carry the load on
the CPU the operator gets now plus what its hosts have left (a copy asked for
because instances got a share of their cores idles once it is there, and at
full cores would look superfluous).

The sources' offered rate is what DS2 takes as given. A source that declares
its ``rate`` is offered that. A source that reports lag (Kafka, Redis
Streams, a paced schedule: records offered but not emitted yet) is offered its
output plus the growth of its lag over the window (the monitor's
``lag_per_s``), as the Flink Kubernetes autoscaler computes a source's data
rate: exact while it is held back (the lag grows by what it could not emit) and
while it drains a backlog (the lag falls by what it emits beyond its offered
rate). A held-back source that cannot tell reveals only a lower bound, so the
rest is a guess: a backpressured source emits less
than it is offered, and ``out / (1 - backpressure)`` (the rate it keeps while
not blocked) estimates it; a source blocked nearly all the time reveals
little (it may be far behind, or just fast), so the estimate counts at most
half the time as blocked: such a source is sized up at most 2x per step.
A source whose PE also idled in the window (waiting for its next input: a
paced or polled source) had caught up with what it was offered: the time it
was blocked was made up, and its output is its offered rate. Dividing by the
blocked time anyway read a backlog draining after a scale-in as load: a
source emitting its offered 5.2k/s while blocked half the time was taken as
offered 8.7-10k/s, and a Replicate followed a Release (issue 15, the flip-flops
of bench/elastic.py's last phase).
A source that reports lag is offered its backlog over ``catch-up``
(5 min) on top, so a burst is drained within that time; what such a source
has read but is still queued at the input of an operator after it is backlog
too (lag counts only records not read yet), and that operator is offered it
over ``catch-up`` on top of what flows in.

Hosts: when free standard slots run short, hosts are borrowed for the copies
that do not fit, each counted at the CPU a lent host gives one instance (the
manager's budget, ``cpu_per_host``: a lab host's half core), and the copies
wait for them: once they are there, all of them go in one ``Replicate``
(issue 15: a copy into the one free slot at once and the rest after the
borrow were two steps, and counting the hosts to borrow at a core each
borrowed half of what was needed: a third). A borrowed host that has run nothing for
``policies.idle-return-after`` (its copies released) is returned, so a load
that falls ends with the hosts it borrowed given back.
"""

from __future__ import annotations

import math

from pescheduler import config as pescheduler_config
from pescheduler.actions import Action, BorrowHosts, Hold, Release, Replicate
from pescheduler.operator import Parallelism
from pescheduler.plugins import hookimpl

from ._common import Load, View, hosts_for, idle_returns, settings


MAX_BLOCKED = 0.5      # of a source's time counted as blocked when estimating its offered rate
CAUGHT_UP_IDLE = 0.02  # a source PE idle this share of a window had nothing left to emit: out is offered


@hookimpl
def pescheduler_policy_decide(snapshot, placement, resources, config) -> list[Action]:
    """DS2 sizing of every operator; see the module docstring."""
    cfg = settings("rate", config)          # numbers, and durations in seconds
    target, tolerance, min_busy = cfg["target-utilisation"], cfg["tolerance"], cfg["min-busy"]
    max_copies, down_after = cfg["max-copies"], cfg["down-after"]
    if not snapshot.operators:
        return []
    view = View.of(snapshot, placement)
    offered = target_rates(view, cfg["catch-up"])
    actions: list[Action] = []
    spare = view.free_slots()
    borrowing = resources.lendable > 0 and not resources.pending_returns
    lent = _lent_cores(resources.budget) if borrowing else None
    short, short_held = 0, False
    for op in view.originals:
        now = view.load(op)
        if op not in offered or now is None or not view.replicable(op) or _stalled(now, offered[op]):
            continue
        want = min(_instances(now, offered[op], target, min_busy, now.got / now.instances), max_copies + 1)
        projected = _utilisation(now, offered[op], min_busy)
        if abs(projected - target) <= tolerance or want == now.instances:
            continue
        figures = {"offered_in_per_s": round(offered[op], 3), "true_rate_per_s": round(_true_rate(now, min_busy), 3),
                   "instances": now.instances, "wanted": want, "projected_utilisation": round(projected, 3),
                   "target": target, "cores_per_instance": round(now.got / now.instances, 3)}
        # Up only because instances got a share of their cores (View.got), not for the load at
        # full cores: a share lost to other processes for a window or two must not buy copies
        # (phase 1 of bench/elastic.py at load 6: Replicate, Release), so such a step waits
        # ``down-after`` windows in a row (the controller counts the Hold).
        # Nor where the share went to other tenants of a full machine (View.crowded).
        share_only = _utilisation(now, offered[op], min_busy, now.cores) <= target + tolerance
        if share_only and want > now.instances and view.crowded(op):
            continue
        hold = Hold(rounds=down_after) if share_only else None
        if want > now.instances and _hot_key(view, op, now, target):
            continue
        if want > now.instances:
            taken, want, cores = _slots_for(view, op, now, offered[op] / _true_rate(now, min_busy), target,
                                            max_copies + 1, spare, lent)
            n = len(taken)
            missing = want - now.instances - n
            short += missing
            figures.update(wanted=want, cores_per_instance=round(cores, 3))
            why = (f"{op} is offered {offered[op]:.0f} t/s and processes {figures['true_rate_per_s']:.0f} t/s "
                   f"per busy second: {want} instances of {figures['cores_per_instance']:g} core run it at "
                   f"{target:.0%} (it has {now.instances})")
            # one step: while hosts are borrowed for the rest, the free slots wait for them (the
            # borrow is applied within this round; the next round places every copy)
            if n > 0 and not (missing and borrowing):
                actions.append(Replicate(op, n, hosts=view.cool_hosts(), figures=figures, reason=why, hold=hold))
            elif missing and borrowing and share_only:
                short_held = True
            elif view.saturated_hosts() and resources.lendable == 0 and (ask := min(
                    want - now.instances, _usable_slots(view, op))):
                # nowhere to go and nothing to borrow: asked anyway, so the controller's refusal
                # (no host has CPU to spare) is on the record; for no more copies than there are
                # slots, or the refusal would be for slots, and a possible step would be lost
                actions.append(Replicate(op, ask, figures=figures, reason=why, hold=hold))
        elif not view.backlogged(op) and _room_after_release(view, op, now, want, offered[op],
                                                             target + tolerance, min_busy):
            # a backlog understates the load: never scale down on it
            actions.append(Release(op, now.instances - want, figures=figures, hold=Hold(rounds=down_after), reason=(
                f"{op} is offered {offered[op]:.0f} t/s: {want} instance(s) run it at or under "
                f"{target:.0%} (it has {now.instances}, projected {projected:.0%} each, "
                f"{down_after} windows in a row)")))
    if short and borrowing:
        actions.append(BorrowHosts(min(resources.lendable, hosts_for(short, placement, resources.budget)),
                                   figures={"slots_short": short}, hold=Hold(rounds=down_after) if short_held else None,
                                   reason=f"{short} more copies are needed than free standard slots"))
    elif not short:
        actions += idle_returns(placement, resources, actions)     # scale-in ends with the hosts
    return actions


def target_rates(view: View, catch_up_s: float = 300.0) -> dict[str, float]:
    """Tuples/s each operator is offered: source rates pushed through observed selectivities.

    A source that reports lag (records behind on its broker) is offered its
    backlog spread over ``catch_up_s`` on top, so what follows it is sized to
    drain the backlog within that time (the Flink Kubernetes autoscaler's
    catch-up duration). The source has already read part of a backlog: the
    records queued at an operator's input downstream of a lagging source are
    offered to it over ``catch_up_s`` too (bench/kafka.py (e): 27k of a 48k
    backlog were in channels at the first window, and sizing on the lag alone
    drained it late).
    """
    rate_in: dict[str, float] = {}
    rate_out: dict[str, float] = {}
    lagging: set[str] = set()            # operators fed by a source that reports lag
    for op in view.originals:
        now = view.load(op)
        if now is None:
            continue
        ups = view.upstream[op]
        if not ups:
            declared = view.placement.plan.ops[op].params.get("rate")
            reported = [view.snapshot.operators[i] for i in view.instances[op] if i in view.snapshot.operators]
            if any(m.lag for m in reported):
                lagging.add(op)
            if declared:
                rate_in[op] = rate_out[op] = float(declared)
            elif op in lagging:             # it knows how far behind it is: output + lag growth, no guess
                rate_in[op] = rate_out[op] = max(0.0, now.tuples_out + sum(m.lag_per_s for m in reported)) \
                    + _backlog(view, op) / catch_up_s
            else:
                pe = view.snapshot.pes.get(view.pe_of[op])
                blocked = min(pe.backpressure, MAX_BLOCKED) if pe and pe.idle < CAUGHT_UP_IDLE else 0.0
                rate_in[op] = rate_out[op] = now.tuples_out / (1.0 - blocked)
            continue
        if any(u not in rate_out for u in ups):
            continue
        rate_in[op] = sum(rate_out[u] for u in ups)
        if any(u in lagging for u in ups):
            lagging.add(op)
            rate_in[op] += queued(view, op) / catch_up_s
        selectivity = now.tuples_out / now.tuples_in if now.tuples_in > 0 else 1.0
        rate_out[op] = rate_in[op] * selectivity
    return rate_in


def _backlog(view: View, op: str) -> int:
    """Records behind on the broker, summed over the source's instances and partitions."""
    metrics = view.snapshot.operators
    return sum(sum(metrics[i].lag.values()) for i in view.instances[op] if i in metrics)


def queued(view: View, op: str) -> int:
    """Tuples waiting at the input of ``op``'s instances: in the input queues of the PEs they
    head (an operator fused after another takes its input synchronously: nothing waits there).
    Batches from another worker wait there as undecoded frames whose tuples the queue cannot
    count (its ``queue_tuples`` says 0 while ``queue_batches`` does not): those count as full
    batches (``pescheduler.batch.size``), which is what a source reading a backlog sends."""
    pes, metrics = view.placement.pes, view.snapshot.pes
    full = int(pescheduler_config.get("batch.size"))
    return sum(metrics[p].queue_tuples or metrics[p].queue_batches * full
               for p in {view.pe_of[i] for i in view.instances[op] if i in view.pe_of}
               if p in metrics and pes[p].operators[0] in view.instances[op])


def _hot_key(view: View, op: str, now: Load, target: float) -> bool:
    """A KEYED operator with copies whose instances are, on average, under ``target`` while
    its source is held back: one hot key group saturates one instance, and more instances
    cannot split it (the copy policy's rule too). Its source, behind, reveals only a lower
    bound of its offered rate, so sizing on it would ask for copies every window."""
    return (now.instances > 1 and view.placement.plan.ops[op].parallelism is Parallelism.KEYED
            and now.busy < target * now.cores)


def _usable_slots(view: View, op: str) -> int:
    """Slots a copy of ``op`` could take, whatever their hosts' CPU: one per worker not running
    ``op`` yet (as ``take_slots`` and the Replicate transform spread copies)."""
    running = set(view.workers(op))
    return len({s.worker for s in view.placement.slots.values() if s.worker not in running})


def _stalled(now: Load, offered: float) -> bool:
    """Was ``op`` offered input but took none in the window? Then it was held (a reconfiguration's
    pause, instances just placed, a stall upstream), not idle, and its figures tell nothing of its
    size either way. Read as idle, they sized it to one instance: under load (the 40-operator scale
    test at load 15) every Replicate was followed by a window with no input taken, a Release, and
    the Replicate again, 24 times in 6 minutes."""
    return offered > 0 and now.tuples_in <= 0


def _true_rate(now: Load, min_busy: float) -> float:
    """Tuples per busy second of one instance; 0 when too little was seen to measure."""
    return now.tuples_in / now.busy if now.busy >= min_busy and now.tuples_in > 0 else 0.0


def _instances(now: Load, offered: float, target: float, min_busy: float, cores: float = 1.0) -> int:
    """Instances of ``cores`` CPU each that run the offered load at ``target``."""
    rate = _true_rate(now, min_busy)
    if rate <= 0:
        return 1             # (almost) idle: one instance is plenty
    return max(1, math.ceil(offered / (rate * target * cores) - 1e-9))


def _utilisation(now: Load, offered: float, min_busy: float, cores: float | None = None) -> float:
    """Busy fraction of the CPU its instances get (``Load.got``; or ``cores``) at the current size
    under the offered load."""
    rate = _true_rate(now, min_busy)
    cores = now.got if cores is None else cores
    if rate <= 0:
        return now.busy / cores
    return offered / (rate * cores)


def _room_after_release(view: View, op: str, now: Load, want: int, offered: float, ceiling: float,
                        min_busy: float) -> bool:
    """Would the ``want`` instances left after a ``Release`` carry ``offered`` under ``ceiling``,
    given the CPU ``op`` really gets: at most their cores, and at most what it uses now plus what
    its hosts have left (``View.headroom``)? Fewer instances on the same cores get no more CPU
    between them. Without this, copies asked for while instances got a share of their cores
    (``View.got``) idle once they are there, look over-provisioned at full cores, and the Release
    that follows starves them again: a flip-flop that no hold outlasts."""
    rate = _true_rate(now, min_busy)
    if rate <= 0:
        return True
    cores = min(want * now.cores / now.instances, now.busy + view.headroom(op))      # at full cores each
    return offered <= ceiling * rate * cores + 1e-9


def _lent_cores(budget) -> float | None:
    """Cores one instance gets on a host the manager would lend (a lab host's quota per worker,
    at most a core), when its budget says; None when it does not."""
    cpu, workers = (budget or {}).get("cpu_per_host"), (budget or {}).get("workers_per_host") or 1
    return min(1.0, float(cpu) / int(workers)) if cpu else None


def _slots_for(view: View, op: str, now: Load, cpu: float, target: float, limit: int,
               spare: list[str], lent: float | None = None) -> tuple[list[str], int, float]:
    """The spare slot workers ``op``'s copies take (removed from ``spare``, one per worker off the
    workers running it) until ``cpu`` cores of work run at ``target``, the instances that needs, and
    the cores per instance it counted on. A slot's worker may give a copy less than a core (a lab
    host's quota). Routed by credit (STATELESS), the instances' cores add up: each takes what it
    can. Otherwise each gets an equal share and the weakest sets the size (issue 15: sized for a
    core per copy, copies on half-core hosts stayed backpressured and the next window asked for
    more). Instances beyond the free slots are counted at ``lent`` cores each (what a host the
    manager lends gives one: borrowing for copies of a core when its hosts have half a core each
    borrowed half of what was needed, and a second step followed), or, when nothing can be
    borrowed or the manager does not say, at the cores per instance so far."""
    additive = view.by_credit(op)
    n, weakest, total, avoid, taken = now.instances, now.got_capacity, now.got, view.workers(op), []
    while cpu / total > target + 1e-9 and n < limit:
        worker = next((w for w in spare if w not in avoid), None)
        if worker is None:
            break
        spare.remove(worker)
        avoid.add(worker)
        taken.append(worker)
        n, weakest = n + 1, min(weakest, view.cores(worker))
        total = total + view.cores(worker) if additive else n * weakest
    while lent and cpu / total > target + 1e-9 and n < limit:      # on hosts still to be borrowed
        n, weakest = n + 1, min(weakest, lent)
        total = total + lent if additive else n * weakest
    per = total / n
    return taken, min(limit, max(n, math.ceil(cpu / (target * per) - 1e-9))), per
