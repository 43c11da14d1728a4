"""The controller: every monitor interval, snapshot -> policies -> merge -> cooldown -> apply -> record.

Shaped like distributed's ``AdaptiveCore``: the decision core is pure and
tested with plain fakes (:func:`run_policies`, :func:`merge`,
:class:`Cooldown`), and :meth:`Controller.tick` is the thin loop that feeds
it a snapshot, applies what survives through an injected ``apply`` callable,
and records every decision.

Merging is deterministic. Actions are ordered by kind, most urgent first
(:data:`PRIORITY`: relieve overload before saving resources; hosts are
returned last, once this interval's fusions have emptied them), then by the
order the policies were selected in, then by each policy's own order. Two
actions conflict when they touch the same operator or host (:func:`touches`);
the first in that order wins, the other is *overruled*. An applied or
refused action starts a cooldown on everything it touched; an action
touching anything still cooling is *suppressed*, so no target flip-flops
faster than ``pescheduler.policies.cooldown``.

Policies are stateless: an action a policy wants applied only after it
asked for it a while (fewer copies after ``down-after`` windows in a row)
carries a :class:`~pescheduler.actions.Hold`, and :class:`Hysteresis` counts
the rounds and seconds here, before merging. Each policy decides in a thread
of its own with a deadline: a
policy over it is skipped that round and quarantined after
``pescheduler.policies.deadline-strikes`` rounds in a row (``isolation.py``). Each action is
validated on return (:func:`invalid`: field types, targets that exist): an
invalid one is *refused* with its reason, the policy's other actions go on.
A ``Replicate`` whose copies would land on a host with no more CPU
(:func:`onto_saturated`, ``pescheduler.policies.saturated-cpu``) is steered
to slots on hosts with CPU to spare (:func:`steer`), and refused with that
reason when none has a slot for it: a copy on a saturated host only shares
the cores the original already lacks. One that finds no slot left, which an
embedded cluster meets by starting a worker (a cold start), is refused
(:func:`cold_start_refusal`) when the machine it would start on has no more
CPU and no lender has a host: that worker would share the same saturated
cores. The check lives here, not in the pure transform, because the
placement carries no metrics and this is where every action meets the
snapshot, so no policy has to remember it.

A policy that raises, or returns anything but a list of actions, is
*quarantined*: never called again in this deployment, with the reason
logged; the other policies go on. Every decision (applied, refused,
overruled, suppressed, quarantined, and *cancelled*: still being applied, or
not tried yet, when the deployment ended and its round with it) goes to the decision log (JSON lines,
``pescheduler.policies.decision-log``; host events and copy activations too, :func:`append_log`) and to ``on_decision`` (the
deployment's status events, so the live view shows it).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
import traceback
from collections import deque
from dataclasses import dataclass, field, replace
from typing import Any, Awaitable, Callable, Iterable, Mapping

from .. import config
from ..actions import (Action, ActionRefused, BorrowHosts, Fuse, Move, Release, Replicate, ReturnHost, Split)
from .isolation import Deadlines
from ..errors import InvalidApplication
from ..metrics import MetricsSnapshot
from ..plan import transforms
from ..plan.placement import Placement
from ..requirements import problem
from ..suggest import did_you_mean
from ..resources import ResourceView

logger = logging.getLogger(__name__)

# Kinds in merge (and apply) order: relieve overload first, save resources last.
PRIORITY = (Replicate, Split, Move, BorrowHosts, Release, Fuse, ReturnHost)

Policy = Callable[..., Any]            # (snapshot, placement, resources, config) -> list[Action]


class UnknownPolicyError(InvalidApplication):
    """A selected policy is not installed (or failed to load); the message names what exists."""


@dataclass(frozen=True)
class Proposal:
    """An action as a policy proposed it: which policy, and where in its list."""

    policy: str
    rank: int              # the policy's position in the selection
    index: int             # the action's position in the policy's answer
    action: Action


@dataclass(frozen=True)
class Decision:
    """One thing the controller decided, with why (the action's reason) and what came of it."""

    t: float                       # the snapshot's time
    policy: str
    outcome: str                   # applied | refused | overruled | suppressed | skipped | quarantined | cancelled
    action: Action | None = None
    detail: str = ""               # refusal reason, who overruled, cooldown left, the error
    pause_ms: float = 0.0
    at: float = field(default_factory=time.time)

    def as_dict(self) -> dict:
        a = self.action
        return {"at": round(self.at, 3), "t": round(self.t, 3), "policy": self.policy, "outcome": self.outcome,
                "action": repr(a) if a is not None else None, "kind": type(a).__name__ if a else None,
                "target": a.target if a is not None else None, "reason": a.reason if a else "",
                "figures": dict(a.figures) if a else {}, "detail": self.detail,
                "pause_ms": round(self.pause_ms, 3)}

    def text(self) -> str:
        """One line for the live view."""
        if self.action is None:
            return f"{self.policy} {self.outcome} because it {self.detail}"
        why = f" ({self.detail})" if self.detail and self.outcome != "applied" else ""
        return f"{self.policy} {self.outcome} {self.action!r}{why}: {self.action.reason}"


ENDED = "the deployment ended before it was applied"    # a cancelled round's actions in flight or not tried


# -- the pure core --------------------------------------------------------------------------

def run_policies(policies: Mapping[str, Policy], snapshot: MetricsSnapshot, placement: Placement,
                 resources: ResourceView, configs: Mapping[str, Mapping]) -> tuple[list[Proposal], dict[str, str]]:
    """Call each policy once, in order; returns the proposals and ``{policy: why quarantined}``."""
    proposals: list[Proposal] = []
    failed: dict[str, str] = {}
    for rank, (name, decide) in enumerate(policies.items()):
        try:
            answer = decide(snapshot, placement, resources, configs.get(name, {}))
        except Exception as exc:
            failed[name] = _raised(exc)
            continue
        problem = _malformed(answer)
        if problem:
            failed[name] = problem
            continue
        proposals += [Proposal(name, rank, i, a) for i, a in enumerate(answer)]
    return proposals, failed


def _raised(exc: BaseException) -> str:
    return "raised " + "".join(traceback.format_exception_only(type(exc), exc)).strip()


def _malformed(answer: Any) -> str:
    """Why ``answer`` is not a list of actions ("" when it is)."""
    if not isinstance(answer, (list, tuple)):
        return f"returned {type(answer).__name__} {answer!r:.80}, not a list of actions"
    for a in answer:
        if not isinstance(a, Action) or type(a) not in PRIORITY:
            return f"returned {a!r:.80} in its list, which is not an action ({', '.join(k.__name__ for k in PRIORITY)})"
    return ""


def invalid(action: Action, placement: Placement) -> str:
    """Why ``action`` cannot be applied to ``placement`` as typed ("" when it can): a field of the
    wrong type, or a PE, operator or worker that does not exist."""
    pes, ops, workers = placement.pes, placement.plan.ops, placement.workers

    def named(value, where, what: str) -> str:
        if not isinstance(value, str):
            return f"{what} is {type(value).__name__} {value!r:.60}, not a name"
        return "" if value in where else f"{what} {value!r} does not exist"

    def count(value, what: str) -> str:
        ok = isinstance(value, int) and not isinstance(value, bool) and value >= 1
        return "" if ok else f"{what} must be a whole number >= 1, not {value!r:.60}"

    def names(values, where, what: str) -> str:
        if values is None:
            return ""
        if not isinstance(values, tuple):
            return f"{what} is {type(values).__name__}, not a tuple of names"
        return next((p for v in values for p in [named(v, where, what[:-1])] if p), "")

    if isinstance(action, Fuse):
        checks = [named(action.pe_a, pes, "pe_a"), named(action.pe_b, pes, "pe_b")]
    elif isinstance(action, Split):
        checks = [named(action.pe, pes, "pe")]
        if not checks[0]:
            checks.append(names(action.operators, pes[action.pe].operators, "operators"))
        if action.worker is not None:
            checks.append(named(action.worker, workers, "worker"))
    elif isinstance(action, Move):
        checks = [named(action.pe, pes, "pe"), named(action.worker, workers, "worker")]
    elif isinstance(action, (Replicate, Release)):
        checks = [named(action.operator, ops, "operator"), count(action.copies, "copies"),
                  names(action.routers, ops, "routers")]
    elif isinstance(action, BorrowHosts):
        checks = [count(action.n, "n")]
    else:
        checks = ["" if isinstance(action.host, str) else f"host is {type(action.host).__name__}, not a name"]
    return next((c for c in checks if c), "")


class Hysteresis:
    """Actions held until asked for long enough (their :class:`~pescheduler.actions.Hold`).

    Keyed by policy, kind and target: a round in which the policy does not ask
    again starts the count over, and so does an action let through (the next
    one is counted from scratch, as distributed's ``AdaptiveCore`` does with
    ``wait_count``).
    """

    def __init__(self) -> None:
        self.asked: dict[tuple, tuple[float, int]] = {}       # key -> (first asked, rounds in a row)

    def admit(self, proposals: Iterable[Proposal], now: float) -> list[Proposal]:
        """The proposals whose hold is over (and those without one); remembers the rest."""
        ready, asked = [], {}
        for p in proposals:
            hold = p.action.hold
            if hold is None:
                ready.append(p)
                continue
            key = (p.policy, type(p.action).__name__, p.action.target)
            first, rounds = self.asked.get(key, (now, 0))
            if rounds + 1 >= hold.rounds and now - first >= hold.seconds:
                ready.append(p)
            else:
                asked[key] = (first, rounds + 1)
        self.asked = asked
        return ready


def touches(action: Action, placement: Placement) -> frozenset[str]:
    """What ``action`` changes, as ``op:X`` / ``host:H`` / ``hosts`` keys (PE ids change on fuse/split)."""
    if isinstance(action, Fuse):
        return _pe_ops(placement, action.pe_a) | _pe_ops(placement, action.pe_b)
    if isinstance(action, (Split, Move)):
        return _pe_ops(placement, action.pe)
    if isinstance(action, (Replicate, Release)):
        return frozenset({f"op:{action.operator}"})
    if isinstance(action, ReturnHost):
        return frozenset({f"host:{action.host}"})
    return frozenset({"hosts"})


def _pe_ops(placement: Placement, pe_id: str) -> frozenset[str]:
    return frozenset(f"op:{placement.original(o)}" for o in placement.pe_operators(pe_id))


def merge(proposals: Iterable[Proposal], placement: Placement) -> tuple[list[Proposal], list[tuple[Proposal, Proposal]]]:
    """The proposals that survive, in apply order, and ``(overruled, winner)`` pairs."""
    ordered = sorted(proposals, key=lambda p: (PRIORITY.index(type(p.action)), p.rank, p.index))
    claimed: dict[str, Proposal] = {}
    kept, lost = [], []
    for p in ordered:
        keys = touches(p.action, placement)
        winner = next((claimed[k] for k in sorted(keys) if k in claimed), None)
        if winner is not None:
            lost.append((p, winner))
            continue
        kept.append(p)
        claimed.update(dict.fromkeys(keys, p))
    return kept, lost


class Cooldown:
    """When each target was last acted on; an action touching a target still cooling waits."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.last: dict[str, float] = {}

    def remaining(self, keys: Iterable[str], now: float) -> float:
        return max((self.last[k] + self.seconds - now for k in keys if k in self.last), default=0.0)

    def stamp(self, keys: Iterable[str], now: float) -> None:
        for k in keys:
            self.last[k] = now


# -- selecting policies -----------------------------------------------------------------------

def select_policies(plugins, names: Iterable[str]) -> dict[str, Policy]:
    """The ``pescheduler_policy_decide`` hookimpls of the plug-ins called ``names``, in that order.

    Only these are ever called (installed but unselected policies are not). An
    unknown name raises with the names that exist, and the load error of a
    policy that failed to import.
    """
    impls = {plugins.manager.get_name(i.plugin): i
             for i in plugins.manager.hook.pescheduler_policy_decide.get_hookimpls()}
    chosen: dict[str, Policy] = {}
    for name in names:
        if name not in impls:
            failed = [f for f in plugins.failures if f.name == name]
            why = (f": it failed to load ({failed[0].error.strip().splitlines()[-1]})" if failed else
                   f".{did_you_mean(name, impls)} Installed policies: {', '.join(sorted(impls)) or '(none)'}; a policy is a plug-in "
                   f"implementing pescheduler_policy_decide, named by its 'pescheduler' entry point")
            raise UnknownPolicyError(f"unknown policy {name!r}{why}")
        lacking = problem("policy", name, impls[name].plugin)
        if lacking is not None:
            raise UnknownPolicyError(f"{lacking[0]}: {lacking[1]}")
        chosen[name] = _caller(impls[name])
    return chosen


def _caller(impl) -> Policy:
    """Call a hookimpl as pluggy does: with the arguments it names (it may take fewer)."""
    def call(snapshot, placement, resources, config):
        given = {"snapshot": snapshot, "placement": placement, "resources": resources, "config": config}
        return impl.function(**{a: given[a] for a in impl.argnames})
    return call


def policy_configs(names: Iterable[str]) -> dict[str, dict]:
    """Each policy's settings (``pescheduler.policies.<name>``) plus its own ``history`` dict."""
    settings = {n: config.section(f"policies.{n}") for n in names}
    # a policy named like a controller key (``cooldown``) finds no mapping there: it gets none
    return {n: {**(s if isinstance(s, dict) else {}), "history": {}} for n, s in settings.items()}


# -- the thin loop ------------------------------------------------------------------------------

def onto_saturated(action: Action, placement: Placement, snapshot: MetricsSnapshot, limit: float | None) -> str:
    """Why ``action`` would copy an operator onto a host with no more CPU, or "" (not a
    ``Replicate``, no limit, or every landing host has CPU to spare). The copies land where
    the pure transform puts them; one it refuses is left for apply to refuse with its reason."""
    if not isinstance(action, Replicate) or limit is None:
        return ""
    try:
        after = transforms.replicate(placement, action)
    except ActionRefused:
        return ""
    for pe_id in [p for p in after.pes if p not in placement.pes]:      # in order: the same reason every run
        why = snapshot.saturated(after.pes[pe_id].host, limit)
        if why:
            return f"{why}; a copy of {action.operator!r} there would only share it"
    return ""


def cold_start_refusal(action: Action, placement: Placement, snapshot: MetricsSnapshot, limit: float | None,
                       resources: ResourceView | None) -> str:
    """Why ``action`` must not start a worker on this machine, or "": it needs a slot no worker
    has left (an embedded cluster then starts one: ``Reconfigurer._cold_slot``), every host the
    deployment did not borrow (the machine it starts on) has no more CPU, and no lender has a
    host. Issue 15: cold-started workers on the saturated machine of the elastic bench got
    0.05-0.2 core each, and the rate policy asked for ever more of them."""
    if not isinstance(action, Replicate) or limit is None or resources is None or resources.lendable > 0:
        return ""
    try:
        transforms.replicate(placement, action)
        return ""
    except transforms.NoSlotLeft as exc:
        short = str(exc)
    except ActionRefused:
        return ""                              # apply refuses it with its own reason
    own = [h for h in dict.fromkeys(placement.hosts.values()) if h not in resources.borrowed]
    whys = [snapshot.saturated(h, limit) for h in own]
    if not own or not all(whys):
        return ""
    return (f"{short}, and a worker started on this machine would only share its CPU: {whys[0]}; "
            f"no lender has a host (lendable 0)")


def steer(action: Action, placement: Placement, snapshot: MetricsSnapshot,
          limit: float | None, resources: ResourceView | None = None) -> tuple[Action, str]:
    """``action``, steered off hosts with no more CPU when its copies would land there, and
    why it must be refused ("" when it need not): a ``Replicate`` whose copies would share a
    saturated host's cores goes to slots on hosts below ``limit`` instead (``hosts=``), and is
    refused only when those have no slot for it, or when it would start a worker on a saturated
    machine with nothing to borrow (:func:`cold_start_refusal`, given ``resources``)."""
    why = onto_saturated(action, placement, snapshot, limit)
    if not why:
        return action, cold_start_refusal(action, placement, snapshot, limit, resources)
    cool = tuple(h for h in dict.fromkeys(s.host for s in placement.slots.values())
                 if not snapshot.saturated(h, limit) and (action.hosts is None or h in action.hosts))
    if cool:
        steered = replace(action, hosts=cool, reason=f"{action.reason}; steered to {', '.join(cool)}: "
                                                     f"{why.split(';')[0]}".lstrip("; "))
        try:
            transforms.replicate(placement, steered)
            return steered, ""
        except ActionRefused:
            pass
    return action, why


class Controller:
    """Runs the selected policies on each snapshot and applies what survives merge and cooldown.

    ``apply(action)`` is awaited for each action and returns an
    ``ApplyRecord``-like object (``applied``, ``reason``, ``pause_ms``);
    ``resources()`` gives the current :class:`ResourceView`.
    """

    def __init__(self, policies: Mapping[str, Policy], apply: Callable[[Action], Awaitable[Any]], *,
                 configs: Mapping[str, Mapping] | None = None, cooldown_s: float = 5.0,
                 resources: Callable[[], ResourceView] = ResourceView, log_path: str | None = None,
                 on_decision: Callable[[Decision], None] = lambda d: None, deployment: str = "",
                 keep: int = 1000, deadline_s: float | None = None, strikes: int | None = None,
                 saturated_cpu: float | None = None) -> None:
        self.policies = dict(policies)
        self.saturated_cpu = config.get("policies.saturated-cpu") if saturated_cpu is None else saturated_cpu
        self.deadlines = Deadlines(config.get_seconds("policies.deadline") if deadline_s is None else deadline_s,
                                   int(config.get("policies.deadline-strikes")) if strikes is None else strikes)
        self.hysteresis = Hysteresis()
        self.apply = apply
        self.configs = dict(configs) if configs is not None else policy_configs(self.policies)
        self.cooldown = Cooldown(cooldown_s)
        self.resources = resources
        self.log_path = os.path.expanduser(log_path) if log_path else None
        self.on_decision = on_decision
        self.deployment = deployment
        self.quarantined: dict[str, str] = {}
        self.decisions: deque[Decision] = deque(maxlen=keep)
        self.ticks = 0

    async def tick(self, snapshot: MetricsSnapshot, placement: Placement) -> list[Decision]:
        """One control round on ``snapshot``; returns this round's decisions."""
        self.ticks += 1
        resources = self.resources()
        proposals, made = await self._decide(snapshot, placement, resources)
        checked = [(p, invalid(p.action, placement)) for p in proposals]
        made += [Decision(snapshot.time, p.policy, "refused", p.action, f"invalid: {why}") for p, why in checked if why]
        checked = [(p, steer(p.action, placement, snapshot, self.saturated_cpu, resources))
                   for p, why in checked if not why]
        made += [Decision(snapshot.time, p.policy, "refused", p.action, why) for p, (_a, why) in checked if why]
        checked = [(replace(p, action=a), "") for p, (a, why) in checked if not why]
        ready = self.hysteresis.admit([p for p, why in checked if not why], snapshot.time)
        kept, lost = merge(ready, placement)
        made += [Decision(snapshot.time, p.policy, "overruled", p.action,
                          f"conflicts with {w.action!r} from {w.policy}") for p, w in lost]
        tried = len(made)
        try:
            for p in kept:
                made.append(await self._attempt(p, snapshot.time, placement))
        except asyncio.CancelledError:      # the deployment ended while one was applied
            made += [Decision(snapshot.time, p.policy, "cancelled", p.action, ENDED) for p in kept[len(made) - tried:]]
            raise
        finally:                            # recorded either way: a cancelled round logged nothing at all
            self._record(made)
        return made

    async def _decide(self, snapshot: MetricsSnapshot, placement: Placement,
                      resources: ResourceView) -> tuple[list[Proposal], list[Decision]]:
        """Each policy not quarantined, in order, each in a thread with a deadline."""
        proposals: list[Proposal] = []
        made: list[Decision] = []
        for rank, (name, decide) in enumerate(self.policies.items()):
            if name in self.quarantined:
                continue
            conf = self.configs.get(name, {})
            outcome, answer = await self.deadlines.call(
                name, lambda decide=decide, conf=conf: decide(snapshot, placement, resources, conf))
            if outcome == "ok":
                problem = _malformed(answer)
            else:
                problem = _raised(answer) if outcome == "raised" else answer
            if outcome == "late":
                made.append(Decision(snapshot.time, name, "skipped", detail=problem))
            elif problem:
                self.quarantined[name] = problem
                made.append(Decision(snapshot.time, name, "quarantined", detail=problem))
            else:
                proposals += [Proposal(name, rank, i, a) for i, a in enumerate(answer)]
        return proposals, made

    async def _attempt(self, p: Proposal, now: float, placement: Placement) -> Decision:
        keys = touches(p.action, placement)
        wait = self.cooldown.remaining(keys, now)
        if wait > 0:
            return Decision(now, p.policy, "suppressed", p.action, f"cooldown: {wait:.1f} s left")
        self.cooldown.stamp(keys, now)        # refused ones cool too: no retry storm every interval
        try:
            record = await self.apply(p.action)
        except Exception as exc:              # apply reports refusals; anything else is a refusal too
            return Decision(now, p.policy, "refused", p.action, f"{type(exc).__name__}: {exc}")
        if record.applied:
            return Decision(now, p.policy, "applied", p.action, "", getattr(record, "pause_ms", 0.0))
        return Decision(now, p.policy, "refused", p.action, record.reason)

    def _record(self, made: list[Decision]) -> None:
        for d in made:
            self.decisions.append(d)
            if d.outcome in ("quarantined", "skipped"):
                logger.warning("policy %s %s: %s", d.policy, d.outcome, d.detail)
            try:
                self.on_decision(d)
            except Exception:                 # the view must never stop the controller
                logger.exception("decision callback failed")
        append_log(self.log_path, self.deployment, [d.as_dict() for d in made])


def event(kind: str, outcome: str, target: str, figures: Mapping[str, Any], detail: str = "") -> dict:
    """A decision-log line for what no policy decided, in a decision's shape: a host event
    (``kind`` "host", ``outcome`` borrowed/returned/lost/refused/return-requested) or a copy's
    activation (``kind`` "activation", ``outcome`` "activated", ``figures["ms"]``)."""
    return {"at": round(time.time(), 3), "t": round(time.monotonic(), 3), "policy": None, "outcome": outcome,
            "action": None, "kind": kind, "target": target, "reason": "", "figures": dict(figures),
            "detail": detail, "pause_ms": 0.0}


def append_log(path: str | None, deployment: str, entries: list[dict]) -> None:
    """``entries`` as JSON lines in the decision log at ``path`` (none: nothing). Decisions, host
    events and copy activations (:func:`event`) share it, in the order they happen."""
    if not path or not entries:
        return
    try:
        path = os.path.expanduser(path)
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        with open(path, "a") as f:
            for e in entries:
                f.write(json.dumps({"deployment": deployment, **e}, default=repr) + "\n")
    except OSError as exc:            # a full disk must not stop the app: the events still show it
        logger.warning("cannot write the decision log %s: %s", path, exc)

