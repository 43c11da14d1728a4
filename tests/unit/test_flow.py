"""No credit deadlock on any placement a transform can produce (worker/flow.py).

A model of credits and routes, checked exhaustively. Each channel of a
placement has a sender-side buffer (``pending``), ``credits`` and the
receiver's inbox (``credits + inbox == CREDITS``). A PE takes one batch from
an input (a channel, or a source of its own, which never runs dry) and emits
one batch on every output channel its operators reach from that input (the
worst case: a router picks one instance, a window may emit nothing); before
its next take it ships what credit allows, as the PE loop flushes after every
turn. Which inputs a PE may take is decided by the runtime's own
``flow.feeds`` over the PE's real consumer edges (``wiring.consumer_edges``).

Every reachable state of the model is enumerated (credits 1, so the space is
small) and each must let some PE take or ship a batch: with an endless source
a state where nothing can move is a deadlock. Placements come from random
sequences of Fuse, Split, Move, Replicate and Release on an app with
STATELESS, KEYED and MERGEABLE (window) operators and two branches, so
copies of keyed and windowed operators, fused non-adjacent operators and
copies next to their originals are all covered. The same model with the
rule the PE loop had before (issue 20: wait for credit, taking nothing, once
a channel's backlog is at the limit or the inbox is empty) finds the
deadlock of a copied window under load, so the check can fail.

A STATELESS operator's instances take batches by credit (plan/routing.py):
its router sends a batch to ONE instance, and a channel to one of them is
full only when no other instance takes batches (an instance fused into the
sending PE always does). The model's ``credit`` rule has the PE loop's
``InputScheduler.flush`` decide the full set with the runtime's own ``Chain.spared``
condition, and lets a router pick any instance that is not full (the
runtime picks the one with the most room: one of these), so every schedule
of the runtime is among the model's.
"""

from __future__ import annotations

from collections import deque

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pescheduler import Application
from pescheduler.actions import ActionRefused, Fuse, Move, Release, Replicate, Split
from pescheduler.plan.compiler import compile_app
from pescheduler.plan.wiring import consumer_edges, routing_for
from pescheduler.plan.transforms import transform
from pescheduler.plugins import load_plugins
from pescheduler.worker import flow
from pescheduler.worker.flow import RELIEF_BATCHES

WORKERS = ["tcp://a", "tcp://b", "tcp://c"]
CREDITS = 1
LIMIT = RELIEF_BATCHES * CREDITS          # a channel out of credit with this backlog is full
SMALL = 6                                 # channels up to which every model state is enumerated


def app() -> Application:
    a = Application("flow")
    keyed = a.source("numbers", count=10**9, keys=5).apply("tag").key_by("key")
    keyed.apply("running_sum").sink("collect")
    keyed.window(size=1000, aggregates={"n": ("count", "n")}).apply("tag").sink("collect")
    return a


@pytest.fixture(scope="module")
def base():
    return compile_app(app(), load_plugins(["support_ops"]), WORKERS, {w: w for w in WORKERS})


