"""The policy on the simulator: no cluster, the real placement and snapshot types."""

from latency_guard import pescheduler_policy_defaults
from latency_guard import pescheduler_policy_decide as decide

from pescheduler.sim import Simulation


def test_copies_the_operator_behind_the_longest_queue_then_releases_it():
    sim = Simulation.chain(5, cost_s=1e-4, costs={2: 4e-4}, source_rate=4000.0)   # op2 is the bottleneck
    # what the controller passes: the declared section (as the hook gives it), changed, plus a history
    config = {**pescheduler_policy_defaults(), "history": {}, "calm-windows": 2}
    [up] = decide(sim.step(), sim.placement, sim.resources(), config)
    assert repr(up) == "Replicate('op2', 1)" and "longest input queue" in up.reason
    assert sim.apply(up)
    sim.set_source_rate(500.0)                          # the queue drains
    assert decide(sim.step(), sim.placement, sim.resources(), config) == []
    [down] = decide(sim.step(), sim.placement, sim.resources(), config)
    assert repr(down) == "Release('op2', 1)"
