"""Columnar benchmark: the connected-car pipeline on Arrow batches with col expressions, in one run.

    python bench/columnar.py [--events 2000000] [--repeat 3] [--quick]

Every variant reads the same pre-made events (bench/cars.py; Arrow batches of
65,536 rows for the columnar ones) and its output is checked; figures are
ratios to the hand-written loop over dicts and to numpy over the same columns
(goals: >= 10 M events/s on one core, >= 0.3x numpy):

  hand loop over dicts / over tuples, numpy over columns   (baselines)
  columnar in-process / on one Dask worker (deploy)
  columnar in-process with a plain string key column (no shared dictionary:
    every batch's keys are mapped to the window's slots, operators/key_slots.py)
  columnar in-process with the README's lambdas (lifted to expressions: pescheduler/lift.py)
  fused per tuple in-process (expressions), for the gap columnar closes

Arrow batches between worker processes: bench/channel.py.
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import cars  # noqa: E402


def main() -> None:
    args = cars.arguments(__doc__)
    n = args.events
    variants = {
        **cars.baselines(n),
        "columnar in-process (Arrow + col)": lambda: cars.in_process(n, columnar=True),
        "columnar in-process, plain key column": lambda: cars.in_process(n, columnar=True, plain_keys=True),
        "columnar on 1 worker (deploy)": lambda: cars.deployed(n, columnar=True),
        "columnar in-process, lambdas (lifted)": lambda: cars.in_process(n, columnar=True, lambdas=True),
        "fused per tuple in-process, col expressions": lambda: cars.in_process(n),
    }
    best = cars.measure(variants, args.repeat)
    cars.report(best, n, "hand loop, dicts", "numpy over columns")
    print("(Arrow batches between two worker processes: bench/channel.py)")


if __name__ == "__main__":
    main()