class Model:
    """The placement's channels and, per PE, what each input reaches."""

    def __init__(self, placement) -> None:
        plan = placement.plan
        self.channels = sorted({(s, p, dst_pe) for s, p, _d, dst_pe in placement.channels()})
        self.src_pe = [placement.pe_of(s) for s, _p, _pe in self.channels]
        self.pes = list(placement.pes)
        self.inputs: dict[str, list] = {}          # pe -> [(channel index or None for a source, outs it reaches)]
        self.edges = {pe: consumer_edges(placement, pe) for pe in self.pes}
        self.members = {pe: placement.pes[pe].operators for pe in self.pes}
        self._feeds: dict = {}
        self.outs = {pe: [i for i, _ in enumerate(self.channels) if self.src_pe[i] == pe] for pe in self.pes}
        self.placement = placement
        self.index = {c: i for i, c in enumerate(self.channels)}
        self.groups: dict[int, list[list]] = {}       # channel -> the by-credit routers' members it is one of
        self.options: dict[str, list] = {}            # pe -> [(channel or None, key, alternatives)]
        for pe in self.pes:
            ins = [(i, (s, p)) for i, (s, p, dst) in enumerate(self.channels) if dst == pe]
            ins += [(None, (op, "out")) for op in self.members[pe] if not plan.upstream(op)]
            self.inputs[pe] = [(i, key, self._reach(pe, *key)) for i, key in ins]
            self._credit_groups(pe)
            self.options[pe] = [(i, key, self._alternatives(pe, *key)) for i, key in ins]

    def feeds(self, pe: str, op: str, port: str, full: frozenset) -> bool:
        key = (pe, op, port, full)
        if key not in self._feeds:
            self._feeds[key] = flow.feeds(self.edges[pe], self.members[pe], op, port, full)
        return self._feeds[key]

    def dependency_cycle(self) -> list | None:
        """A cycle of the channel dependency graph (as for wormhole routing, Dally and Seitz):
        channel ``c`` depends on ``d`` when ``d`` leaves ``c``'s receiver and, while ``d`` is
        full, that PE does not take ``c``. A deadlock is a set of full channels each waiting on
        another, so without a cycle here no state of any schedule deadlocks."""
        deps = {i: [o for o in self.outs[dst] if self.feeds(dst, src, port, frozenset([self.channels[o][0]]))]
                for i, (src, port, dst) in enumerate(self.channels)}
        state: dict[int, int] = {}

        def visit(c: int, path: list) -> list | None:
            state[c] = 1
            for d in deps[c]:
                if state.get(d) == 1:
                    return path + [self.channels[d]]
                if d not in state and (found := visit(d, path + [self.channels[d]])):
                    return found
            state[c] = 2
            return None

        for c in deps:
            if c not in state and (found := visit(c, [self.channels[c]])):
                return found
        return None

    def _reach(self, pe: str, op: str, port: str) -> list[int]:
        start = [op] if op in self.members[pe] else [d for s, p, d in self.edges[pe] if (s, p) == (op, port)]
        ops = flow.downstream(self.edges[pe], start)
        return [i for i in self.outs[pe] if self.channels[i][0] in ops]

    # -- the credit rule (STATELESS copies) ----------------------------------------------------
    def _credit_groups(self, pe: str) -> None:
        """Per by-credit router of ``pe``: its members (a channel index, or None when the instance
        runs in ``pe``); a channel counts as routed by credit only when every consumer it serves
        is reached through such a router (as ``Chain._by_credit`` drops channels that carry
        batches no router chose)."""
        plan, pl = self.placement.plan, self.placement
        routed: dict[int, list] = {}
        unrouted: set[int] = set()
        for (src, port, x), (targets, _key) in routing_for(pl, pe).items():
            members = [None if pl.pe_of(d) == pe else self.index[(src, port, pl.pe_of(d))]
                       for d in targets.instances]
            for m in members:
                if m is not None:
                    routed.setdefault(m, []).append(members if targets.by_credit else None)
        for src, port, d in plan.edges:
            if src in self.members[pe] and pl.pe_of(d) != pe and pl.original(d) not in [
                    x for (s, p, x) in routing_for(pl, pe) if (s, p) == (src, port)]:
                unrouted.add(self.index[(src, port, pl.pe_of(d))])
        for c, groups in routed.items():
            if c not in unrouted and all(g is not None for g in groups):
                self.groups[c] = groups

    def _alternatives(self, pe: str, op: str, port: str) -> list[tuple[frozenset, frozenset]]:
        """What taking one batch of ``op.port``'s input may emit: ``(channels, chosen)`` pairs,
        ``chosen`` being the channels a by-credit router picked (each must not be full)."""
        start = [op] if op in self.members[pe] else [d for s, p, d in self.edges[pe] if (s, p) == (op, port)]
        return _product([self._process(pe, d) for d in start])

    def _process(self, pe: str, op: str) -> list[tuple[frozenset, frozenset]]:
        """``op`` (in ``pe``) processes a batch and emits on every port (the worst case)."""
        plan, pl = self.placement.plan, self.placement
        routing = routing_for(pl, pe)
        parts = []
        for port in dict.fromkeys(p for s, p, _d in plan.edges if s == op):
            consumers = [d for s, p, d in plan.edges if (s, p) == (op, port)]
            by_router: dict[str, list[str]] = {}
            for d in consumers:
                by_router.setdefault(pl.original(d) if (op, port, pl.original(d)) in routing else d, []).append(d)
            for x, ds in by_router.items():
                spec = routing[(op, port, x)][0] if (op, port, x) in routing else None
                if spec is not None and spec.by_credit:        # ONE instance, any that is not full
                    alts = []
                    for d in spec.instances:
                        if pl.pe_of(d) == pe:
                            alts += self._process(pe, d)
                        else:
                            c = self.index[(op, port, pl.pe_of(d))]
                            alts.append((frozenset([c]), frozenset([c])))
                    parts.append(alts)
                    continue
                for d in ds:                                   # every one (weighted, keyed: worst case)
                    if pl.pe_of(d) == pe:
                        parts.append(self._process(pe, d))
                    else:
                        c = self.index[(op, port, pl.pe_of(d))]
                        parts.append([(frozenset([c]), frozenset())])
        return _product(parts)

    def full_set(self, pe: str, chans: tuple, rule: str) -> set[str]:
        """The producers ``InputScheduler.flush`` holds back on: a full channel, unless (credit rule) another
        instance of each by-credit router it is one of still takes batches (``Chain.spared``)."""
        full = {i for i in self.outs[pe] if chans[i][0] >= LIMIT and not chans[i][1]}
        if rule == "credit":
            full = {i for i in full if not (i in self.groups and all(
                any(m is None or (m != i and m not in full) for m in g) for g in self.groups[i]))}
        return {self.channels[i][0] for i in full}

    def initial(self) -> tuple:
        return tuple((0, CREDITS) for _ in self.channels) + tuple(None for _ in self.pes)

    def moves(self, state: tuple, rule: str) -> list[tuple]:
        n = len(self.channels)
        chans, waiting = state[:n], state[n:]
        out = []
        for i, (pending, credits) in enumerate(chans):          # ship: the sender's flush
            if pending and credits:
                new = list(state)
                new[i] = (pending - 1, credits - 1)
                pe = self.pes.index(self.src_pe[i])
                if waiting[pe] == i and pending == 1:
                    new[n + pe] = None                           # (old rule) its blocking flush returns
                out.append(tuple(new))
        for k, pe in enumerate(self.pes):
            if waiting[k] is not None or any(chans[i][0] and chans[i][1] for i in self.outs[pe]):
                continue                                         # blocked, or it flushes first
            inbox = {i: CREDITS - chans[i][1] for i, _key, _r in self.inputs[pe] if i is not None}
            full = self.full_set(pe, chans, rule)
            if rule == "credit":
                out += self._takes(state, pe, inbox, full)
                continue
            if rule == "old":
                stuck = [i for i in self.outs[pe] if chans[i][0] and not chans[i][1]
                         and (chans[i][0] >= LIMIT or not any(inbox.values()))]
                if stuck:                                        # it awaits a whole flush of that channel
                    new = list(state)
                    new[n + k] = stuck[0]
                    out.append(tuple(new))
                    continue
            for i, (op, port), reach in self.inputs[pe]:
                if i is not None and not inbox[i]:
                    continue
                if rule == "new" and self.feeds(pe, op, port, frozenset(full)):
                    continue
                new = list(state)
                if i is not None:
                    new[i] = (chans[i][0], chans[i][1] + 1)      # taken: its credit goes back
                for o in reach:
                    new[o] = (new[o][0] + 1, new[o][1])
                out.append(tuple(new))
        return out

    def _takes(self, state: tuple, pe: str, inbox: dict, full: set[str]) -> list[tuple]:
        """Under the credit rule: each input ``pe`` may take, with each emission its routers allow."""
        n = len(self.channels)
        chans = state[:n]
        out = []
        for i, (op, port), alternatives in self.options[pe]:
            if (i is not None and not inbox[i]) or self.feeds(pe, op, port, frozenset(full)):
                continue
            for reach, chosen in alternatives:
                if any(chans[c][0] >= LIMIT and not chans[c][1] for c in chosen):
                    continue                                   # a router never picks a full instance
                new = list(state)
                if i is not None:
                    new[i] = (chans[i][0], chans[i][1] + 1)
                for o in reach:
                    new[o] = (new[o][0] + 1, new[o][1])
                out.append(tuple(new))
        return out

    def deadlock(self, rule: str, limit: int = 200_000) -> tuple | None:
        """A reachable state where nothing can move, or None (every state enumerated)."""
        start = self.initial()
        seen, todo = {start}, deque([start])
        while todo:
            state = todo.popleft()
            nexts = self.moves(state, rule)
            if not nexts:
                return state
            for s in nexts:
                if s not in seen:
                    seen.add(s)
                    todo.append(s)
            assert len(seen) < limit, "state space larger than expected"
        return None

    def describe(self, state: tuple) -> str:
        return "; ".join(f"{c} pending {p} credits {k}" for c, (p, k) in zip(self.channels, state))


