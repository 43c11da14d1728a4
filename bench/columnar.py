"""Columnar benchmark: the connected-car pipeline on Arrow batches with col expressions, in one run.

    python bench/columnar.py [--events 2000000] [--repeat 3] [--quick] [--cpu]

Every variant reads the same pre-made events (bench/cars.py; Arrow batches of
65,536 rows for the columnar ones unless said) and its output is checked; figures are
ratios to the hand-written loop over dicts and to numpy over the same columns
(goals: >= 10 M events/s on one core, >= 0.3x numpy; issue 34: deployed on one worker
with 10 k-row source batches >= 1x DuckDB and Polars on one thread, >= 0.3x numpy:
:func:`goals`, also printed at the end):

  hand loop over dicts / over tuples, numpy over columns   (baselines)
  DuckDB on one thread (SQL over the columns as one Arrow table), Polars on one
    thread (a lazy group_by over the same table)           (baselines)
  columnar in-process / on one Dask worker (deploy), with 65,536-row and with
    10,000-row source batches (as a real source delivers: the framework sizes
    what its operators see)
  columnar in-process with a plain string key column (no shared dictionary:
    every batch's keys are mapped to the window's slots, operators/key_slots.py)
  columnar in-process with the README's lambdas (lifted to expressions: pescheduler/lift.py)
  fused per tuple in-process (expressions), for the gap columnar closes

What each timing holds (data already in memory for all; no conversion in one
that another skips): the baselines, the computation over the pre-made columns to
its result (numpy: per-pane arrays; DuckDB and Polars: an Arrow table / a
DataFrame, as the sink keeps Arrow batches); pescheduler, source start -> sink
end (deployed: across processes, by wall clock). Not timed: making the events,
the table or DataFrame over them, and the rows made for the output check.

``--cpu``: CPU time instead of the time passed (bench/cars.py: the deployed run's is its
worker process's), for a loaded machine, where the time passed swings 2-4x between rounds.

Arrow batches between worker processes: bench/channel.py.
"""

from __future__ import annotations

import os
import sys

os.environ["POLARS_MAX_THREADS"] = "1"      # read once, when polars is first imported: before anything
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import cars  # noqa: E402

SMALL = 10_000                              # issue 34: the rows of each batch a source delivers
DEPLOYED_SMALL = f"columnar on 1 worker (deploy), {SMALL:,}-row source batches"
DUCKDB, POLARS, NUMPY = "DuckDB, 1 thread", "Polars, 1 thread", "numpy over columns"


def _baselines(n: int) -> dict:
    return {**cars.baselines(n), DUCKDB: lambda: cars.duckdb_columns(n),
            POLARS: lambda: cars.polars_columns(n)}


def _goals(best: dict) -> list[dict]:
    """Issue 34's columnar goals from one run's best times (each ratio: baseline time / deployed)."""
    deployed = best[DEPLOYED_SMALL]
    return [{"goal": f"columnar deployed on 1 worker, {SMALL:,}-row batches / {label}",
             "figure": round(best[label] / deployed, 2), "target": target, "met": best[label] / deployed >= target}
            for label, target in ((DUCKDB, 1.0), (POLARS, 1.0), (NUMPY, 0.3))]


def goals(quick: bool, cpu: bool = False) -> list[dict]:
    """Issue 34's columnar goals (bench/goals34.py): deployed on one worker with 10 k-row source
    batches against DuckDB and Polars on one thread and numpy, over the same columns, interleaved;
    ``cpu``: by CPU time (the worker process's for the deployment), not the time passed."""
    cars.use_cpu(cpu)
    n, repeat = (200_000, 1) if quick else (2_000_000, 3)
    variants = {**{k: v for k, v in _baselines(n).items() if k in (DUCKDB, POLARS, NUMPY)},
                DEPLOYED_SMALL: lambda: cars.deployed(n, columnar=True, batch_rows=SMALL)}
    return _goals(cars.measure(variants, repeat, reference=cars.hand_tuples(n)[1]))


def main() -> None:
    args = cars.arguments(__doc__)
    n = args.events
    variants = {
        **_baselines(n),
        "columnar in-process (Arrow + col)": lambda: cars.in_process(n, columnar=True),
        f"columnar in-process, {SMALL:,}-row source batches":
            lambda: cars.in_process(n, columnar=True, batch_rows=SMALL),
        "columnar in-process, plain key column": lambda: cars.in_process(n, columnar=True, plain_keys=True),
        "columnar on 1 worker (deploy)": lambda: cars.deployed(n, columnar=True),
        DEPLOYED_SMALL: lambda: cars.deployed(n, columnar=True, batch_rows=SMALL),
        "columnar in-process, lambdas (lifted)": lambda: cars.in_process(n, columnar=True, lambdas=True),
        "fused per tuple in-process, col expressions": lambda: cars.in_process(n),
    }
    best = cars.measure(variants, args.repeat)
    cars.report(best, n, "hand loop, dicts", NUMPY)
    print("(Arrow batches between two worker processes: bench/channel.py)")
    print(f"issue 34 goals (same run, {'CPU time' if cars.cpu() else 'time passed'}):")
    for g in _goals(best):
        print(f"  {g['goal']:<72s} {g['figure']:6.2f}x  target >= {g['target']}x  {'met' if g['met'] else 'NOT met'}")


if __name__ == "__main__":
    main()
