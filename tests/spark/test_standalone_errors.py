"""A standalone cluster that cannot start says why, and leaves no process behind."""

from __future__ import annotations

import socket

import pytest

from pescheduler.resource_managers import processes, spark_standalone
from pescheduler.resources import ResourceManagerUnavailable

pytestmark = pytest.mark.spark


def test_a_busy_master_port_is_reported_with_the_masters_log(monkeypatch, tmp_path):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        taken = busy.getsockname()[1]
        ports = iter([taken])
        monkeypatch.setattr(processes, "free_port", lambda host="127.0.0.1": next(ports, 0) or _free())
        cluster = spark_standalone.StandaloneCluster(workers=1, log_dir=str(tmp_path))
        with pytest.raises(ResourceManagerUnavailable, match=r"spark-master exited \(port busy\?\)"):
            cluster.start(timeout=60)
    assert cluster.master.popen.returncode is not None          # it exited and was waited for


def _free():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_start_given_up_before_its_cluster_exists_starts_no_cluster(monkeypatch):
    """The deployment ended (its manager's start cancelled) while the start thread was still
    checking Java: the thread gives up before it starts a master, instead of starting the whole
    cluster and then stopping it (a short `deploy --rm spark` waited ~10 s at its end)."""
    import asyncio
    import threading

    from pescheduler.resource_managers import spark

    entered, release = threading.Event(), threading.Event()
    check_java = spark.check_java

    def held_check_java():
        entered.set()
        release.wait(60)
        return check_java()
    monkeypatch.setattr(spark, "check_java", held_check_java)
    rm = spark.SparkResourceManager("tcp://127.0.0.1:1", {"master": None})

    async def cancel_while_checking_java():
        task = asyncio.ensure_future(rm.start(lambda event: None))
        assert await asyncio.to_thread(entered.wait, 60)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        release.set()
    asyncio.run(cancel_while_checking_java())         # its end waits for the start thread
    assert rm._start_done and rm.cluster is None and rm.sc is None
