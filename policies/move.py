"""``move``: a hot PE off a host with no CPU to spare, onto a worker of an idle host.

A copy helps an operator that needs more CPU; a host that has no more CPU
helps none of its PEs, whatever their parallelism (a SINGLETON or a chain that
cannot be split included). When a host uses more than
``pescheduler.policies.saturated-cpu`` of its cores for ``after`` windows in a
row (the Move's ``Hold``, counted by the controller), its busiest PE (at least
``hot`` busy) moves to the worker of the idlest other host using at most
``idle`` of its cores, the worker running the fewest PEs there; one move per
saturated host per round, so each move is measured before the next.
"""

from __future__ import annotations

from pescheduler.actions import Action, Hold, Move
from pescheduler.config import get
from pescheduler.plugins import hookimpl

from ._common import settings


@hookimpl
def pescheduler_policy_decide(snapshot, placement, config) -> list[Action]:
    """Move a hot PE off each saturated host; see the module docstring."""
    return decide(snapshot, placement, config)


def decide(snapshot, placement, config) -> list[Action]:
    cfg = settings("move", config)
    limit = get("policies.saturated-cpu")
    hot, idle, after = float(cfg["hot"]), float(cfg["idle"]), int(cfg["after"])
    hosts = {placement.hosts.get(w, "") for w in placement.workers}
    cool = sorted((snapshot.hosts[h].cpu, h) for h in hosts if h in snapshot.hosts and snapshot.hosts[h].cpu <= idle)
    actions: list[Action] = []
    for host in sorted(hosts):
        why = snapshot.saturated(host, limit)
        pes = [(m.busy, p) for p, m in snapshot.pes.items()
               if p in placement.pes and placement.pes[p].host == host and m.busy >= hot]
        if not why or not pes or not cool:
            continue
        busy, pe = max(pes)
        free_cpu, target_host = cool.pop(0)              # one PE per idle host per round
        worker = _least_used(placement, target_host)
        actions.append(Move(pe, worker, hold=Hold(rounds=after), figures={
            "pe_busy": round(busy, 3), "host_cpu": round(snapshot.hosts[host].cpu, 3),
            "target_host_cpu": round(free_cpu, 3)}, reason=(
            f"{why}; its busiest PE {pe} ({busy:.0%} busy) moves to {target_host} "
            f"({free_cpu:.0%} of its cores in use)")))
    return actions


def _least_used(placement, host: str) -> str:
    """The worker of ``host`` running the fewest PEs (the first such in worker order)."""
    workers = [w for w in placement.workers if placement.hosts.get(w, "") == host]
    count = {w: 0 for w in workers}
    for pe in placement.pes.values():
        if pe.worker in count:
            count[pe.worker] += 1
    return min(workers, key=lambda w: count[w])
