"""The Spark resource manager on a real standalone cluster, with dynamic allocation.

One scenario, step by step, as the IBM night-batch story goes: borrow two hosts
(Dask workers inside Spark executors), stream on them, a batch job of the same
Spark application arrives and finds no free slot -> a host is asked back,
emptied and returned, and the batch task runs on that very executor; the job
ends -> a host is borrowed again and used; an executor dies -> its host is
reported lost and Spark's retry of the lease starts no second worker. The
stream's output is exact throughout, and no process outlives the deployment.
"""

from __future__ import annotations

import threading

import dask
import psutil
import pytest

import pescheduler
from pescheduler import Application, BorrowHosts, Move, ReturnHost
import guarded
from waiting import gone, until

pytestmark = pytest.mark.spark

WAIT = 120
COUNT, RATE = 10**9, 3_000            # streams until the test stops it (drained: exact up to there)

@pytest.fixture(autouse=True)
def no_policies():
    """Actions here are applied by hand: no policy reconfigures the app behind the test's back."""
    with dask.config.set({"pescheduler.policies.default": []}):
        yield



def numbers_app(path):
    app = Application("stream-on-spark")
    (app.source("numbers", count=COUNT, keys=7, rate=RATE)
        .apply("tag").key_by("key").apply("running_sum").sink("jsonl", path=str(path)))
    return app


def processes_on(dep, pe, host_id):
    def check():
        m = dep.next_snapshot(timeout=10).pes.get(pe)
        return m is not None and m.host == host_id and m.tuples_in_per_s > 0
    until(check, 30, f"{pe} to process tuples on {host_id}")


def scheduler_workers(dep):
    from distributed import Client

    with Client(dep.scheduler_address, set_as_default=False, timeout=10) as client:
        return set(client.scheduler_info(n_workers=-1)["workers"])


def worker_names(dep):
    from distributed import Client

    with Client(dep.scheduler_address, set_as_default=False, timeout=10) as client:
        return {str(w.get("name")) for w in client.scheduler_info(n_workers=-1)["workers"].values()}


def run_batch(sc, result):
    """A batch job of the same Spark application: one task that says where it ran."""
    def task(_):
        import time as t

        from pescheduler.resource_managers.spark_lease import executor_of_this_process
        t.sleep(2)
        return executor_of_this_process()
    sc.setJobGroup("nightly-batch", "a batch job", interruptOnCancel=True)
    result["ran_on"] = sc.parallelize([0], 1).map(task).collect()[0]


def test_hosts_borrowed_from_spark_returned_to_a_batch_job_and_borrowed_again(spark_cluster, tmp_path):
    out = tmp_path / "out.jsonl"
    settings = {"master": spark_cluster.master_url, "max-executors": 2, "executor-idle-timeout": "2s",
                "return-within": "10s"}
    with dask.config.set({"pescheduler.rm.spark": settings}):
        with pescheduler.deploy(numbers_app(out), workers=2, rm="spark", plugins=["support_ops"]) as dep:
            until(lambda: dep.resources().lendable == 2, 90, "the Spark application to start")
            rm = dep.hosts.rm

            # Borrow two hosts: a Dask worker inside each of two executors.
            assert dep.apply(BorrowHosts(2), timeout=WAIT).applied
            hosts = dict(dep.hosts.borrowed)
            executors = {e["id"]: e for e in rm.executors()}
            for host in hosts.values():
                assert executors[host.info["executor_id"]]["activeTasks"] == 1
                assert host.info["executor_pid"] in [p.pid for p in psutil.Process(host.info["pid"]).parents()]
            pes = list(dep.placement().pes)
            first, second = sorted(hosts)
            for pe, host_id in zip(pes, (first, second)):
                assert dep.apply(Move(pe, hosts[host_id].workers[0])).applied
            processes_on(dep, pes[-1], second)

            # A batch job finds no free slot: Spark gets the newest host back, the job runs there.
            batch: dict = {}
            job = threading.Thread(target=run_batch, args=(rm.sc, batch))
            job.start()
            until(lambda: any(isinstance(r.action, ReturnHost) for r in dep.records()), 30,
                  "a host to be returned to Spark")
            returned = next(r for r in dep.records() if isinstance(r.action, ReturnHost))
            assert returned.applied and returned.action.host == second, returned
            assert "before its deadline" in returned.reason
            job.join(WAIT)
            assert batch["ran_on"]["executor_id"] == hosts[second].info["executor_id"]
            assert hosts[second].workers[0] not in scheduler_workers(dep)  # its Dask worker is gone
            assert dep.placement().pes[pes[-1]].host != second

            # The job ended: a host is lendable again, borrowed and used.
            until(lambda: dep.resources().lendable >= 1, 30, "Spark to have a slot free again")
            assert dep.apply(BorrowHosts(1), timeout=WAIT).applied
            (third,) = set(dep.hosts.borrowed) - {first}
            assert dep.apply(Move(pes[-1], dep.hosts.borrowed[third].workers[0])).applied
            processes_on(dep, pes[-1], third)

            # An executor dies: its host is reported lost, the stream runs on, Spark's retry starts no worker.
            home = next(w for w, h in dep.placement().hosts.items() if h not in dep.hosts.borrowed)
            assert dep.apply(Move(pes[-1], home)).applied
            victim = dep.hosts.borrowed[third].info
            psutil.Process(victim["executor_pid"]).kill()
            until(lambda: any(e["kind"] == "host-lost" and third in e["text"] for e in dep.status()["events"]),
                  30, f"{third} to be reported lost")
            until(lambda: third not in rm.leases, 60, "Spark's retry of the lease to end at once")
            assert third not in worker_names(dep) and dep.status()["state"] == "running"
            gone([victim["pid"]], 15, "the killed executor's Dask worker to exit")
            leased = [h.info for h in dep.hosts.borrowed.values()] + [victim]
            status = dep.stop()
            assert status["state"] == "stopped", status["error"]
            emitted = next(o["tuples_out"] for o in status["operators"] if o["op"] == "numbers-1")

    assert emitted > 0 and guarded.assert_exact(out) == emitted
    # The deployment closed: Spark released the executors, and the processes that ran Dask workers are gone.
    gone([i["executor_pid"] for i in leased], 30, "Spark to release its executors")
    gone([i["pid"] for i in leased], 15, "the Dask workers in Spark to exit")
