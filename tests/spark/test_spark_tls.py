"""A host borrowed from Spark joins a TLS cluster over TLS: the lease task's Dask worker gets the
deployment's certificates with the task, and the stream runs on it exactly."""

from __future__ import annotations

import dask
import pytest

import pescheduler
from guarded import assert_drained, assert_exact, running_app, sink_on_a_borrowed_tls_host
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
            sink_on_a_borrowed_tls_host(dep, BOUND)
            assert_drained(dep.stop())
    assert assert_exact(out) > 0
