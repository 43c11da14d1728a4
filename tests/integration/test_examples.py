"""Examples run as written, through the command line a user types."""

from __future__ import annotations

import functools
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from waiting import deploy_cli

pytestmark = pytest.mark.integration

EXAMPLES = Path(__file__).parent.parent.parent / "examples"


@functools.cache
def cars_reference() -> list:
    """connected_cars' plain-Python reference over its 2 M events (about 8 s of CPU): computed once
    for the two examples that share it."""
    import connected_cars

    return sorted(connected_cars.reference(), key=lambda r: (r["window_start"], r["car"]))


def deploy_example(tmp_path, module) -> tuple[list, list]:
    """``python -m pescheduler deploy examples/<module>.py`` as a user types it: the rows it wrote,
    and the reference, computed here while the deployment runs (this process only waits for it)."""
    stdout, reference = deploy_cli(EXAMPLES / f"{module.__name__}.py", tmp_path, meanwhile=cars_reference)
    assert "finished" in stdout
    rows = [json.loads(line) for line in (tmp_path / module.OUTPUT).read_text().splitlines()]
    return sorted(rows, key=lambda r: (r["window_start"], r["car"])), reference


def assert_same_averages(rows: list, reference: list) -> None:
    """The same rows (cars, windows) as the reference, each average equal to the last bits that the
    order of its additions allows: the default policies may copy an upstream operator, and a car's
    events then reach the window in another interleaving (a float sum depends on its order)."""
    assert [{**r, "avg_speed": None} for r in rows] == [{**r, "avg_speed": None} for r in reference]
    off = [(r, w) for r, w in zip(rows, reference) if not math.isclose(r["avg_speed"], w["avg_speed"], rel_tol=1e-12)]
    assert off == [], off[:3]


def test_connected_cars_example_as_written_equals_reference(tmp_path):
    import connected_cars

    rows, reference = deploy_example(tmp_path, connected_cars)
    assert_same_averages(rows, reference)


def test_live_reconfiguration_example_as_written():
    result = subprocess.run([sys.executable, str(EXAMPLES / "live_reconfiguration.py")],
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "equal to the plain-Python reference: True" in result.stdout
    assert result.stdout.count("applied=True") == 3


def test_hotspot_example_copies_follow_the_heat_and_results_are_exact():
    result = subprocess.run([sys.executable, str(EXAMPLES / "hotspot_cars.py")],
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    out = result.stdout
    assert "equal to the plain-Python reference: True" in out
    steps = [line.split(":")[0] for line in out.splitlines() if "applied=True" in line]
    assert steps[:3] == ["Replicate('timeframe-1', 1)", "Release('timeframe-1', 1)",
                         "Replicate('timeframe-2', 1)"], out[-3000:]


def test_columnar_example_as_written_writes_exactly_the_per_tuple_results(tmp_path):
    import connected_cars_columnar

    rows, reference = deploy_example(tmp_path, connected_cars_columnar)
    assert_same_averages(rows, reference)


def test_trades_asof_example_as_written_equals_reference(tmp_path):
    import trades_asof

    deploy_cli(EXAMPLES / "trades_asof.py", tmp_path)
    rows = [json.loads(line) for line in (tmp_path / trades_asof.OUTPUT).read_text().splitlines()]
    reference = trades_asof.reference()
    assert 0 < sum(line["bid"] is None for line in reference) < len(reference) // 10   # some quotes too old
    assert sorted(rows, key=lambda line: (line["symbol"], line["ts"])) == reference


def test_heartbeat_alerts_example_as_written_equals_reference(tmp_path):
    import heartbeat_alerts

    deploy_cli(EXAMPLES / "heartbeat_alerts.py", tmp_path)
    rows = [json.loads(line) for line in (tmp_path / heartbeat_alerts.OUTPUT).read_text().splitlines()]
    reference = heartbeat_alerts.reference()
    assert len(reference) > heartbeat_alerts.DEVICES          # silences besides the end of the stream
    assert sorted(rows, key=lambda a: (a["device"], a["alert_at"])) == reference
