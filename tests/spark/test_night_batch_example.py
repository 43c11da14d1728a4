"""examples/night_batch.py as a user runs it: stream on Spark hosts, one given to a batch job, taken back."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.spark

EXAMPLE = Path(__file__).parent.parent.parent / "examples" / "night_batch.py"


@pytest.mark.timeout(900)          # about 2 min on an idle machine, 5 at load 20 (JVM starts)
def test_night_batch_example_as_written():
    proc = subprocess.Popen([sys.executable, str(EXAMPLE)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    try:
        out, err = proc.communicate(timeout=780)
    except subprocess.TimeoutExpired:
        # Ctrl-C, as a user would: the example stops the Spark processes it started (a kill
        # would leave its JVMs running), then the test fails on the return code.
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=100)
    assert proc.returncode == 0, out[-3000:] + err[-3000:]
    assert "equal to the same aggregation of those files: True" in out
    assert "equal to the plain-Python reference: True" in out
    assert "spark wants spark-2 back" in out and "returned spark-2" in out and "before its deadline" in out
    assert "borrowed spark-3" in out
