"""The controller's pure core (run, merge, cooldown) and its thin loop, driven by plain fakes."""

from __future__ import annotations

import asyncio
import json
import random

import pytest

from pescheduler.actions import BorrowHosts, Fuse, Hold, Move, Release, Replicate, ReturnHost, Split
from pescheduler.control.controller import (Controller, Cooldown, Hysteresis, Proposal, UnknownPolicyError, invalid,
                                            merge, run_policies, select_policies, touches)
from pescheduler.metrics import MetricsSnapshot
from pescheduler.plugins import load_plugins
from pescheduler.control.protocol import ApplyRecord
from pescheduler.resources import ResourceView
from pescheduler.sim import Simulation

PL = Simulation.chain(5).placement          # PEs op0 .. op4, one operator each


def snap(t: float) -> MetricsSnapshot:
    return MetricsSnapshot(t, 1.0)


def says(*actions):
    """A policy that always proposes ``actions`` and counts its calls."""
    def policy(snapshot, placement, resources, config):
        policy.calls += 1
        return list(actions)
    policy.calls = 0
    return policy


class FakeRuntime:
    """``apply`` as the deployment's: records what it was asked, refuses what it is told to."""

    def __init__(self, refuse=()):
        self.asked, self.refuse = [], set(refuse)

    async def apply(self, action):
        self.asked.append(action)
        if repr(action) in self.refuse:
            return ApplyRecord(action, False, "no such PE")
        return ApplyRecord(action, True, action.reason, pause_ms=12.0)


def tick(controller, t=1.0, placement=PL):
    return asyncio.run(controller.tick(snap(t), placement))


# -- the pure core --------------------------------------------------------------------------------

def test_merge_orders_by_kind_then_policy_then_position_whatever_the_input_order():
    proposals = [Proposal("b", 1, 0, Fuse("op3", "op4")), Proposal("a", 0, 0, Release("op1")),
                 Proposal("a", 0, 1, ReturnHost("h9")), Proposal("b", 1, 1, Replicate("op2")),
                 Proposal("a", 0, 2, BorrowHosts(1)), Proposal("b", 1, 2, Split("op0", ("op0",)))]
    expected = ["Replicate('op2', 1)", "Split('op0', ('op0',))", "BorrowHosts(1)", "Release('op1', 1)",
                "Fuse('op3', 'op4')", "ReturnHost('h9')"]
    for seed in range(5):
        random.Random(seed).shuffle(proposals)
        kept, lost = merge(proposals, PL)
        assert [repr(p.action) for p in kept] == expected and lost == []


def test_conflicts_on_one_target_go_the_same_way_every_time():
    rate_up = Proposal("rate", 0, 0, Replicate("op2", 2))
    copy_up = Proposal("copy", 1, 0, Replicate("op2", 1))
    down = Proposal("copy", 1, 1, Release("op2", 1))
    fuse = Proposal("threshold", 2, 0, Fuse("op1", "op2"))
    for order in ([rate_up, copy_up, down, fuse], [fuse, down, copy_up, rate_up]):
        kept, lost = merge(order, PL)
        assert kept == [rate_up]                         # more urgent kind, then the earlier policy
        assert lost == [(copy_up, rate_up), (down, rate_up), (fuse, rate_up)]


def test_touches_keys_on_operators_so_renamed_pes_still_conflict():
    assert touches(Fuse("op1", "op2"), PL) == {"op:op1", "op:op2"}
    assert touches(Split("op1->op2", ("op2",)), PL) == {"op:op1", "op:op2"}      # unknown PE: its name
    assert touches(Move("op3", "w"), PL) == {"op:op3"}
    assert touches(BorrowHosts(2), PL) == {"hosts"} and touches(ReturnHost("h1"), PL) == {"host:h1"}


def test_cooldown_suppresses_until_it_has_passed():
    c = Cooldown(5.0)
    c.stamp({"op:a"}, 10.0)
    assert c.remaining({"op:a", "op:b"}, 12.0) == pytest.approx(3.0)
    assert c.remaining({"op:b"}, 12.0) == 0.0 and c.remaining({"op:a"}, 15.0) == 0.0


