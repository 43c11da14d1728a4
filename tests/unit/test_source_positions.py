"""Replayable sources: ``position()`` after k events, ``seek`` on a fresh instance, exactly the rest.

Every position goes through JSON and msgpack first, as a checkpoint manifest stores it.
"""

import json

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pescheduler.errors import NotReplayable, PeschedulerError
from pescheduler.operator import Share, Source
from pescheduler.operators.kafka import KafkaSource
from pescheduler.operators.redis_streams import RedisStreamSource
from pescheduler.operators.sources import GeneratorSource, IterableSource, JsonlSource


def stored(position):
    """What a checkpoint gives back: the position after JSON, then msgpack, unchanged."""
    back = msgpack.unpackb(msgpack.packb(json.loads(json.dumps(position))))
    assert back == position, "a position must survive JSON and msgpack unchanged"
    return back


def read_n(source, k, n):
    """At least ``k`` tuples (batches of ``n``; a source may return more), or all there are."""
    out = []
    while len(out) < k and (batch := source.read(min(n, k - len(out)))) is not None:
        out += batch
    return out


def read_all(source, n):
    out = []
    while (batch := source.read(n)) is not None:
        out += batch
    return out


def resumes_exactly(make, k, n):
    """Read k from one instance, seek a fresh one to its position: head + tail is the whole."""
    whole = read_all(make(), n)
    first = make()
    head = read_n(first, k, n)
    second = make()
    second.seek(stored(first.position()))
    assert head + read_all(second, n) == whole
    return head


# -- generator ----------------------------------------------------------------------------

HOT = [{"from": 40, "keys": 3, "share": 0.7}]


@settings(max_examples=40, deadline=None)
@given(k=st.integers(0, 300), n=st.integers(1, 64),
       params=st.sampled_from([{}, {"disorder_ms": 20}, {"hotspots": HOT, "disorder_ms": 5}]))
def test_generator_seek_yields_exactly_the_remaining_events(k, n, params):
    resumes_exactly(lambda: GeneratorSource(events=300, keys=20, seed=11, **params), k, n)


@settings(max_examples=20, deadline=None)
@given(batches=st.integers(0, 6), rows=st.integers(1, 40))
def test_generator_columnar_seek_yields_exactly_the_remaining_batches(batches, rows):
    def make():
        return GeneratorSource(events=200, keys=20, seed=5, columnar=True, columnar_rows=rows)

    def rows_of(source, batches=None):
        out = []
        while (batches is None or batches > 0) and (batch := source.read(1)) is not None:
            out += batch.to_pylist()
            batches = None if batches is None else batches - 1
        return out

    whole = rows_of(make())
    first = make()
    head = rows_of(first, batches)
    second = make()
    second.seek(stored(first.position()))
    assert head + rows_of(second) == whole


def test_generator_seek_far_into_an_endless_stream_is_fast_and_exact():
    first = GeneratorSource(events=None, keys=100, seed=2)
    for _ in range(50):
        first.read(20_000)                     # a million events in
    second = GeneratorSource(events=None, keys=100, seed=2)
    second.seek(stored(first.position()))
    assert second.read(500) == first.read(500)


def test_generator_seek_after_restore_of_the_same_checkpoint_is_a_no_op():
    first = GeneratorSource(events=100, seed=1)
    first.read(30)
    second = GeneratorSource(events=100, seed=1)
    second.restore(first.snapshot())
    second.seek(first.position())
    assert read_all(second, 7) == read_all(first, 7)


# -- iterable -----------------------------------------------------------------------------

@settings(max_examples=30, deadline=None)
@given(k=st.integers(0, 50), n=st.integers(1, 16),
       items=st.sampled_from([list(range(50)), tuple(range(50)), range(50)]))
def test_iterable_over_a_sequence_seeks_to_the_remaining_items(k, n, items):
    resumes_exactly(lambda: IterableSource(items=items, ts_field=None), k, n)