def _product(parts: list[list[tuple[frozenset, frozenset]]]) -> list[tuple[frozenset, frozenset]]:
    """Every way of choosing one alternative from each part, unioned."""
    combos = [(frozenset(), frozenset())]
    for alts in parts:
        combos = list(dict.fromkeys((a | r, b | q) for a, b in combos for r, q in alts))
    return combos


def test_the_copied_window_deadlocks_under_the_old_rule_and_not_under_flow(base):
    placement = transform(base, Replicate("window-6", 1))
    model = Model(placement)
    assert any(placement.plan.ops[s].copy_of for s, _p, _pe in model.channels), "the copy's partials travel"
    assert model.deadlock("old") is not None
    found = model.deadlock("new")
    assert found is None, model.describe(found)


def test_fused_non_adjacent_operators_feeding_each_other(base):
    placement = transform(base, Fuse("numbers-1", "key_by-3->running_sum-4->window-6->collect-5->tag-7->collect-8"))
    model = Model(placement)
    assert model.dependency_cycle() is None and model.deadlock("new") is None


def test_the_dependency_graph_has_the_cycle_of_the_old_rule(base):
    model = Model(transform(base, Replicate("window-6", 1)))
    model.feeds = lambda pe, op, port, full: bool(full)     # old rule: waiting for credit, it takes nothing
    assert model.dependency_cycle() is not None