def test_a_raising_or_garbage_policy_is_named_and_the_others_still_answer():
    def boom(*args):
        raise RuntimeError("division by zero in my policy")

    good = says(Replicate("op2"))
    policies = {"boom": boom, "none": says(), "junk": lambda *a: None, "text": says("split it"), "good": good}
    proposals, failed = run_policies(policies, snap(1), PL, ResourceView(), {})
    assert [p.action for p in proposals] == [Replicate("op2")] and proposals[0].rank == 4
    assert failed["boom"] == "raised RuntimeError: division by zero in my policy"
    assert "returned NoneType None, not a list of actions" in failed["junk"]
    assert "'split it'" in failed["text"] and "not an action" in failed["text"]
    assert "none" not in failed


# -- the loop -----------------------------------------------------------------------------------------

def test_tick_applies_records_and_cools_down(tmp_path):
    runtime = FakeRuntime(refuse={"Fuse('op3', 'op4')"})
    seen = []
    log = tmp_path / "decisions.jsonl"
    up = Replicate("op2", 2, reason="op2 is hot", figures={"busy": 1.0})
    ctl = Controller({"rate": says(up), "threshold": says(Fuse("op3", "op4", reason="cold"))},
                     runtime.apply, cooldown_s=5.0, log_path=str(log), on_decision=seen.append, deployment="d-1")
    first = tick(ctl, 1.0)
    assert [(d.policy, d.outcome) for d in first] == [("rate", "applied"), ("threshold", "refused")]
    assert first[0].pause_ms == 12.0 and first[1].detail == "no such PE"
    again = tick(ctl, 3.0)                  # both targets cool for 5 s, refused ones too
    assert [d.outcome for d in again] == ["suppressed", "suppressed"] and "3.0 s left" in again[0].detail
    assert len(runtime.asked) == 2
    later = tick(ctl, 6.0)
    assert [d.outcome for d in later] == ["applied", "refused"] and len(runtime.asked) == 4
    assert seen == list(ctl.decisions) and len(seen) == 6
    rows = [json.loads(line) for line in log.read_text().splitlines()]
    assert len(rows) == 6 and rows[0]["deployment"] == "d-1"
    assert rows[0] | {"at": 0} == {"at": 0, "deployment": "d-1", "t": 1.0, "policy": "rate", "outcome": "applied",
                                   "action": "Replicate('op2', 2)", "kind": "Replicate", "target": "op2",
                                   "reason": "op2 is hot", "figures": {"busy": 1.0}, "detail": "", "pause_ms": 12.0}
    assert "threshold refused Fuse('op3', 'op4') (no such PE): cold" == seen[1].text()


def test_a_quarantined_policy_is_never_called_again_and_the_others_go_on():
    def boom(*args):
        boom.calls += 1
        raise ValueError("bad figure")
    boom.calls = 0
    runtime = FakeRuntime()
    good = says(Replicate("op2"))
    ctl = Controller({"boom": boom, "good": good}, runtime.apply, cooldown_s=0.0)
    first = tick(ctl, 1.0)
    assert [(d.policy, d.outcome) for d in first] == [("boom", "quarantined"), ("good", "applied")]
    assert "raised ValueError: bad figure" in first[0].detail and "boom quarantined" in first[0].text()
    for t in (2.0, 3.0):
        assert [d.policy for d in tick(ctl, t)] == ["good"]
    assert boom.calls == 1 and good.calls == 3 and ctl.quarantined == {"boom": "raised ValueError: bad figure"}


def test_apply_raising_is_a_refusal_not_a_crash():
    async def broken(action):
        raise ConnectionError("worker gone")
    ctl = Controller({"p": says(Move("op1", PL.workers[0]))}, broken)     # valid, but applying raises
    [d] = tick(ctl)
    assert d.outcome == "refused" and d.detail == "ConnectionError: worker gone"


