"""Built-in sources: iterable, generator (determinism, hot spots), jsonl (files, follow)."""

import json
from collections import Counter

import pytest

from pescheduler.operators.basic import Map
from pescheduler.operators.sources import GeneratorSource, IterableSource, JsonlSource
from pescheduler.testing import run_operators


def read_all(source, n):
    out = []
    while (batch := source.read(n)) is not None:
        out += batch
    return out


# -- iterable -------------------------------------------------------------------------

def test_iterable_reads_batches_then_ends():
    source = IterableSource(items=range(5), ts_field=None)
    assert [source.read(2), source.read(2), source.read(2), source.read(2)] == [[0, 1], [2, 3], [4], None]


def test_iterable_restore_skips_what_was_read_even_for_a_generator():
    first = IterableSource(items=(i for i in range(6)))
    first.read(4)
    second = IterableSource(items=(i for i in range(6)))
    second.restore(first.snapshot())
    assert read_all(second, 10) == [4, 5]


# -- generator ------------------------------------------------------------------------

HOT = [{"from": 3_000, "keys": 5, "share": 0.6}, {"from": 7_000, "keys": ["car-99"], "share": 0.9}]


@pytest.mark.parametrize("params", [{}, {"disorder_ms": 50, "hotspots": HOT}])
def test_generator_sequence_is_the_same_for_any_batch_size(params):
    events = [read_all(GeneratorSource(events=10_000, keys=100, seed=3, **params), n)
              for n in (1, 7, 1000, 4096)]
    assert len(events[0]) == 10_000
    assert events[0] == events[1] == events[2] == events[3]
    assert events[0] != read_all(GeneratorSource(events=10_000, keys=100, seed=4, **params), 1000)


def test_generator_events_look_like_connected_cars():
    events = read_all(GeneratorSource(events=2_000, keys=50, start_ts=1000, interval_ms=2,
                                      disorder_ms=30), 500)
    assert set(events[0]) == {"car", "speed", "lat", "lon", "ts"}
    assert len({e["car"] for e in events}) == 50
    assert all(0 <= e["speed"] < 130 and isinstance(e["lat"], float) for e in events)
    jitter = [1000 + 2 * i - e["ts"] for i, e in enumerate(events)]
    assert 0 == min(jitter) < 25 < max(jitter) <= 30


def test_generator_hot_spot_share_within_tolerance():
    events = read_all(GeneratorSource(events=60_000, keys=1_000, hotspots=HOT), 1000)
    first, second, third = Counter(e["car"] for e in events[:3_000]), \
        Counter(e["car"] for e in events[3_000:7_000]), Counter(e["car"] for e in events[7_000:])
    hot5 = ["car-000", "car-001", "car-002", "car-003", "car-004"]
    assert sum(first[c] for c in hot5) / 3_000 < 0.02                 # uniform before the phase
    assert sum(second[c] for c in hot5) / 4_000 == pytest.approx(0.6 + 0.4 * 5 / 1000, abs=0.03)
    assert third["car-99"] / 53_000 == pytest.approx(0.9, abs=0.01)   # a car id outside the fleet


def test_generator_restore_continues_the_same_sequence():
    whole = read_all(GeneratorSource(events=5_000, seed=9, disorder_ms=10), 1000)
    first = GeneratorSource(events=5_000, seed=9, disorder_ms=10)
    head = first.read(1234)
    second = GeneratorSource(**first.parameters())
    second.restore(first.snapshot())
    assert head + read_all(second, 1000) == whole


def test_generator_unbounded_and_validated():
    assert len(GeneratorSource(events=None).read(50_000)) == 50_000
    assert [e["ts"] for e in GeneratorSource(events=3, start_ts=5, interval_ms=0).read(10)] == [5, 5, 5]
    with pytest.raises(ValueError, match="share must be in"):
        GeneratorSource(hotspots=[{"from": 0, "keys": 3, "share": 1.5}])
    with pytest.raises(ValueError, match="expected"):
        GeneratorSource(hotspots=[{"keys": 3}])


def test_generator_feeds_a_pipeline_with_watermarks():
    result = run_operators(GeneratorSource(events=3_000, interval_ms=10), Map(lambda e: e["ts"]))
    assert len(result.output) == 3_000 and result.ended
    assert result.watermarks[-1] == 1_700_000_000_000 + 29_990 - 1000 - 1


# -- jsonl --------------------------------------------------------------------------------

def write(path, rows):
    with open(path, "w") as f:
        f.write("".join(json.dumps(r) + "\n" for r in rows))


def append(path, text):
    with open(path, "a") as f:
        f.write(text)


def test_jsonl_reads_a_directory_in_name_order(tmp_path):
    write(tmp_path / "b.jsonl", [{"n": 2}, {"n": 3}])
    (tmp_path / "a.jsonl").write_text('\n\n{"n": 0}\n\n{"n": 1}')     # blank lines, no final newline
    write(tmp_path / ".hidden", [{"n": 99}])
    source = JsonlSource(path=str(tmp_path), ts_field=None)
    assert read_all(source, 1) == [{"n": 0}, {"n": 1}, {"n": 2}, {"n": 3}]


def test_jsonl_follow_waits_for_complete_lines_and_new_files(tmp_path):
    source = JsonlSource(path=str(tmp_path), follow=True, ts_field=None)
    assert source.read(10) == []
    write(tmp_path / "1.jsonl", [{"n": 0}])
    append(tmp_path / "1.jsonl", '{"n": ')
    assert source.read(10) == [{"n": 0}]
    assert source.read(10) == []                        # half a line is not read
    append(tmp_path / "1.jsonl", '1}\n')
    write(tmp_path / "2.jsonl", [{"n": 2}])
    assert source.read(10) == [{"n": 1}]
    assert source.read(10) == [{"n": 2}]
    assert source.read(10) == []                        # never None while following
    source.close()


def test_jsonl_restore_continues_after_the_last_line(tmp_path):
    write(tmp_path / "in.jsonl", [{"n": i} for i in range(10)])
    first = JsonlSource(path=str(tmp_path / "in.jsonl"))
    first.read(4)
    second = JsonlSource(**first.parameters())
    second.restore(first.snapshot())
    assert [r["n"] for r in read_all(second, 3)] == [4, 5, 6, 7, 8, 9]
    first.close(), second.close()


def test_jsonl_bad_line_is_dead_lettered_with_file_and_line_and_the_rest_flows(tmp_path):
    (tmp_path / "in.jsonl").write_text('{"n": 0, "ts": 0}\n\n{oops\n{"n": 1, "ts": 1}\n')
    result = run_operators(JsonlSource(path=str(tmp_path / "in.jsonl")), batch_size=10)
    assert [t["n"] for t in result.output] == [0, 1]
    [dead] = result.dead_letters
    assert dead.item["line"] == 3 and dead.item["text"] == "{oops"
    assert "in.jsonl:3: not JSON" in dead.error and dead.operator == "source-0"
