"""The keyed running-sum app the security and TLS tests stream, and its exactness checks."""

from __future__ import annotations

import json

from pescheduler import Application


def running_app(out, count: int = 10**9, rate: float = 2000.0) -> Application:
    app = Application("guarded")
    (app.source("numbers", count=count, keys=7, rate=rate)
        .apply("tag").key_by("key").apply("running_sum").sink("jsonl", path=str(out)))
    return app


def assert_exact(out) -> int:
    """Every number from 0 once, each key's numbers in order, each running sum right: nothing lost,
    doubled or forged. Across keys the order may change: a moved key group's tuples wait for its
    state while the groups already there go on (docs/state.md)."""
    rows = [json.loads(line) for line in open(out)]
    assert rows, "the stream produced nothing"
    assert sorted(r["n"] for r in rows) == list(range(len(rows)))
    by_key: dict = {}
    for r in rows:
        by_key.setdefault(r["key"], []).append(r["n"])
    assert all(ns == sorted(ns) for ns in by_key.values()), "a key's numbers out of order"
    sums: dict = {}
    for r in rows:
        sums[r["key"]] = sums.get(r["key"], 0) + r["n"]
        assert r["sum"] == sums[r["key"]]
    return len(rows)


def assert_drained(status: dict) -> None:
    """``stop()`` drained: every PE finished (a stalled channel leaves its PEs running until stopped)."""
    assert status["error"] is None
    unfinished = {pe["pe"]: pe["state"] for pe in status["pes"] if pe["state"] != "finished"}
    assert not unfinished, f"PEs not finished when stop() returned: {unfinished}; {status['pes']}"


def sink_on_a_borrowed_tls_host(dep, bound: float) -> str:
    """Borrow one host, check its worker joined over TLS, move the sink's PE there and wait
    until it processes tuples there; the borrowed worker's address."""
    from pescheduler import BorrowHosts, Move
    from waiting import until

    borrowed = dep.apply(BorrowHosts(1, reason="test"), timeout=3 * bound)
    assert borrowed.applied, borrowed.reason
    [host] = dep.hosts.borrowed.values()
    [worker] = host.workers
    assert worker.startswith("tls://")
    sink = next(p for p, pe in dep.placement().pes.items() if "jsonl-5" in pe.operators)
    moved = dep.apply(Move(sink, worker), timeout=bound)
    assert moved.applied, moved.reason

    def processing_there():
        m = dep.next_snapshot(timeout=bound).pes.get(sink)
        return m is not None and m.worker == worker and m.tuples_in_per_s > 0
    until(processing_there, bound, f"{sink} to process tuples on the borrowed host")
    return worker
