"""``copy``: copies of a hot operator on standard slots while traffic concentrates on it (Fujitsu).

In Fujitsu's standard-thread method the routers in front of parallel
operators watch where traffic goes; when it concentrates on one operator
(a hot spot: a busy key range, a burst on one branch) the router asks for
copies of that operator on warm standard slots and sends part of its
traffic there. Copies go again once the concentration has been gone for
``release-after`` (the Release's ``Hold``, counted by the controller), so a
hot spot that moves leaves nothing behind.

Here a router is an operator feeding others. Traffic concentrates on ``X``
when an instance of ``X`` is busy ``hot`` of the CPU it can use or more (a core, or its
host's quota); the copies
asked for bring the work per instance to ``target`` (at most ``max-copies``
in all, no more than free slots; none when the average instance is already
under ``target``: one hot instance among idle ones is a hot key, which more
copies cannot split). With several routers the
copies are exclusive to the one sending the most (weight N at that router,
as in the method), except for KEYED operators, whose copies every router
shares. A STATELESS operator's routers send each batch to the instance with
the most room (plan/routing.py), so one busy instance beside others with room
is not a concentration: its level is its instances' mean; and once it has
copies, a further one waits until the level stayed hot ``SETTLE_ROUNDS``
windows (issue 15: right after the first copy the original and the copy,
draining the backlog built before it at full speed, drew a second copy the
load did not need). The concentration is gone when all of ``X``'s instances together are
busy less than ``calm`` of one core and nothing waits for them (a backlog
with idle instances is a stall, not calm); then the copies the work no
longer needs at ``target`` go, not always all of them.
"""

from __future__ import annotations

import math

from pescheduler.actions import Action, Hold, Release, Replicate
from pescheduler.operator import Parallelism
from pescheduler.plugins import hookimpl

from ._common import View, settings, take_slots


SETTLE_ROUNDS = 3      # windows a STATELESS operator with copies stays hot before another copy


@hookimpl
def pescheduler_policy_decide(snapshot, placement, resources, config):
    """Copies for hot operators, released after a calm spell; see the module docstring."""
    return decide(snapshot, placement, config)


def decide(snapshot, placement, config) -> list[Action]:
    cfg = settings("copy", config)          # numbers, and durations in seconds
    hot, calm, target = cfg["hot"], cfg["calm"], cfg["target"]
    release_after, max_copies = cfg["release-after"], cfg["max-copies"]
    actions: list[Action] = []
    view = View.of(snapshot, placement)
    spare = view.free_slots()
    for op in view.originals:
        now = view.load(op)
        if now is None or not view.replicable(op):
            continue
        copies = now.instances - 1
        figures = {"hottest_busy": round(now.hottest, 3), "busy_cores": round(now.busy, 3), "copies": copies}
        by_credit = view.placement.plan.ops[op].parallelism is Parallelism.STATELESS
        level = now.busy / now.cores if by_credit else now.hottest
        per = now.cores / now.instances         # cores per instance: a copy is counted at as many
        if level >= hot:
            # enough instances for the work at ``target`` each; none when the work is already spread
            # that thin and one instance is still hot (a hot key: copies cannot split it further)
            wanted = min(math.ceil(now.busy / (target * per) - 1e-9) - now.instances, max_copies - copies)
            n = take_slots(spare, wanted, view.workers(op)) if wanted > 0 else 0
            if n > 0:
                router = _router(view, op)
                hold = Hold(rounds=SETTLE_ROUNDS) if by_credit and copies else None
                actions.append(Replicate(op, n, routers=router, hosts=view.cool_hosts(), figures=figures, hold=hold,
                                         reason=(
                    f"traffic concentrates on {op}: {'its instances are' if by_credit else 'an instance is'} "
                    f"{level:.0%} busy "
                    f"(≥ {hot:.0%}); {n} cop{'y' if n == 1 else 'ies'} on standard slots"
                    + (f", exclusive to router {router[0]}" if router else ""))))
        elif copies and now.busy < calm and not view.backlogged(op):
            # only the copies the work does not need at ``target``: releasing all of them left a
            # half-core instance with more than it can do, and the next window copied again
            # (issue 15: the flip-flops of bench/elastic.py's last phase)
            keep = max(1, math.ceil(now.busy / (target * per) - 1e-9))
            surplus = min(copies, now.instances - keep)
            if surplus > 0:
                actions.append(Release(op, surplus, figures={**figures, "calm_s": release_after, "keep": keep},
                                       hold=Hold(seconds=release_after),
                                       reason=(f"the concentration on {op} has been gone for "
                                               f"{release_after:.0f} s (all instances {now.busy:.0%} "
                                               f"of a core < {calm:.0%}): {surplus} of its {copies} cop"
                                               f"{'y goes' if surplus == 1 else 'ies go'}")))
    return actions


def _router(view: View, op: str) -> tuple[str, ...] | None:
    """The router the copies are exclusive to: the busiest sender, when there are several."""
    routers = view.upstream[op]
    if len(routers) < 2 or view.placement.plan.ops[op].parallelism is Parallelism.KEYED:
        return None
    sent = {r: (view.load(r).tuples_out if view.load(r) else 0.0) for r in routers}
    return (max(routers, key=lambda r: (sent[r], -routers.index(r))),)
