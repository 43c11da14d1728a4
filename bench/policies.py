"""Policy benchmark: decision time at scale, and steps to converge, on the simulator.

    python bench/policies.py [--quick] [--repeat N]

1. Decision time. Seeded random graphs (``Simulation.random``: trees of short
   chains, a few joins, every parallelism, KEYED skew) of 100, 1,000 and
   10,000 operators over 10, 100 and 1,000 hosts (4 workers each, 1 standard
   slot per host), each source offering 40,000 tuples/s so that some
   operators are hot. Each built-in
   policy decides on the same snapshot ``--repeat`` times (best and median
   printed), and so does the controller's round for the default policies
   (both policies + merge, applying nothing). The baseline,
   measured in the same run on the same snapshot, is one pass that reads every
   operator's metrics: the floor any policy pays. Goal: <= 100 ms at 10,000
   operators / 1,000 hosts (DESIGN section 8).
2. Steps to converge. Each policy (and the default pair) runs in the real
   controller (5 s cooldown) on scenarios: a 5-operator chain with a 4x
   bottleneck (DS2 needed up to 3 steps on Flink, Dhalion 6), the same chain
   after a load step 1,000 -> 4,000 -> 1,000 tuples/s, and random graphs of
   100 (and, without ``--quick``, 1,000) operators. Printed: actions applied, the interval of the last one,
   the first interval free of backpressure, and whether anything was decided
   in the last 100 intervals (oscillation).

``--quick`` (the smoke test) stops at 1,000 operators and repeats less.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from pescheduler.control.controller import Controller, merge, policy_configs, run_policies, select_policies  # noqa: E402
from pescheduler.plugins import load_plugins  # noqa: E402
from pescheduler.policies._common import View  # noqa: E402
from pescheduler.sim import Simulation  # noqa: E402

SIZES = [(100, 10), (1_000, 100), (10_000, 1_000)]
POLICIES = ("rate", "copy", "threshold")
DEFAULT = ("rate", "copy")
GOAL_MS = 100.0
QUIET = 100                 # intervals at the end of a convergence run that must be action-free


def timed(fn, repeat: int) -> tuple[float, float, object]:
    """Best and median wall time of ``fn()`` in ms over ``repeat`` runs, and its last result.

    Every run starts cold: the policies' per-snapshot index (``View.of``) is dropped first, as a
    new snapshot would. The best run is the cost without interference (this machine's cores are
    shared); the median says what interference and garbage collection add.
    """
    times, result = [], None
    for _ in range(repeat):
        View._last = None
        t = time.perf_counter()
        result = fn()
        times.append((time.perf_counter() - t) * 1000)
    return min(times), statistics.median(times), result


def read_every_operator(snapshot) -> float:
    """The baseline: touch every operator's figures once (what any policy must at least do)."""
    total = 0.0
    for m in snapshot.operators.values():
        total += m.tuples_in_per_s + m.busy
    return total


def decision_times(sizes, repeat: int) -> None:
    chosen = select_policies(load_plugins(), POLICIES)
    print(f"1. Decision time (best and median of {repeat}) on one snapshot; baseline = one pass over every "
          f"operator's metrics; goal {GOAL_MS:.0f} ms at 10,000 operators")
    print(f"{'operators':>9} {'hosts':>5} {'who':<22} {'actions':>7} {'best ms':>8} {'median ms':>9} "
          f"{'x baseline':>10} {'best/goal':>9}")
    for n_ops, n_hosts in sizes:
        sim = Simulation.random(n_ops, n_hosts, seed=1, source_rate=40_000.0)
        t = time.perf_counter()
        snap = sim.step()
        step_ms = (time.perf_counter() - t) * 1000
        base, _, _ = timed(lambda: read_every_operator(snap), repeat)
        rows = []
        for name, decide in chosen.items():
            cfg = policy_configs([name])[name]
            best, med, actions = timed(lambda: decide(snap, sim.placement, sim.resources(), cfg), repeat)
            rows.append((name, len(actions), best, med))
        configs = policy_configs(DEFAULT)

        def round_():
            proposals, _ = run_policies({n: chosen[n] for n in DEFAULT}, snap, sim.placement, sim.resources(),
                                        configs)
            return merge(proposals, sim.placement)[0]
        best, med, kept = timed(round_, repeat)
        rows.append(("controller (rate+copy)", len(kept), best, med))
        for who, n_actions, best, med in rows:
            goal = f"{best / GOAL_MS:.2f}" if n_ops == 10_000 else ""
            print(f"{n_ops:>9,} {n_hosts:>5,} {who:<22} {n_actions:>7} {best:>8.2f} {med:>9.2f} "
                  f"{best / max(base, 1e-6):>10.1f} {goal:>9}")
        print(f"{'':>9} {'':>5} {'(baseline pass)':<22} {'':>7} {base:>8.3f}   (simulator step: {step_ms:.0f} ms)")


