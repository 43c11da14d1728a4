"""The embedded cluster's scheduler starts without bokeh (0.3 s of every deploy) and gains Dask's
pages once the run has lasted a monitor interval; a shorter run never imports bokeh."""

from __future__ import annotations

import os
import subprocess
import sys
import urllib.error
import urllib.request

import dask.config
import pytest

import pescheduler
from waiting import until

pytestmark = pytest.mark.integration


SHORT = """
import sys, pescheduler
app = pescheduler.Application("dash-never")
app.source("generator", events=100, keys=10).sink("jsonl", path={out!r})
with pescheduler.deploy(app, workers=1, rm="none", policies=[]) as dep:
    dep.wait(timeout=120)
print("distributed.dashboard.scheduler" in sys.modules)
"""


def _status_page(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=30) as r:
            return r.status
    except urllib.error.HTTPError as exc:
        return exc.code


def test_a_short_run_never_imports_bokeh_and_a_longer_one_gets_dask_pages_after_an_interval(tmp_path):
    # In a fresh interpreter: this one may hold bokeh already (another test's LocalCluster).
    short = SHORT.format(out=str(tmp_path / "short.jsonl"))
    result = subprocess.run([sys.executable, "-c", short], capture_output=True, text=True, timeout=120,
                            env={**os.environ, "PESCHEDULER__MONITOR__INTERVAL": "600s"})
    assert result.returncode == 0, result.stderr
    assert result.stdout.split()[-1] == "False", "bokeh was imported for a short run"

    longer = pescheduler.Application("dash-later")
    longer.source("generator", events=None, keys=10, rate=500).sink("jsonl", path=str(tmp_path / "long.jsonl"))
    with dask.config.set({"pescheduler.monitor.interval": "200ms"}):
        with pescheduler.deploy(longer, workers=1, rm="none", policies=[]) as dep:
            link = dep.cluster.dashboard_link
            assert _status_page(link.replace("/status", "/pescheduler")) == 200     # ours from the start
            until(lambda: _status_page(link) == 200, 120, "Dask's /status page")
