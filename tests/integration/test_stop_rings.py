"""``stop NAME`` rings the deployment's command topic: the deployment drains at once, not at its
next command poll or monitor interval (issue 34: stop within 0.3 s needs no poll on the way)."""

from __future__ import annotations

import os
import subprocess
import sys

import dask.config
import pytest

import pescheduler
from pescheduler.control import control_loop

pytestmark = pytest.mark.integration


def test_stop_is_taken_at_once_with_polls_and_intervals_of_two_minutes(tmp_path, monkeypatch):
    monkeypatch.setattr(control_loop, "COMMAND_POLL_S", 120.0)
    state_dir = str(tmp_path / "state")
    app = pescheduler.Application("rung")
    app.source("generator", events=None, keys=10, rate=1000).sink("jsonl", path=str(tmp_path / "out.jsonl"))
    with dask.config.set({"pescheduler.monitor.interval": "120s", "pescheduler.state-dir": state_dir}):
        with pescheduler.deploy(app, workers=1, rm="none", policies=[], name="rung") as dep:
            stop = subprocess.Popen([sys.executable, "-m", "pescheduler", "stop", "rung", "--timeout", "90"],
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                    env={**os.environ, "PESCHEDULER__STATE_DIR": state_dir})
            try:
                final = dep.wait(timeout=60)          # half the poll: only the topic can have woken it
                assert final["state"] == "stopped"
                assert any("stop requested from the command line" in e["text"] for e in final["events"])
            finally:
                dep.stop()
                out, err = stop.communicate(timeout=90)
    assert stop.returncode == 0, out + err
    assert "stopped" in out
