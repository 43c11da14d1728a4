"""The hosts benchmark against Spark, quick form: the RM starts its own standalone cluster and stops it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.spark

BENCH = Path(__file__).parent.parent.parent / "bench"


def test_hosts_benchmark_on_spark_quick_loses_nothing_and_leaves_no_process(tmp_path):
    result = subprocess.run([sys.executable, str(BENCH / "hosts.py"), "--quick", "--rm", "spark"],
                            cwd=tmp_path, capture_output=True, text=True, timeout=400)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-4000:]
    assert "0 lost, 0 duplicated" in result.stdout, result.stdout[-3000:]
    assert "left after stop: 0" in result.stdout, result.stdout[-3000:]
