"""Examples run as written, through the command line a user types."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

EXAMPLES = Path(__file__).parent.parent.parent / "examples"


def deploy_example(tmp_path, module) -> list:
    """``python -m pescheduler deploy examples/<module>.py`` as a user types it; the rows it wrote."""
    result = subprocess.run([sys.executable, "-m", "pescheduler", "deploy", str(EXAMPLES / f"{module.__name__}.py")],
                            cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-4000:]
    assert "finished" in result.stdout
    rows = [json.loads(line) for line in (tmp_path / module.OUTPUT).read_text().splitlines()]
    return sorted(rows, key=lambda r: (r["window_start"], r["car"]))


def test_connected_cars_example_as_written_equals_reference(tmp_path):
    import connected_cars

    reference = sorted(connected_cars.reference(), key=lambda r: (r["window_start"], r["car"]))
    assert deploy_example(tmp_path, connected_cars) == reference


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
    import connected_cars
    import connected_cars_columnar

    reference = sorted(connected_cars.reference(), key=lambda r: (r["window_start"], r["car"]))
    assert deploy_example(tmp_path, connected_cars_columnar) == reference
