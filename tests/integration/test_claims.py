"""One writer per local table (issue 36): two deployments appending to one Iceberg or Delta table
commit over each other; the second is refused at deploy, naming both."""

from __future__ import annotations

import dask
import pytest

import pescheduler
from pescheduler import Application
from pescheduler.errors import DeploymentClash
from pescheduler.plan.outputs import written_paths
from pescheduler.plugins import load_plugins

pytestmark = pytest.mark.integration


def lake_app(name: str, sink: str, **where) -> Application:
    app = Application(name)
    app.source("generator", events=None, keys=10, rate=2_000).sink(sink, rows=100, **where)
    return app


def test_a_local_iceberg_or_delta_table_is_what_its_sink_writes(tmp_path):
    found = load_plugins()
    catalog = {"type": "sql", "uri": f"sqlite:///{tmp_path}/catalog.db", "warehouse": f"file://{tmp_path}/wh"}
    assert written_paths(lake_app("a", "iceberg", catalog=catalog, table="lake.cars"), found) == \
        [f"{tmp_path}/catalog.db/lake.cars"]
    assert written_paths(lake_app("b", "delta", path=str(tmp_path / "delta")), found) == [f"{tmp_path}/delta"]
    remote = {"type": "rest", "uri": "http://127.0.0.1:1/catalog"}
    assert written_paths(lake_app("c", "iceberg", catalog=remote, table="lake.cars"), found) == []


def test_a_second_deployment_appending_to_a_running_ones_iceberg_table_is_refused_naming_both(tmp_path):
    catalog = {"type": "sql", "uri": f"sqlite:///{tmp_path}/catalog.db", "warehouse": f"file://{tmp_path}/wh"}
    with dask.config.set({"pescheduler.state-dir": str(tmp_path / "state")}), \
            pescheduler.deploy(lake_app("ingest", "iceberg", catalog=catalog, table="lake.cars"), workers=2,
                               policies=[]) as running:
        try:
            second = pescheduler.deploy(lake_app("backfill", "iceberg", catalog=catalog, table="lake.cars"),
                                        workers=2, policies=[])
        except DeploymentClash as clash:
            refused = str(clash)
        else:
            second.stop()
            pytest.fail("a second deployment appending to the running one's table started")
        assert f"'backfill' would write {tmp_path}/catalog.db/lake.cars, which the running deployment " \
               f"'ingest'" in refused
        assert running.status()["state"] == "running"
        running.stop()
