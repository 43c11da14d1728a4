"""SQL benchmark: the connected-car query written in SQL against the same app written with ``col``
expressions, per tuple and columnar (Arrow batches), in one run.

    python bench/sql.py [--events 2000000] [--repeat 3] [--quick]

Both read the same pre-made events (bench/cars.py) and their outputs are checked against the hand
loop's. The SQL query is compiled to the app's own operators (pescheduler.sql), so the ratio shows
what the compilation costs: a map computing ``speed / 3.6`` under a hidden name where the hand-written
app overwrites ``speed``, and a projection of each window row (SELECT's field order).
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import cars  # noqa: E402

QUERY = """SELECT car, AVG(speed / 3.6) AS avg_speed, window_start, window_end
FROM TUMBLE(cars, ts, INTERVAL '60' SECOND)
WHERE speed / 3.6 > 5
GROUP BY car, window_start, window_end"""


def main() -> None:
    args = cars.arguments(__doc__)
    n = args.events
    variants = {
        **cars.baselines(n),
        "in-process, col expressions": lambda: cars.in_process(n),
        "in-process, SQL": lambda: cars.in_process(n, query=QUERY),
        "columnar in-process, col expressions": lambda: cars.in_process(n, columnar=True),
        "columnar in-process, SQL": lambda: cars.in_process(n, columnar=True, query=QUERY),
        "on 1 worker (deploy), col expressions": lambda: cars.deployed(n),
        "on 1 worker (deploy), SQL": lambda: cars.deployed(n, query=QUERY),
    }
    best = cars.measure(variants, args.repeat)
    cars.report(best, n, "hand loop, dicts", "numpy over columns")
    for where in ("in-process", "columnar in-process", "on 1 worker (deploy)"):
        ratio = best[f"{where}, SQL"] / best[f"{where}, col expressions"]
        print(f"  {where}: SQL takes {ratio:.3f}x the time of the col-expression app")


if __name__ == "__main__":
    main()