def test_a_round_cancelled_while_it_applies_still_logs_what_it_decided(tmp_path):
    """The deployment's end cancels the round in flight: the action being applied and those not
    tried yet are logged as cancelled, with the round's other decisions. Before, the round logged
    nothing at all: a loaded suite's policy test found no decision log (sessions 79 and 80), its
    Replicate waiting for the reconfiguration lock until the stream had ended (session 81)."""
    started = asyncio.Event()

    async def hangs(action):
        started.set()
        await asyncio.Event().wait()            # the markers never come: only the cancel ends it
    log, seen = tmp_path / "decisions.jsonl", []
    ctl = Controller({"p": says(Replicate("op2", reason="queued"), Move("op1", PL.workers[0]), Replicate("nope"))},
                     hangs, cooldown_s=0.0, log_path=str(log), on_decision=seen.append)

    async def main():
        round_ = asyncio.create_task(ctl.tick(snap(1.0), PL))
        await asyncio.wait_for(started.wait(), 10)
        round_.cancel()
        with pytest.raises(asyncio.CancelledError):
            await round_
    asyncio.run(main())
    rows = [json.loads(line) for line in log.read_text().splitlines()]
    assert [(r["action"], r["outcome"]) for r in rows] == [
        ("Replicate('nope', 1)", "refused"), ("Replicate('op2', 1)", "cancelled"),
        (repr(Move("op1", PL.workers[0])), "cancelled")]
    assert rows[1]["detail"] == "the deployment ended before it was applied" and rows[1]["reason"] == "queued"
    assert [d.outcome for d in seen] == ["refused", "cancelled", "cancelled"]


def test_each_policy_gets_its_settings_and_a_history_of_its_own():
    got = {}

    def remember(snapshot, placement, resources, config):
        config["history"].setdefault("ticks", 0)
        config["history"]["ticks"] += 1
        got[config["name"]] = dict(config["history"])
        return []
    ctl = Controller({"a": remember, "b": remember}, FakeRuntime().apply,
                     configs={"a": {"name": "a", "history": {}}, "b": {"name": "b", "history": {"ticks": 10}}})
    tick(ctl)
    tick(ctl, 2.0)
    assert got == {"a": {"ticks": 2}, "b": {"ticks": 12}}


# -- selecting installed policies -----------------------------------------------------------------------

def test_only_the_selected_policies_are_called_through_their_hookimpls():
    plugins = load_plugins()
    chosen = select_policies(plugins, ["copy", "rate"])
    assert list(chosen) == ["copy", "rate"]                  # selection order = merge rank
    sim = Simulation.chain(5, costs={2: 4e-4}, source_rate=4000.0)
    answers = {n: p(sim.step(), sim.placement, sim.resources(), {}) for n, p in chosen.items()}
    assert [repr(a) for a in answers["rate"]] == ["Replicate('op2', 2)"]
    assert select_policies(plugins, []) == {}


def test_an_unknown_policy_names_the_installed_ones():
    with pytest.raises(UnknownPolicyError) as err:
        select_policies(load_plugins(), ["rate", "ds3"])
    assert "unknown policy 'ds3'" in str(err.value)
    assert "copy, move, rate, threshold" in str(err.value)


