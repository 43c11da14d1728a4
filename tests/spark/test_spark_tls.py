"""A host borrowed from Spark joins a TLS cluster over TLS: the lease task's Dask worker gets the
deployment's certificates with the task, and the stream runs on it exactly."""

from __future__ import annotations

import dask
import pytest

import pescheduler
from pescheduler import BorrowHosts, Move
from guarded import assert_drained, assert_exact, running_app
from waiting import until

pytestmark = pytest.mark.spark

BOUND = 60.0        # seconds: every wait here is bounded by this


def test_a_host_borrowed_from_spark_joins_a_tls_cluster_over_tls(spark_cluster, tmp_path):
    out = tmp_path / "o.jsonl"
    settings = {"master": spark_cluster.master_url, "max-executors": 1}
    with dask.config.set({"pescheduler.rm.spark": settings}):
        with pescheduler.deploy(running_app(out), workers=2, security=True, rm="spark",
                                plugins=["support_ops"], policies=[]) as dep:
            assert dep.scheduler_address.startswith("tls://")
            until(lambda: dep.resources().lendable == 1, 3 * BOUND, "the Spark application to start")
            borrowed = dep.apply(BorrowHosts(1, reason="test"), timeout=3 * BOUND)
            assert borrowed.applied, borrowed.reason
            [host] = dep.hosts.borrowed.values()
            [worker] = host.workers
            assert worker.startswith("tls://")
            sink = next(p for p, pe in dep.placement().pes.items() if "jsonl-5" in pe.operators)
            moved = dep.apply(Move(sink, worker), timeout=BOUND)
            assert moved.applied, moved.reason

            def processing_there():
                m = dep.next_snapshot(timeout=BOUND).pes.get(sink)
                return m is not None and m.worker == worker and m.tuples_in_per_s > 0
            until(processing_there, BOUND, f"{sink} to process tuples on the Spark host")
            assert_drained(dep.stop())
    assert assert_exact(out) > 0
