"""Streaming SQL on the real runtime (workers, channels, watermarks), against DuckDB over the same rows."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path

import pytest

import pescheduler
from pescheduler import Application
from sql_oracle import duckdb_rows, same_rows

pytestmark = pytest.mark.integration

QUERY = """SELECT car, COUNT(*) AS n, AVG(speed) AS mean, window_start, window_end
FROM TABLE(HOP(TABLE cars, DESCRIPTOR(ts), INTERVAL '1' SECOND, INTERVAL '2' SECOND))
WHERE speed > 3
GROUP BY car, window_start, window_end
UNION ALL
SELECT car, COUNT(*) AS n, MAX(speed) * 1.0 AS mean, window_start, window_end
FROM SESSION(trucks, ts, INTERVAL '800' MILLISECOND)
GROUP BY car, window_start, window_end HAVING COUNT(*) > 1"""


def rows(seed: int, prefix: str) -> list[dict]:
    rng = random.Random(seed)
    return [{"car": f"{prefix}{rng.randrange(5)}", "speed": rng.randrange(0, 30), "ts": i * 37 + rng.randrange(20)}
            for i in range(1500)]


def deployed_and_duckdb(cluster, tmp_path, query: str, cars: list, trucks: list) -> tuple[list, list]:
    """``query`` over sources ``cars`` and ``trucks`` deployed on ``cluster`` (no late event, no dead
    letter), and DuckDB's rows for it: ``(got, expected)``."""
    out = tmp_path / "sql.jsonl"
    app = Application("sql")
    sources = {"cars": app.source("iterable", items=cars, max_delay="100ms"),
               "trucks": app.source("iterable", items=trucks, max_delay="100ms")}
    pescheduler.sql(query, sources=sources).sink("jsonl", path=str(out))
    with pescheduler.deploy(app, cluster=cluster, policies=[]) as dep:
        status = dep.wait(timeout=120)
    assert status["late_events"] == 0 and status["dead_letters"] == 0
    got = [json.loads(line) for line in out.read_text().splitlines()]
    tables = {"cars": cars, "trucks": trucks}
    return got, duckdb_rows(query, tables, {"car": "VARCHAR", "speed": "BIGINT", "ts": "BIGINT"})


def test_union_of_windowed_queries_over_two_sources_equals_duckdb(cluster, tmp_path):
    got, expected = deployed_and_duckdb(cluster, tmp_path, QUERY, rows(1, "c"), rows(2, "t"))
    assert len(got) > 100
    assert same_rows(got, expected)


JOINS = """SELECT c.car, c.speed AS car_speed, t.speed AS truck_speed FROM cars c JOIN trucks t
  ON c.car = t.car AND c.ts BETWEEN t.ts - 200 AND t.ts + 100
UNION ALL
SELECT c.car, c.speed AS car_speed, t.speed AS truck_speed FROM cars c ASOF LEFT JOIN trucks t
  ON c.car = t.car AND c.ts >= t.ts
WHERE c.speed > 10"""


def test_interval_and_asof_joins_of_two_sources_equal_duckdb(cluster, tmp_path):
    got, expected = deployed_and_duckdb(cluster, tmp_path, JOINS, rows(3, "v"), rows(4, "v"))
    assert len(got) > 1000
    assert same_rows(got, expected)


def test_the_cars_sql_example_deploys_from_the_command_line_and_equals_the_python_reference(tmp_path):
    import connected_cars

    from waiting import deploy_cli

    deploy_cli(Path(__file__).parent.parent.parent / "examples" / "cars.sql", tmp_path, "--workers", "2", timeout=300)
    got = [json.loads(line) for line in (tmp_path / "cars_sql.jsonl").read_text().splitlines()]
    expected = connected_cars.reference(200_000)
    assert len(got) > 1000 and same_rows(got, expected)


def test_a_bad_query_in_a_sql_file_exits_2_naming_the_file_line_and_column(tmp_path):
    bad = tmp_path / "bad.sql"
    bad.write_text('-- source cars: generator {"events": 10}\n-- sink: print\n'
                   "SELECT car, speed % 7 AS m FROM cars\n")
    done = subprocess.run([sys.executable, "-m", "pescheduler", "deploy", str(bad)], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert f"{bad}:3:13: MOD is not supported" in done.stderr + done.stdout
    assert "Traceback" not in done.stderr
