"""Fusion benchmark: the connected-car pipeline per tuple, against the hand loop, in one run.

    python bench/fusion.py [--events 2000000] [--repeat 3] [--quick]

Every variant reads the same pre-made events (bench/cars.py) and its output
is checked; figures are ratios to the hand-written loop over dicts (the same
dict work as the lambda app) and to numpy over the same columns:

  hand loop over dicts / over tuples, numpy over columns   (baselines)
  fused in-process, expressions / lambdas                  (pescheduler.testing: the runtime's chain)
  fused on one Dask worker, expressions / lambdas          (deploy, workers=1)
  unfused: every operator its own PE on its own worker process

The channel between worker processes has its own benchmark, bench/channel.py.
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
        "fused in-process, col expressions": lambda: cars.in_process(n),
        "fused in-process, lambdas over dicts": lambda: cars.in_process(n, lambdas=True),
        "fused on 1 worker (deploy), col expressions": lambda: cars.deployed(n),
        "fused on 1 worker (deploy), lambdas over dicts": lambda: cars.deployed(n, lambdas=True),
        "unfused, one PE per operator on 6 workers": lambda: cars.deployed(n, workers=6),
    }
    best = cars.measure(variants, args.repeat)
    cars.report(best, n, "hand loop, dicts", "numpy over columns")
    t_hand_tuples = best["hand loop, tuples"]
    print(f"  deployed (expressions) vs hand loop over tuples: {t_hand_tuples / best['fused on 1 worker (deploy), col expressions']:.2f}x; "
          f"fused on a worker vs unfused: {best['unfused, one PE per operator on 6 workers'] / best['fused on 1 worker (deploy), col expressions']:.2f}x")
    print("(the channel between two worker processes: bench/channel.py)")


if __name__ == "__main__":
    main()
