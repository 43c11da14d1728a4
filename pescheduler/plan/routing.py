"""Routing between an operator's instances: distribution lists, weights and key groups.

When operator ``X`` has copies, every upstream instance feeding it (a
*router*) splits its batches between ``X`` and the copies it uses:

* STATELESS: in weighted turns while every instance has room, by credit
  when one has none, a whole batch at a time: an instance whose channel is
  out of credit gives its turn to the instance with the most room (credit
  minus what its channel already buffers; ties in turn), so an instance on a
  starved host takes what it can and the others the rest. Turns come first
  because room alone misleads: a copy on the sender's own worker shares its
  event loop, so its channel shows little room while the sender runs, and
  sending every batch to the most room sent nearly all of them to the remote
  original (bench/parallel.py, one copy: 1.21x, with turns first 1.87x).
  Splitting in turn alone, the slowest instance set the pace of all (issue 15: a copy on a lab host with CPU to
  spare ran at a third of it, held back with the original on a saturated
  host). Nothing ties a STATELESS operator's tuple to an instance: no key,
  no state, no order to keep between instances. The operator's producer
  counts as held back only when every instance is out of credit
  (``Router.room_besides`` in worker/routing.py, worker/flow.py).
* MERGEABLE: weighted, a whole batch at a time (smooth weighted round
  robin, so per-tuple cost is zero). A router sends weight 1 to the
  original, N to each copy it uses exclusively (N = the number of routers
  feeding ``X``) and 1 to a copy it shares, as in Fujitsu's standard-thread
  method: with one exclusive copy per router, original and copies end up
  evenly loaded.
* KEYED: the key space is :data:`KEY_GROUPS` groups; each instance owns some;
  a tuple goes to the owner of ``key_group(key)``. Ownership changes only
  through the reconfiguration protocol, which moves the groups' state.

The routing data lives in the placement (:class:`Route`, pure and frozen);
:func:`router_targets` derives one router's view of it (a ``RouterTargets``,
shipped in the PE's spec); ``Router`` (worker/routing.py) is the small runtime
object the chain calls, and ``key_group`` (pescheduler/wire.py) the contract
both sides hash keys by.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

from ..wire import KEY_GROUPS, RouterTargets


@dataclass(frozen=True)
class Route:
    """How the instances of one operator share its input (placement data).

    ``users``: copy op id -> the routers (upstream instances) that send to it.
    ``key_groups``: KEYED only, instance op id -> the groups it owns.
    """

    users: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    key_groups: Mapping[str, tuple[int, ...]] | None = None

    def owners(self) -> list[str]:
        """Group -> owning instance (KEYED)."""
        owner = [""] * KEY_GROUPS
        for inst, groups in (self.key_groups or {}).items():
            for g in groups:
                owner[g] = inst
        return owner


def router_targets(original: str, copies: list[str], route: Route, router: str,
                   routers: list[str], stateless: bool = False) -> RouterTargets:
    """What ``router`` sends to, out of ``original`` and its ``copies`` (pure).
    ``stateless``: the operator is STATELESS, so batches go by credit."""
    if route.key_groups is not None:
        owners = tuple(route.owners())
        return RouterTargets(tuple([original] + copies), owners=owners)
    n = len(routers)
    used = [c for c in copies if router in route.users.get(c, ())]
    weights = [1] + [n if route.users[c] == (router,) and n > 1 else 1 for c in used]
    return RouterTargets(tuple([original] + used), tuple(weights), by_credit=stateless)


def even_key_groups(instances: list[str]) -> dict[str, tuple[int, ...]]:
    """Contiguous, even ranges of key groups over ``instances`` (in order)."""
    n = len(instances)
    return {inst: tuple(g for g in range(KEY_GROUPS) if g * n // KEY_GROUPS == i)
            for i, inst in enumerate(instances)}