def test_iterable_over_a_one_shot_iterator_refuses_with_why_and_what_instead():
    source = IterableSource(items=(i for i in range(5)), ts_field=None)
    source.read(2)
    with pytest.raises(NotReplayable, match="one-shot iterator.*pass a list"):
        source.position()
    with pytest.raises(NotReplayable):
        IterableSource(items=iter([1])).seek({"offset": 0})
    assert issubclass(NotReplayable, PeschedulerError)


def test_a_source_without_positions_is_not_replayable_by_default():
    class Ticks(Source):
        name = "ticks"

        def read(self, n):
            return [1] * n

    with pytest.raises(NotReplayable, match="'ticks'.*implement position\\(\\) and seek\\(\\)"):
        Ticks().position()

    class Counted(Ticks):                    # its snapshot carries its place: restore rewinds it
        def snapshot(self):
            return 0

        def restore(self, state):
            pass

    assert Counted().position() is None


# -- jsonl --------------------------------------------------------------------------------

def lines(rows):
    return "".join(json.dumps(r) + "\n" for r in rows)


@settings(max_examples=30, deadline=None)
@given(k=st.integers(0, 60), n=st.integers(1, 16))
def test_jsonl_directory_seek_yields_exactly_the_remaining_lines(tmp_path_factory, k, n):
    folder = tmp_path_factory.mktemp("in")
    for f in range(3):                       # three files, a blank line in the middle one
        rows = [{"n": 20 * f + i} for i in range(20)]
        (folder / f"{f}.jsonl").write_text(lines(rows[:10]) + ("\n" if f == 1 else "") + lines(rows[10:]))
    head = resumes_exactly(lambda: JsonlSource(path=str(folder), ts_field=None), k, n)
    assert [r["n"] for r in head] == list(range(len(head)))


@settings(max_examples=30, deadline=None)
@given(cuts=st.lists(st.integers(1, 40), min_size=1, max_size=6), k=st.integers(0, 40), n=st.integers(1, 8))
def test_jsonl_followed_growing_file_seek_resumes_mid_growth(tmp_path_factory, cuts, k, n):
    """The file grows in pieces cut anywhere (mid-line too); positions are taken in between."""
    path = tmp_path_factory.mktemp("grow") / "in.jsonl"
    text = lines({"n": i} for i in range(40))
    path.write_text("")
    first = JsonlSource(path=str(path), follow=True, ts_field=None)
    head, written = [], 0
    for cut in sorted(set(cuts)):
        stop = round(len(text) * cut / 40)
        with open(path, "a") as f:
            f.write(text[written:stop])
        written = max(written, stop)
        while len(head) < k and (batch := first.read(n)):
            head += batch
    saved = stored(first.position())
    first.close()
    with open(path, "a") as f:
        f.write(text[written:])
    second = JsonlSource(path=str(path), follow=True, ts_field=None)
    second.seek(saved)
    tail = []
    while batch := second.read(n):
        tail += batch
    second.close()
    assert [r["n"] for r in head + tail] == list(range(40))


# -- partitioned sources (no broker: the positions alone; tests/integration reads real ones) --

def test_partitioned_positions_are_per_share_disjoint_and_their_union_seeks_any_instance():
    make = [lambda: KafkaSource(topic="t"), lambda: RedisStreamSource(stream=["a", "b", "c"])]
    keys = [["0", "1", "2"], ["a", "b", "c"]]
    for new, names in zip(make, keys):
        everything = {0: 10, 1: 20, 2: 30} if names[0] == "0" else {"a": "1-0", "b": "2-0", "c": "3-0"}
        parts = []
        for i in range(2):
            src = new()
            src.restore({"positions": dict(everything), "max_ts": {}, "share": Share(i, 2)})
            parts.append(stored(src.position()))
        assert set(parts[0]) == {names[0], names[2]} and set(parts[1]) == {names[1]}
        union = {**parts[0], **parts[1]}
        single = new()
        single.seek(union)
        assert single.position() == union