def test_an_installed_but_unselected_policy_is_never_called(tmp_path, monkeypatch):
    (tmp_path / "loud_policy.py").write_text(
        "import pescheduler\n\n@pescheduler.hookimpl\n"
        "def pescheduler_policy_decide(snapshot, placement, resources, config):\n"
        "    raise AssertionError('an unselected policy was called')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    plugins = load_plugins(("loud_policy",))
    assert "loud_policy" in plugins.policies()                      # installed
    sim = Simulation.chain(5, costs={2: 4e-4}, source_rate=4000.0)
    ctl = Controller(select_policies(plugins, ["rate"]), sim.apply_record, resources=sim.resources)
    sim.control(ctl, 3)
    assert ctl.quarantined == {} and [d.policy for d in ctl.decisions] == ["rate"]


def test_policy_settings_come_from_dask_config_with_a_fresh_history_each():
    import dask

    from pescheduler.control.controller import policy_configs
    with dask.config.set({"pescheduler.policies.rate.tolerance": 0.05}):
        configs = policy_configs(["rate", "mine", "cooldown"])
    assert configs["rate"]["tolerance"] == 0.05 and configs["rate"]["target-utilisation"] == 0.7
    assert configs["mine"] == {"history": {}} and configs["cooldown"] == {"history": {}}
    assert configs["rate"]["history"] is not configs["mine"]["history"]


def test_an_unwritable_decision_log_does_not_stop_the_round(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    runtime = FakeRuntime()
    ctl = Controller({"p": says(Replicate("op2"))}, runtime.apply, log_path=str(blocker / "decisions.jsonl"))
    [d] = tick(ctl)
    assert d.outcome == "applied" and list(ctl.decisions) == [d]


# -- hysteresis, deadlines, validation (issue 12, issue 20 item 3) ------------------------------------

def test_hysteresis_lets_an_action_through_only_after_its_rounds_and_seconds_in_a_row():
    h = Hysteresis()
    down = Proposal("rate", 0, 0, Release("op2", 1, hold=Hold(rounds=2)))
    calm = Proposal("copy", 1, 0, Release("op3", 1, hold=Hold(seconds=10)))
    now = Proposal("copy", 1, 1, Replicate("op1"))
    assert h.admit([down, calm, now], 100.0) == [now]              # no hold: at once
    assert h.admit([down, calm], 105.0) == [down]                 # 2nd round in a row; 5 s < 10 s
    assert h.admit([calm], 108.0) == []                           # down starts over (it was let through)
    assert h.admit([down], 109.0) == []                           # calm not asked: its clock restarts
    assert h.admit([calm], 110.0) == [] and h.admit([calm], 119.0) == []
    assert h.admit([calm], 120.0) == [calm]


def test_an_invalid_action_is_refused_with_its_reason_and_the_policys_others_still_apply():
    junk = Move(["op1"], PL.workers[0])                           # a list as a PE id
    runtime = FakeRuntime()
    ctl = Controller({"p": says(junk, Replicate("nope"), Release("op2", 0), Fuse("op3", "op4"))}, runtime.apply)
    for t in (1.0, 20.0):                                         # every round, not only the first
        made = tick(ctl, t)
        assert [(d.outcome, d.detail.split(":")[0]) for d in made] == [
            ("refused", "invalid"), ("refused", "invalid"), ("refused", "invalid"), ("applied", "")]
    assert "pe is list ['op1']" in made[0].detail and "operator 'nope' does not exist" in made[1].detail
    assert "copies must be a whole number >= 1" in made[2].detail
    assert [repr(a) for a in runtime.asked] == ["Fuse('op3', 'op4')"] * 2 and ctl.quarantined == {}
    assert invalid(Split("op1", ("op2",)), PL) == "operator 'op2' does not exist"
    assert invalid(Move("op1", PL.workers[1]), PL) == "" and invalid(BorrowHosts(True), PL)


def test_a_policy_over_its_deadline_is_skipped_then_quarantined_and_the_round_goes_on():
    import threading
    import time

    release = threading.Event()

    def slow(snapshot, placement, resources, config):
        release.wait(20)                                          # a policy sleeping 20 s
        return [Replicate("op2")]
    runtime = FakeRuntime()
    ctl = Controller({"slow": slow, "good": says(Fuse("op3", "op4"))}, runtime.apply, cooldown_s=0,
                     deadline_s=0.2, strikes=3)

    async def rounds():
        made = []
        for t in (1.0, 2.0, 3.0, 4.0):
            t0 = time.monotonic()
            made.append(await ctl.tick(snap(t), PL))
            assert time.monotonic() - t0 < 5                      # never the 20 s
        return made
    try:
        made = asyncio.run(rounds())
    finally:
        release.set()
    assert [(d.policy, d.outcome) for d in made[0]] == [("slow", "skipped"), ("good", "applied")]
    assert "longer than its deadline of 0.2 s" in made[0][0].detail
    assert "still deciding" in made[1][0].detail and made[1][0].outcome == "skipped"
    assert made[2][0].outcome == "quarantined" and "3 rounds in a row" in made[2][0].detail
    assert [d.policy for d in made[3]] == ["good"] and "slow" in ctl.quarantined
    assert len(runtime.asked) == 4                                # good's action every round
