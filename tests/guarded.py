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
    """Every number from 0 once and in order, each running sum right: nothing lost, doubled or forged."""
    rows = [json.loads(line) for line in open(out)]
    assert rows, "the stream produced nothing"
    assert [r["n"] for r in rows] == list(range(len(rows)))
    sums: dict = {}
    for r in rows:
        sums[r["key"]] = sums.get(r["key"], 0) + r["n"]
        assert r["sum"] == sums[r["key"]]
    return len(rows)


def assert_drained(status: dict) -> None:
    """``stop()`` drained: every PE finished (a stalled channel leaves its PEs running until stopped)."""
    assert status["error"] is None
    assert {pe["pe"]: pe["state"] for pe in status["pes"]} == {pe["pe"]: "finished" for pe in status["pes"]}
