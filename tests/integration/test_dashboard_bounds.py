"""The /pescheduler page stays bounded on a real Dask scheduler that many deployments published to:
live ones drawn, the newest ended ones a line each, older ones only counted, ended ones not sampled."""

from __future__ import annotations

import urllib.request

import dask
import pytest
from distributed import Client, LocalCluster

from pescheduler import config, dashboard
from waiting import until

pytestmark = pytest.mark.integration


def status(app: str, state: str) -> dict:
    return {"app": app, "state": state, "elapsed_s": 1.0, "dead_letters": 0, "pes": [], "operators": [],
            "channels": [], "events": [], "error": "redis://:hunter2@h:1/0 unreachable" if state == "failed" else None}


@pytest.fixture(scope="module")
def scheduler():
    routes = [*dask.config.get("distributed.scheduler.http.routes"), "pescheduler.dashboard"]
    with dask.config.set({"distributed.scheduler.http.routes": routes}):
        with LocalCluster(n_workers=0, protocol="tcp", host="127.0.0.1", dashboard_address="127.0.0.1:0") \
                as cluster, Client(cluster) as client:
            yield client, f"http://127.0.0.1:{cluster.scheduler.http_server.port}", cluster.scheduler


def test_many_published_deployments_draw_only_the_live_and_list_a_bounded_few_ended(scheduler):
    client, base, _scheduler = scheduler
    listed = int(config.get("dashboard.ended-listed"))
    for i in range(60):
        client.set_metadata(["pescheduler", "deployments", f"old-{i:02d}"],
                            status(f"app-old-{i:02d}", "failed" if i % 2 else "finished"))
    for i in range(3):
        client.set_metadata(["pescheduler", "deployments", f"live-{i}"], status(f"app-live-{i}", "running"))
    with urllib.request.urlopen(base + "/pescheduler", timeout=120) as answer:
        page = answer.read().decode()
    assert all(f"app-live-{i}" in page for i in range(3))
    shown = [i for i in range(60) if f"app-old-{i:02d}" in page]
    assert shown == list(range(60 - listed, 60)), shown
    assert f"{60 - listed} older ended deployments not shown" in page
    assert "hunter2" not in page


def test_only_live_deployments_are_sampled_into_the_history(scheduler):
    """The page's history (one sample a second, five minutes) holds live deployments only, so its
    memory does not grow with every deployment ever published."""
    client, base, this = scheduler
    urllib.request.urlopen(base + "/pescheduler", timeout=120).close()      # installs the sampler
    client.set_metadata(["pescheduler", "deployments", "old-x"], status("x", "stopped"))
    client.set_metadata(["pescheduler", "deployments", "live-x"], status("x", "running"))
    samples = dashboard._history[id(this)]         # this process may serve other schedulers too
    until(lambda: samples and "live-x" in samples[-1][1], 60, "a sample with the live deployment")
    assert not any(s["state"] in ("stopped", "finished", "failed") for s in samples[-1][1].values())
