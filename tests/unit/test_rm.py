"""Resource managers without a cluster: registration, selection, demand schedules, Spark demand."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import dask
import pytest

from pescheduler import cli
from pescheduler.control.deployment import default_rm
from pescheduler.plugins import load_plugins
from pescheduler.resource_managers.local import LocalResourceManager, load_schedule
from pescheduler.resource_managers.spark import Demand, batch_demand, spark_conf
from pescheduler.resources import HostReturnRequested, ResourceManager


def test_builtin_managers_travel_the_entry_point_road_and_are_listed(capsys):
    found = load_plugins()
    assert {"local", "spark"} <= set(found.resource_managers)
    assert found.origins["builtin-resource-managers"].startswith("pescheduler")
    assert all(isinstance(cls(scheduler_address="tcp://x:1", settings={}), ResourceManager)
               for cls in found.resource_managers.values())
    assert cli.main(["plugins"]) == 0
    out = capsys.readouterr().out
    assert "LocalResourceManager" in out and "SparkResourceManager" in out


def test_local_is_the_default_for_an_embedded_cluster_and_none_for_a_given_one():
    assert default_rm(None) == "local" and default_rm("tcp://h:8786") is None
    with dask.config.set({"pescheduler.rm.name": "spark"}):
        assert default_rm(None) == "spark" == default_rm("tcp://h:8786")
    with dask.config.set({"pescheduler.rm.name": "none"}):
        assert default_rm(None) is None


def test_an_unknown_manager_is_a_user_mistake_naming_the_known_ones(tmp_path, capsys):
    app = tmp_path / "app.py"
    app.write_text("from pescheduler import Application\napp = Application('a')\n"
                   "app.source('iterable', items=[1]).sink('print')\n")
    assert cli.main(["deploy", str(app), "--rm", "yarn-ish"]) == 2
    err = capsys.readouterr().err
    assert "unknown resource manager 'yarn-ish'" in err and "local, spark" in err


def test_schedules_load_from_yaml_or_json_files_sorted_and_checked(tmp_path):
    (tmp_path / "d.yaml").write_text("- {at: 90, free: 2}\n- {at: 30, want: 2, within: 10}\n")
    (tmp_path / "d.json").write_text('[{"at": 5, "want": "local-1"}]')
    assert [e["at"] for e in load_schedule(str(tmp_path / "d.yaml"))] == [30, 90]
    assert load_schedule(str(tmp_path / "d.json")) == [{"at": 5, "want": "local-1"}]
    with pytest.raises(ValueError, match="needs 'at'"):
        load_schedule([{"at": 3}])


def test_a_wanted_host_is_not_lendable_until_freed_and_a_held_one_is_asked_back():
    events = []

    async def scenario():
        rm = LocalResourceManager("tcp://unused:1", {"hosts": 2})
        rm._on_event = lambda e: asyncio.sleep(0, events.append(e))
        await rm.want(2, within=10)                         # not held: only marked wanted
        assert rm.lendable() == 1 and not events
        from pescheduler.resource_managers.local import _Held
        from pescheduler.resources import Host
        rm.held["local-1"] = _Held(Host("local-1", ("tcp://w:1",)))
        await rm.want("local-1", within=10)
        assert rm.lendable() == 0
        rm.free("2")
        assert rm.lendable() == 1
    asyncio.run(scenario())
    assert len(events) == 1 and isinstance(events[0], HostReturnRequested)
    assert events[0].host.host_id == "local-1"


class FakeTracker:
    """A ``StatusTracker`` with one lease job and one batch job of 3 tasks, 1 running."""

    def getActiveJobsIds(self):
        return [0, 1]

    def getActiveStageIds(self):
        return [10, 11]

    def getJobInfo(self, job_id):
        return SimpleNamespace(stageIds=[10] if job_id == 0 else [11, 12])

    def getStageInfo(self, stage_id):
        return {10: SimpleNamespace(numTasks=1, numActiveTasks=1, numCompletedTasks=0, numFailedTasks=0),
                11: SimpleNamespace(numTasks=3, numActiveTasks=1, numCompletedTasks=0, numFailedTasks=0),
                12: SimpleNamespace(numTasks=5, numActiveTasks=0, numCompletedTasks=0, numFailedTasks=0)}[stage_id]


def test_batch_demand_counts_other_jobs_tasks_in_active_stages_only():
    assert batch_demand(FakeTracker(), lease_jobs={0}) == Demand(pending=2, running=1)
    assert batch_demand(FakeTracker(), lease_jobs={0, 1}) == Demand()


def test_spark_conf_sets_dynamic_allocation_and_takes_overrides():
    conf = spark_conf("spark://m:7077", {"max-executors": 3, "conf": {"spark.executor.memory": "1g"}})
    assert conf["spark.dynamicAllocation.enabled"] == "true"
    assert conf["spark.dynamicAllocation.maxExecutors"] == "3"
    assert conf["spark.executor.memory"] == "1g" and conf["spark.executor.cores"] == "1"


def test_the_lease_task_never_raises_and_ends_when_its_scheduler_is_unreachable(monkeypatch):
    from pescheduler.resource_managers import spark_lease

    monkeypatch.setattr(spark_lease, "DEATH_TIMEOUT_S", 1.0)
    outcome = spark_lease.lease(("tcp://127.0.0.1:9", "spark-9"))
    assert outcome.startswith("failed spark-9:")
    assert spark_lease.executor_of_this_process()["executor_id"] == ""        # not inside Spark


def test_a_retried_lease_task_does_not_start_a_second_worker(monkeypatch):
    from pescheduler.resource_managers import spark_lease

    monkeypatch.setattr(spark_lease, "_retried", lambda: True)
    assert spark_lease.lease(("tcp://127.0.0.1:9", "spark-9")).startswith("not restarted spark-9")


def test_missing_java_or_pyspark_is_a_clear_error(monkeypatch):
    import builtins

    from pescheduler.resource_managers import spark_standalone
    from pescheduler.resources import ResourceManagerUnavailable

    monkeypatch.delenv("JAVA_HOME", raising=False)
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(ResourceManagerUnavailable, match="Java is missing: install a JDK"):
        spark_standalone.check_java()
    real_import = builtins.__import__
    monkeypatch.setattr(builtins, "__import__", lambda name, *a, **k: (_ for _ in ()).throw(ImportError(name))
                        if name == "pyspark" else real_import(name, *a, **k))
    monkeypatch.delenv("SPARK_HOME", raising=False)
    with pytest.raises(ResourceManagerUnavailable, match=r'pip install "pescheduler\[spark\]"'):
        spark_standalone.spark_home()
