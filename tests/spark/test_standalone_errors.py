"""A standalone cluster that cannot start says why, and leaves no process behind."""

from __future__ import annotations

import socket

import pytest

from pescheduler.resource_managers import processes, spark_standalone
from pescheduler.resources import ResourceManagerUnavailable
from waiting import until_async

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
        await until_async(lambda: rm._aborted, 60, "the start given up")
        release.set()
        with pytest.raises(asyncio.CancelledError):
            await task                                # the cancelled start waits (bounded) for its thread
    asyncio.run(cancel_while_checking_java())
    assert rm._start_done and rm.cluster is None and rm.sc is None


GIVEN_UP_INSIDE_SPARKCONTEXT = """
import asyncio, json, socket, sys
from pyspark import SparkContext
from pescheduler.resource_managers import spark

silent = socket.socket()                       # a master that accepts and never answers
silent.bind(("127.0.0.1", 0))
silent.listen()
rm = spark.SparkResourceManager("tcp://127.0.0.1:1", {"master": f"spark://127.0.0.1:{silent.getsockname()[1]}"})

async def cancel_inside_sparkcontext():
    task = asyncio.ensure_future(rm.start(lambda event: None))
    while SparkContext._gateway is None and not task.done():     # the driver JVM is up: SparkContext
        await asyncio.sleep(0.05)                                # is being created, waiting for the master
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    return rm._start_done
print(json.dumps({"start_thread_ended": asyncio.run(cancel_inside_sparkcontext())}), flush=True)
"""


def test_a_start_given_up_inside_sparkcontext_kills_its_driver_and_its_thread_ends():
    """A master that never answers: SparkContext's creation waits for it (a minute of retries;
    a master stopped under a Ctrl-C'd deploy does the same). The start, cancelled then, kills the
    driver JVM it launched by PID, so its thread has ended when the cancellation returns, and the
    process exits with no JVM left. Before, the thread ran on in the py4j call and the process's
    exit joined it (a Ctrl-C'd `deploy --rm spark` did not exit within 150 s, loaded)."""
    import json
    import subprocess
    import sys

    import psutil

    proc = subprocess.Popen([sys.executable, "-c", GIVEN_UP_INSIDE_SPARKCONTEXT], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        out, err = proc.communicate(timeout=240)
    finally:
        if proc.poll() is None:
            children = psutil.Process(proc.pid).children(recursive=True)
            proc.kill()
            for child in children:
                child.kill()
            proc.wait(10)
    assert proc.returncode == 0, err[-3000:]
    assert json.loads(out.splitlines()[-1]) == {"start_thread_ended": True}, err[-3000:]
