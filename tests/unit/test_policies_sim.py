"""The built-in policies driven by the controller on the simulator: convergence, stability, load steps."""

from __future__ import annotations

import pytest

from pescheduler.control.controller import Controller, policy_configs, select_policies
from pescheduler.plugins import load_plugins
from pescheduler.sim import SimOperator, Simulation

COST = 1e-4


def controller(sim: Simulation, *names: str, cooldown_s: float = 5.0) -> Controller:
    chosen = select_policies(load_plugins(), names)
    return Controller(chosen, sim.apply_record, configs=policy_configs(chosen), cooldown_s=cooldown_s,
                      resources=sim.resources)


def bottleneck(rate: float = 4000.0) -> Simulation:
    """5 operators, op2 four times as costly: at 4,000 t/s it needs 1.6 cores."""
    return Simulation.chain(5, cost_s=COST, costs={2: 4 * COST}, source_rate=rate)


def backpressure(snap) -> float:
    return max(p.backpressure for p in snap.pes.values())


def acted(ctl: Controller) -> list:
    return [d for d in ctl.decisions if d.outcome in ("applied", "refused")]


def test_rate_reaches_the_backpressure_free_size_in_one_step():
    sim = bottleneck()
    ctl = controller(sim, "rate")
    snaps = sim.control(ctl, 3)
    assert backpressure(snaps[0]) > 0.3                       # the bottleneck holds the source back
    [decision] = acted(ctl)                                   # one decision, after the first window
    assert decision.outcome == "applied" and repr(decision.action) == "Replicate('op2', 2)"
    assert backpressure(snaps[1]) == 0.0 and snaps[1].operators["op0"].tuples_out_per_s == pytest.approx(4000)
    assert max(snaps[1].operators[o].busy for o in ("op2", "op2#1", "op2#2")) <= 0.7


@pytest.mark.parametrize("names", [("rate",), ("copy",), ("threshold",), ("rate", "copy")])
def test_no_action_on_steady_load_for_600_intervals(names):
    sim = bottleneck()
    ctl = controller(sim, *names)
    sim.control(ctl, 20)                                       # settle whatever the policy does first
    settled = len(ctl.decisions)
    snaps = sim.control(ctl, 600)
    assert ctl.decisions and len(ctl.decisions) == settled     # it acted once, then never again
    assert backpressure(snaps[-1]) == 0.0


def test_a_load_step_up_then_down_is_followed_within_two_intervals_each_way():
    sim = bottleneck(rate=1000.0)
    ctl = controller(sim, "rate", "copy")                      # the defaults

    def load(s, i):
        s.set_source_rate(4000.0 if 20 <= i < 60 else 1000.0)

    snaps = sim.control(ctl, 100, before=load)
    copies = [sum(1 for o in s.operators if o.startswith("op2#")) for s in snaps]
    assert copies[:20] == [0] * 20 and backpressure(snaps[19]) == 0.0
    # step up at interval 20: relieved by interval 22 (the window that sees it, then the fix)
    assert backpressure(snaps[20]) > 0 and backpressure(snaps[21]) == 0.0 and copies[21] == 2
    # step down at 60: rate wants fewer in windows 60 and 61 (down-after 2), copies gone by 62
    assert copies[61] == 2 and copies[62] == 0 and backpressure(snaps[62]) == 0.0
    assert len(acted(ctl)) == 2 and all(c == 0 for c in copies[62:])


def test_a_moving_hot_spot_is_followed_by_copy_and_its_copies_go_after_the_calm():
    graph = {"src": SimOperator(1e-5), **{b: SimOperator(COST) for b in ("a", "b", "c")}}
    sim = Simulation(graph, [("src", "a"), ("src", "b"), ("src", "c")], source_rate=3000.0, hosts=2)
    ctl = controller(sim, "copy")
    hot = {range(0, 30): "a", range(30, 60): "b"}

    def shift(s, i):
        spot = next((op for r, op in hot.items() if i in r), None)
        s.set_cost({op: COST * (4 if op == spot else 1) for op in ("a", "b", "c")})

    snaps = sim.control(ctl, 120, before=shift)
    relieved = [i for i, s in enumerate(snaps) if backpressure(s) == 0.0]
    assert 1 in relieved and 31 in relieved                    # each shift relieved by the next window
    assert snaps[25].operators.get("a#1") and not snaps[25].operators.get("b#1")
    assert snaps[40].operators.get("b#1")
    released = [d for d in ctl.decisions if d.outcome == "applied" and type(d.action).__name__ == "Release"]
    assert [d.action.operator for d in released] == ["a", "b"]
    assert all(not any("#" in o for o in s.operators) for s in snaps[-30:])
