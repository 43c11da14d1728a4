"""Benchmarks stay runnable: each runs in its quick form, as a user types it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

BENCH = Path(__file__).parent.parent.parent / "bench"


def test_reconfig_benchmark_quick_runs_and_loses_nothing(tmp_path):
    result = subprocess.run([sys.executable, str(BENCH / "reconfig.py"), "--quick"],
                            cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-4000:]
    assert "0 lost, 0 duplicated" in result.stdout, result.stdout[-3000:]


def test_parallel_benchmark_quick_runs_and_loses_nothing(tmp_path):
    result = subprocess.run([sys.executable, str(BENCH / "parallel.py"), "--quick"],
                            cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-4000:]
    assert "0 lost, 0 duplicated" in result.stdout and "cold (new worker)" in result.stdout, result.stdout


def test_hosts_benchmark_quick_runs_and_loses_nothing(tmp_path):
    result = subprocess.run([sys.executable, str(BENCH / "hosts.py"), "--quick", "--rm", "local"],
                            cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-4000:]
    assert "0 lost, 0 duplicated" in result.stdout, result.stdout[-3000:]


def test_ep_benchmark_quick_runs_and_prints_every_kind_and_the_sharing_ratios(tmp_path):
    result = subprocess.run([sys.executable, str(BENCH / "ep.py"), "--quick"],
                            cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-4000:]
    for line in ("filter", "aggregation", "correlation", "pattern", "mixed", "goal: K = 100 shared"):
        assert line in result.stdout, result.stdout[-3000:]


def test_policies_benchmark_quick_times_every_policy_and_converges_on_the_bottleneck(tmp_path):
    result = subprocess.run([sys.executable, str(BENCH / "policies.py"), "--quick"],
                            cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-4000:]
    for line in ("rate", "copy", "threshold", "controller (rate+copy)", "(baseline pass)", "best ms"):
        assert line in result.stdout, result.stdout[-3000:]
    rate_row = next(r for r in result.stdout.splitlines() if r.startswith("5-op chain, 4x bottleneck    rate "))
    assert rate_row.split()[5:8] == ["1", "1", "2"], rate_row     # one action, at interval 1, bp-free from 2
