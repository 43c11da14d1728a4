"""The /pescheduler page and the pescheduler_* metrics, on the embedded cluster's Dask dashboard."""

from __future__ import annotations

import html
import re
import urllib.request

import pytest

import pescheduler
from pescheduler import Application
from waiting import until

pytestmark = pytest.mark.integration


def get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=30) as r:
        assert r.status == 200
        return r.read().decode()


@pytest.fixture(scope="module")
def running():
    app = Application("dash")
    (app.source("generator", events=None, keys=20, rate=5_000)
        .map(lambda e: {**e, "kmh": e["speed"]})
        .sink("discard"))
    with pescheduler.deploy(app, workers=2, policies=[]) as dep:
        until(lambda: dep.status()["state"] == "running", 120, "the deployment to run")
        base = dep.cluster.dashboard_link.rsplit("/status", 1)[0]
        yield dep, base


def test_the_dashboard_listens_on_the_loopback_only(running):
    _dep, base = running
    assert base.startswith("http://127.0.0.1:")


def test_the_pescheduler_page_draws_every_pe_with_bokeh(running):
    dep, base = running
    pes = [html.escape(pe) for pe in dep.placement().pes]      # the document JSON sits in HTML: "->" is "-&gt;"
    until(lambda: all(pe in get(base + "/pescheduler") for pe in pes), 60, "the page to list every PE")
    page = get(base + "/pescheduler")
    assert "Bokeh" in page and "placement" in page and "pe-labels" in page and "timeline" in page
    assert "series-busy" in page and "series-backpressure" in page


def test_metrics_with_the_pescheduler_prefix_are_on_the_dashboards_metrics(running):
    dep, base = running
    pe = next(iter(dep.placement().pes))

    def busy_line():
        text = get(base + "/metrics")
        return re.search(r'^pescheduler_pe_busy\{[^}]*pe="%s"[^}]*\} [0-9.e+-]+$' % re.escape(pe), text, re.M)
    until(busy_line, 60, "pescheduler_pe_busy for the first PE on /metrics")
    text = get(base + "/metrics")
    assert re.search(r'^pescheduler_deployment_running\{.*app="dash".*\} 1\.0$', text, re.M)
    assert "pescheduler_pe_tuples_in_per_second" in text and "dask_scheduler_workers" in text