def controller_for(sim: Simulation, names) -> Controller:
    chosen = select_policies(load_plugins(), names)
    return Controller(chosen, sim.apply_record, configs=policy_configs(chosen), cooldown_s=5.0,
                      resources=sim.resources)


def bottleneck(rate: float = 4000.0) -> Simulation:
    return Simulation.chain(5, cost_s=1e-4, costs={2: 4e-4}, source_rate=rate)


def load_step(sim: Simulation, i: int) -> None:
    sim.set_source_rate(4000.0 if 20 <= i < 120 else 1000.0)


SCENARIOS = {
    "5-op chain, 4x bottleneck": (lambda: bottleneck(), None, 300),
    "5-op chain, 1k->4k->1k t/s": (lambda: bottleneck(1000.0), load_step, 300),
    "random 100 ops / 10 hosts": (lambda: Simulation.random(100, 10, seed=3, source_rate=40_000.0), None, 300),
}
LARGE = {"random 1,000 ops / 100 hosts": (lambda: Simulation.random(1_000, 100, seed=3, source_rate=40_000.0),
                                          None, 300)}


def convergence(scenarios: dict) -> None:
    print()
    print("2. Steps to converge (controller, 5 s cooldown, 1 s intervals); DS2 on Flink: up to 3 steps, Dhalion: 6")
    print(f"{'scenario':<28} {'policies':<12} {'applied':>7} {'last action at':>14} {'bp-free from':>12} "
          f"{'final max bp':>12} {'quiet last ' + str(QUIET):>14}  what still limits")
    for scenario, (make, before, intervals) in scenarios.items():
        for names in [(p,) for p in POLICIES] + [DEFAULT]:
            sim = make()
            ctl = controller_for(sim, names)
            snaps = sim.control(ctl, intervals, before=before)
            done = [d for d in ctl.decisions if d.outcome == "applied"]
            last = max((int(d.t) for d in done), default=0)
            bp = [max((p.backpressure for p in s.pes.values()), default=0.0) for s in snaps]
            free = next((i + 1 for i in range(len(bp)) if all(b < 0.01 for b in bp[i:])), None)
            quiet = all(d.t <= intervals - QUIET for d in ctl.decisions if d.outcome != "overruled")
            print(f"{scenario:<28} {'+'.join(names):<12} {len(done):>7} {last:>14} "
                  f"{free if free is not None else 'never':>12} {bp[-1]:>12.2f} {'yes' if quiet else 'NO':>14}  "
                  f"{limits(sim, snaps[-1])}")


def limits(sim: Simulation, snap) -> str:
    """Why backpressure is left: saturated workers, split by how many PEs share each."""
    full = [w for w, m in snap.workers.items() if m.cpu >= 0.99]
    if not full:
        return "-"
    pes = {w: sum(1 for p in sim.placement.pes.values() if p.worker == w) for w in full}
    shared = sum(1 for n in pes.values() if n > 1)
    return (f"{len(full)} saturated worker(s), {shared} shared by 2+ PEs (only threshold moves PEs), "
            f"{sum(1 for s in sim.placement.slots.values() if not s.copies)} free slots")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="up to 1,000 operators, fewer repetitions (< 1 min)")
    parser.add_argument("--repeat", type=int, help="decisions timed per size and policy (default 7; --quick 3)")
    args = parser.parse_args()
    repeat = args.repeat or (3 if args.quick else 7)
    sizes = SIZES[:2] if args.quick else SIZES
    t0 = time.perf_counter()
    decision_times(sizes, repeat)
    convergence(SCENARIOS if args.quick else {**SCENARIOS, **LARGE})
    print(f"\n(total {time.perf_counter() - t0:.0f} s)")


if __name__ == "__main__":
    main()
