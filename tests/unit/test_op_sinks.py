"""Built-in sinks: jsonl (atomic batches, truncation, durable flush) and print."""

import datetime
import json
import os

from pescheduler.operators.sinks import JsonlSink, PrintSink
from pescheduler.testing import run_operators


def test_jsonl_creates_dirs_truncates_and_writes_compact_lines(tmp_path):
    path = tmp_path / "out" / "deep" / "r.jsonl"
    path.parent.mkdir(parents=True)
    path.write_text("stale\n")
    rows = [{"a": 1, "when": datetime.date(2024, 5, 1)}, {"a": 2, "b": [1, 2]}]
    result = run_operators(rows, JsonlSink(path=str(path)), ts_field=None)
    assert path.read_text() == '{"a":1,"when":"2024-05-01"}\n{"a":2,"b":[1,2]}\n'
    assert result.output == [] and not result.dead_letters


def test_jsonl_writes_each_batch_with_one_os_write_and_fsyncs(tmp_path, monkeypatch):
    calls = []
    real_write, real_fsync = os.write, os.fsync
    monkeypatch.setattr(os, "write", lambda fd, data: calls.append(data) or real_write(fd, data))
    monkeypatch.setattr(os, "fsync", lambda fd: calls.append("fsync") or real_fsync(fd))
    path = tmp_path / "r.jsonl"
    run_operators([{"i": i} for i in range(25)], JsonlSink(path=str(path)), batch_size=10, ts_field=None)
    assert [c if c == "fsync" else c.count(b"\n") for c in calls] == [10, 10, 5, "fsync"]
    assert [json.loads(line)["i"] for line in path.read_text().splitlines()] == list(range(25))


def test_print_writes_json_lines(capsys):
    run_operators([{"x": 1}, {"y": "z"}], PrintSink(), ts_field=None)
    assert capsys.readouterr().out == '{"x":1}\n{"y":"z"}\n'


def test_discard_sink_consumes_and_emits_nothing():
    from pescheduler.operators.sinks import DiscardSink

    result = run_operators([{"x": i, "ts": i} for i in range(2500)], DiscardSink(), batch_size=1000)
    assert result.output == [] and result.ended
    assert result.chain.nodes["discard-1"].stats.tuples_in == 2500