ACTIONS = st.one_of(
    st.builds(lambda op: Replicate(op, 1), st.sampled_from(["tag-2", "running_sum-4", "window-6", "tag-7"])),
    st.builds(lambda op: Release(op, 1), st.sampled_from(["tag-2", "running_sum-4", "window-6", "tag-7"])),
    st.tuples(st.integers(0, 20), st.integers(0, 20)),           # fuse the i-th and j-th PE
    st.tuples(st.integers(0, 20), st.integers(1, 5), st.sampled_from(WORKERS)),   # split the i-th PE
    st.tuples(st.integers(0, 20), st.sampled_from(WORKERS)),     # move the i-th PE
)


def concrete(placement, drawn):
    """A drawn action made concrete on ``placement`` (PEs chosen by index)."""
    if not isinstance(drawn, tuple):
        return drawn
    pes = list(placement.pes)
    if len(drawn) == 2 and isinstance(drawn[1], int):
        return Fuse(pes[drawn[0] % len(pes)], pes[drawn[1] % len(pes)])
    if len(drawn) == 3:
        ops = placement.pes[pes[drawn[0] % len(pes)]].operators
        return Split(pes[drawn[0] % len(pes)], ops[: drawn[1] % max(1, len(ops) - 1) + 1], worker=drawn[2])
    return Move(pes[drawn[0] % len(pes)], drawn[1])


def placed(placement, steps):
    """``placement`` after the drawn actions that apply (refused ones are skipped)."""
    for drawn in steps:
        try:
            placement = transform(placement, concrete(placement, drawn))
        except (ActionRefused, ValueError):
            continue
    return placement


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(steps=st.lists(ACTIONS, min_size=1, max_size=8))
def test_no_placement_a_transform_produces_can_deadlock(base, steps):
    placement = placed(base, steps)
    model = Model(placement)
    assert model.dependency_cycle() is None, [str(s) for s in steps]
    if len(model.channels) <= SMALL:           # and every state of the model, where it stays small
        found = model.deadlock("new")
        assert found is None, f"{[str(s) for s in steps]}: {model.describe(found)}"


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(steps=st.lists(ACTIONS, min_size=0, max_size=6), last=ACTIONS)
def test_a_reconfiguration_parks_nothing_so_the_flow_rule_alone_decides(base, steps, last):
    """The flow rule and the Aligner together: an aligning PE parks what a channel brings after
    its marker, and parked batches grant no credit, so parking could starve a sender the flow rule
    counts on. In a reconfiguration every input of a PE being replaced is held by its sender right
    after the marker (an upstream that stays holds it; a replaced upstream holds its outputs once
    aligned), so nothing is ever parked, and the model above (markers travel as batches do, held
    channels are never full: test_held_watermarks) is the whole story."""
    from pescheduler.control.protocol import plan_reconfiguration
    from pescheduler.plan.wiring import channel_ids

    placement = placed(base, steps)
    try:
        new = transform(placement, concrete(placement, last))
    except (ActionRefused, ValueError):
        return
    old_channels = channel_ids(placement, "d", 1)
    plan = plan_reconfiguration(placement, new, old_channels, "d", 2)
    held = {cid for cids in plan.hold.values() for cid in cids}
    for (src, port, dst_pe), cid in old_channels.items():
        if dst_pe in plan.retired:
            assert cid in held or placement.pe_of(src) in plan.retired, \
                f"{cid} into a replaced PE is not held after its marker ({last}): its batches would be parked"


@pytest.mark.parametrize("copied", ["tag-2", "tag-7"])
def test_a_stateless_copy_by_credit_passes_over_a_full_instance_and_never_deadlocks(base, copied):
    """A copy of a STATELESS ``tag``: its router takes batches by credit, over two channels
    (``tag-2``'s) or a channel and the instance in its own PE (``tag-7``, fused with the window).
    Some reachable state has a channel into one instance full while the PE still takes input (the
    rule at work), and no reachable state deadlocks."""
    model = Model(transform(base, Replicate(copied, 1)))
    assert model.groups, f"{copied}'s instances are reached by credit"
    assert model.deadlock("credit") is None
    start = model.initial()
    seen, todo, spared = {start}, deque([start]), False
    n = len(model.channels)
    while todo and not spared:
        state = todo.popleft()
        for pe in model.pes:
            chans = state[:n]
            raw = {model.channels[i][0] for i in model.outs[pe] if chans[i][0] >= LIMIT and not chans[i][1]}
            spared |= bool(raw - model.full_set(pe, chans, "credit"))
        for s in model.moves(state, "credit"):
            if s not in seen:
                seen.add(s)
                todo.append(s)
    assert spared, "no state where a full instance was passed over"


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(steps=st.lists(ACTIONS, min_size=1, max_size=8))
def test_no_placement_deadlocks_when_stateless_copies_take_batches_by_credit(base, steps):
    placement = placed(base, steps)
    model = Model(placement)
    if model.groups and len(model.channels) <= SMALL - 1:   # every state enumerated, kept quick
        found = model.deadlock("credit")
        assert found is None, f"{[str(s) for s in steps]}: {model.describe(found)}"
