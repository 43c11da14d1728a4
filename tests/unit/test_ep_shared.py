"""Queries of one shape share their work on the native engine (``ep_patterns``, ``ep_correlate``,
``ep_over`` lanes): per query, rows and late events equal those of the query's own operator
(``EventProcessor(share=False)``), in the same order, on random streams with equal timestamps,
out-of-order events, queries added and removed while events flow."""

import random

import dask
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pescheduler import ep
from pescheduler.operator import Emitter, OperatorContext
from pescheduler.operators.ep_over import OverLanes

SCHEMA = {"id": str, "a": int, "b": int}


def stream(seed, n, span=5, jitter=3):
    """``n`` events on 3 keys, ts climbing one per event with up to ``jitter`` ms out of order."""
    rnd = random.Random(seed)
    return [({"id": f"k{rnd.randrange(3)}", "a": rnd.randrange(span), "b": rnd.randrange(span)},
             max(0, i // 2 - rnd.randint(0, jitter))) for i in range(n)]


def jepc_pattern(i, size, key=None):
    return ep.Stream("s", window=ep.Tumbling(size), key=key).pattern(
        "x y u", {"x": True, "y": ep.col("a") - ep.measure("z1") == i, "u": ep.col("a") - ep.measure("z2") == i},
        do={"x": {"z1": ep.col("a")}, "y": {"z2": ep.col("a")}})


PATTERNS = {
    **{f"jepc{i}": jepc_pattern(i, 6 + i) for i in range(-1, 3)},
    **{f"keyed{i}": jepc_pattern(i, 8, key="id") for i in range(0, 2)},
    **{f"plus{i}": ep.Stream("s", window=ep.Tumbling(5 + i)).pattern(
        "x y+ u", {"x": ep.col("a") < 3, "y": (ep.col("a") >= ep.measure("z")) & (ep.col("b") - ep.measure("z") == i),
                   "u": (ep.col("a") < ep.measure("z")) | (ep.col("b") == 0)},
        do={"x": {"z": ep.col("a")}, "y": {"z": ep.col("a")}}) for i in range(0, 3)},
    **{f"alt{i}": ep.Stream("s", window=ep.Tumbling(4)).pattern(
        "x (y | y) y*", {"x": ep.col("a") <= 2, "y": ep.col("b") - ep.col("a") == i}) for i in (0, 1)},
    "python": ep.Stream("s", window=ep.Tumbling(5)).pattern("x y", {"x": lambda e, m: e["a"] > 2, "y": True}),
}
LATER = {"jepc9": jepc_pattern(1, 7), "plus9": ep.Stream("s", window=ep.Tumbling(9)).pattern(
    "x y+ u", {"x": ep.col("a") < 3, "y": (ep.col("a") >= ep.measure("z")) & (ep.col("b") - ep.measure("z") == 1),
               "u": (ep.col("a") < ep.measure("z")) | (ep.col("b") == 0)},
    do={"x": {"z": ep.col("a")}, "y": {"z": ep.col("a")}})}

CORRELATIONS = {
    **{f"c{i}": ep.Stream("s", window=ep.Tumbling(4 + i)).correlate("t", ep.left("a") - ep.right("b") == i)
       for i in range(-1, 3)},
    **{f"more{i}": ep.Stream("s", window=ep.Tumbling(3)).correlate(
        "t", (ep.left("a") + 1 == ep.right("b") - i) & (ep.left("b") <= ep.right("a"))) for i in (0, 2)},
}
LATER_CORRELATIONS = {"c9": ep.Stream("s", window=ep.Tumbling(6)).correlate("t", ep.left("a") - ep.right("b") == 1)}


def in_backend(backend, tmp_path_factory):
    """The keyed state backend the operators opened inside it use (``ep_patterns``' runs)."""
    where = str(tmp_path_factory.mktemp("state"))
    return dask.config.set({"pescheduler.state.backend": backend, "pescheduler.state.dir": where})


def run(share, queries, later, events, max_delay, batch):
    """Results and late events per query; half-way, the first query leaves and ``later`` come."""
    proc = ep.EventProcessor(share=share)
    for name in ("s", "t"):
        proc.register_stream(name, SCHEMA, max_delay=max_delay)
    out = {q: [] for q in (*queries, *later)}
    for q, d in queries.items():
        proc.create_query(q, d)
        proc.add_output_processor(q, out[q].append)
    late = {}
    s, t = events
    half = len(s) // 2
    for i in range(0, len(s), batch):
        if i >= half and later and not late:
            first = next(iter(queries))
            late[first] = proc.late(first)
            proc.remove_query(first)
            for q, d in later.items():
                proc.create_query(q, d)
                proc.add_output_processor(q, out[q].append)
        proc.push_events("s", s[i:i + batch])
        proc.push_events("t", t[i:i + batch])
    late.update({q: proc.late(q) for q in proc._queries})
    nodes = [n.name for n in proc._nodes.values()]
    proc.close()
    return out, late, nodes


def same_rows_shared_or_not(queries, later, events, max_delay, batch):
    """Run shared and unshared; every query's rows and late events equal: (rows, operator names)."""
    shared, shared_late, nodes = run(True, queries, later, events, max_delay, batch)
    alone, alone_late, _ = run(False, queries, later, events, max_delay, batch)
    assert shared == alone
    assert shared_late == alone_late
    return shared, nodes


SETTINGS = settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@pytest.mark.parametrize("backend", ["memory", "disk"])
@SETTINGS
@given(seed=st.integers(0, 10**6), max_delay=st.sampled_from([0, 3]), batch=st.sampled_from([1, 4]))
def test_pattern_queries_of_one_shape_share_runs_and_give_each_query_its_own_rows(tmp_path_factory, backend, seed,
                                                                                  max_delay, batch):
    with in_backend(backend, tmp_path_factory):
        shared, nodes = same_rows_shared_or_not(PATTERNS, LATER, (stream(seed, 120), stream(seed + 1, 120)),
                                                max_delay, batch)
    assert any(shared.values())
    assert nodes.count("ep_patterns") == 2 and "pattern" not in nodes and "ep_group" not in nodes


@pytest.mark.parametrize("backend", ["memory", "disk"])
def test_one_automaton_serves_every_query_of_a_shape(tmp_path_factory, backend):
    with in_backend(backend, tmp_path_factory):
        one_automaton_serves_every_query_of_a_shape(backend)


def one_automaton_serves_every_query_of_a_shape(backend):
    proc = ep.EventProcessor()
    proc.register_stream("s", SCHEMA)
    for q, d in PATTERNS.items():
        proc.create_query(q, d)
    (op,) = [n.op for n in proc._nodes.values() if n.name == "ep_patterns" and "jepc-1" in n.op.query_ids]
    sizes = sorted(len(f.queries) for f in op._families)
    assert sizes == [1, 2, 3, 4], sizes       # python alone, alt, plus, jepc (keyed ones: another operator)
    assert op._runs.backend == backend        # the runs: in the keyed state backend
    rows = []
    proc.add_output_processor("jepc1", rows.append)
    for ts, a in enumerate([5, 6, 7, 0, 1, 3]):            # 5 6 7: a match of i = 1 at ts 2
        proc.push_event("s", {"id": "k", "a": a, "b": 0}, ts)
    proc.close()
    assert rows == [{"z1": 5, "z2": 6, "start_ts": 0, "ts": 2}]


@SETTINGS
@given(seed=st.integers(0, 10**6), max_delay=st.sampled_from([0, 2]), batch=st.sampled_from([1, 5]),
       jitter=st.sampled_from([0, 3]))
def test_correlations_of_one_shape_share_their_buffers_and_give_each_query_its_own_pairs(seed, max_delay, batch,
                                                                                       jitter):
    """In event-time order (jitter 0: every key's events found by bisection) and out of it."""
    shared, nodes = same_rows_shared_or_not(CORRELATIONS, LATER_CORRELATIONS,
                                            (stream(seed, 120, jitter=jitter), stream(seed + 7, 120, jitter=jitter)),
                                            max_delay, batch)
    assert any(shared.values())
    assert nodes.count("ep_correlate") == 2 and "join" not in nodes and "ep_group" not in nodes


def test_shared_correlations_resume_from_a_snapshot_as_if_never_stopped():
    """``ep_correlate``'s state (both sides' events, out-of-order ones included, and each query's
    start) restored into a new instance: the rest of the streams give the same rows."""
    from pescheduler.operators.ep_correlate import SharedCorrelations, split

    predicate = ep.left("a") - ep.right("b") == 1
    shape, left, right, constant, exact = split(predicate, lambda side, name: int)

    def make():
        op = SharedCorrelations(shape, left, right, constant, exact, {"q1": {"predicate": predicate, "within": 6}})
        op.open(OperatorContext("corr"))
        return op
    s, t = stream(3, 160, jitter=3), stream(4, 160, jitter=3)
    events = [(side, {**p, "ts": ts}) for i in range(160) for side, (p, ts) in ((0, s[i]), (1, t[i]))]

    def feed(op, part):
        out = []
        for side, e in part:
            emit = Emitter()
            op.process_input(side, [e], emit)
            op.on_watermark(e["ts"] - 4, emit)
            out += emit
        return out
    whole = make()
    later_q = {"predicate": ep.left("a") - ep.right("b") == 2, "within": 4}
    first = feed(whole, events[:150])
    whole.add_query("q2", later_q)
    rest = feed(whole, events[150:])
    stopped = make()
    assert feed(stopped, events[:150]) == first
    stopped.add_query("q2", later_q)
    state = stopped.snapshot()
    assert any(len(v) > 1 for side in ("left", "right") for v in state[side].values())
    resumed = make()
    resumed.add_query("q2", later_q)
    resumed.restore(state)
    assert feed(resumed, events[150:]) == rest
    assert {item[0] for item in rest} == {"q1", "q2"}


def test_a_processor_that_raises_on_one_pair_loses_only_that_pair():
    """A correlation's rows leave ``ep_correlate`` grouped per query and event (one item for the
    ``ep_output``): a processor raising on one row still gets the others of its group."""
    proc = ep.EventProcessor()
    for name in ("s", "t"):
        proc.register_stream(name, SCHEMA)
    proc.create_query("q", ep.Stream("s", window=ep.Tumbling(10)).correlate("t", ep.left("a") == ep.right("b")))
    seen = []

    def picky(row):
        if row["right"]["ts"] == 1:
            raise ValueError("not this one")
        seen.append(row["right"]["ts"])
    proc.add_output_processor("q", picky)
    assert [n.name for n in proc._nodes.values()] == ["ep_correlate", "ep_output"]
    proc.push_events("t", [({"id": "k", "a": 0, "b": 5}, ts) for ts in range(3)])
    proc.push_event("s", {"id": "k", "a": 5, "b": 0}, 3)
    proc.close()
    assert seen == [0, 2]
    (dead,) = proc.dead_letters()
    assert "not this one" in dead.error and dead.item["query"] == "q" and dead.item["row"]["right"]["ts"] == 1


def test_a_correlation_hands_its_output_the_partners_found_and_the_output_writes_the_rows():
    """``ep_correlate`` emits, per query and arriving event, the partners in the window and the
    event's row template; ``ep_output`` writes each row (the template with the partner set) as it
    hands it over. Two processors of a query each get every row, in arrival order."""
    proc = ep.EventProcessor()
    for name in ("s", "t"):
        proc.register_stream(name, SCHEMA)
    proc.create_query("q", ep.Stream("s", window=ep.Tumbling(10)).correlate("t", ep.left("a") == ep.right("b")))
    first, second = [], []
    proc.add_output_processor("q", first.append)
    proc.add_output_processor("q", second.append)
    op = next(n.op for n in proc._nodes.values() if n.name == "ep_correlate")
    t_events = [{"id": "k", "a": 0, "b": 5, "ts": ts} for ts in range(3)]
    proc.push_events("t", [({k: v for k, v in e.items() if k != "ts"}, e["ts"]) for e in t_events])
    proc.push_event("s", {"id": "k", "a": 5, "b": 0}, 4)
    assert first == second == [{"left": {"id": "k", "a": 5, "b": 0, "ts": 4}, "right": e, "ts": 4}
                               for e in t_events]
    emit = Emitter()
    op.process_input(0, [{"id": "k", "a": 5, "b": 1, "ts": 5}], emit)     # the item itself
    ((query_id, partners, template, field),) = emit
    assert (query_id, partners, field) == ("q", t_events, "right")
    assert template == {"left": {"id": "k", "a": 5, "b": 1, "ts": 5}, "right": None, "ts": 5}
    proc.close()


def test_a_correlation_that_keys_no_hash_join_stays_a_join_of_its_own():
    proc = ep.EventProcessor()
    for name in ("s", "t"):
        proc.register_stream(name, {"a": int, "x": float})
    proc.create_query("f", ep.Stream("s", window=ep.Tumbling(5)).correlate("t", ep.left("x") - ep.right("a") == 1))
    proc.create_query("g", ep.Stream("s", window=ep.Tumbling(5)).correlate("t", ep.left("a") < ep.right("a")))
    assert [n.name for n in proc._nodes.values()].count("ep_correlate") == 0
    proc.close()


@pytest.mark.parametrize("backend", ["memory", "disk"])
@SETTINGS
@given(seed=st.integers(0, 10**6), batch=st.sampled_from([1, 6]))
def test_event_windows_of_several_sizes_equal_their_own_over_windows(tmp_path_factory, backend, seed, batch):
    with in_backend(backend, tmp_path_factory):
        event_windows_of_several_sizes_equal_their_own_over_windows(seed, batch)


def event_windows_of_several_sizes_equal_their_own_over_windows(seed, batch):
    queries = {f"n{w}": ep.Stream("s", window=ep.Sliding(w, "event"), key="id").aggregate(
        {"n": "count", "s": ("sum", "a"), "m": ("avg", "b")}) for w in (3, 7, 12)}
    queries["lo"] = ep.Stream("s", window=ep.Sliding(5, "event"), key="id").aggregate({"lo": ("min", "a")})
    for w in (4, 9):                          # COUNT(*) lanes (the JEPC aggregation), keyed and not
        queries[f"c{w}"] = ep.Stream("s", window=ep.Sliding(w, "event"), key="id").aggregate({"n": "count", "m": "count"})
        queries[f"k{w}"] = ep.Stream("s", window=ep.Sliding(w, "event"), key="id").aggregate({"x": "count"})
        queries[f"u{w}"] = ep.Stream("s", window=ep.Sliding(w, "event")).aggregate({"n": "count"})
    shared, nodes = same_rows_shared_or_not(queries, {}, (stream(seed, 150), []), 2, batch)
    assert all(shared.values())
    assert nodes.count("ep_over") == 2


def test_the_in_process_engine_times_its_operators_without_a_system_call():
    """A PE's chain measures busy time on ``busy_clock`` (schedstat, a system call: the monitor and
    the policies size by it); the in-process engine's on ``perf_counter``, and still measures it."""
    import time

    from pescheduler.worker.busy import busy_clock
    from pescheduler.worker.chain import Chain

    assert Chain({}, []).clock is busy_clock
    proc = ep.EventProcessor()
    proc.register_stream("s", SCHEMA)
    proc.create_query("q", ep.Stream("s").filter(ep.col("a") == 1))
    proc.push_events("s", [({"id": "k", "a": 1, "b": 0}, ts) for ts in range(50)])
    chain = proc._chain
    assert chain.clock is time.perf_counter
    stats = next(n.stats for op_id, n in chain.nodes.items() if n.op.name == "ep_filter")
    assert stats.tuples_in == 50 and stats.busy_s > 0
    proc.close()


@pytest.mark.parametrize("backend", ["memory", "disk"])
def test_a_count_lane_that_a_folding_query_joins_and_leaves_keeps_counting(tmp_path_factory, backend):
    with in_backend(backend, tmp_path_factory):
        a_count_lane_that_a_folding_query_joins_and_leaves_keeps_counting(backend)


def a_count_lane_that_a_folding_query_joins_and_leaves_keeps_counting(backend):
    """A ``COUNT(*)`` lane keeps no fold (its count is its window's length); when a query asking a
    sum joins its size it folds, and when that query leaves it counts again: every row of the
    counting queries equals the count over its window throughout, and the sum query, new to the
    lane's plan, reports from its first event on for every key, the busy ones whose windows
    held events already included, each row the sum over its whole window (the lane folds the
    new aggregate from the events it keeps). Through ``ep`` a query created mid-stream gets an
    operator of its own (test_ep_providers), so this is ``ep_over``'s own ``add_query``."""
    lanes = OverLanes(key="id", lanes={4: {"c4": {"n": ("count", None)}}, 6: {"c6": {"n": ("count", None)}}})
    lanes.open(OperatorContext("lanes"))
    assert lanes._windows.backend == backend     # every lane's windows: one keyed state
    rnd = random.Random(7)
    # two keys, both busy throughout (a key never goes quiet for 4 ms, so its window never empties)
    events = [{"id": f"k{ts % 2}", "a": rnd.randrange(10), "ts": ts} for ts in range(90)]
    out = []
    for t in events:
        if t["ts"] == 30:
            lanes.add_query("sum4", 4, {"s": ("sum", "a")})
        if t["ts"] == 60:
            lanes.remove_query("sum4")
        emit = Emitter()
        lanes.process([t], emit)
        lanes.on_watermark(t["ts"], emit)
        out += emit
    rows = {q: [row for tag, row in out if tag == q] for q in ("c4", "c6", "sum4")}

    def window(row, size):
        return [e for e in events if e["id"] == row["id"] and row["window_end"] - size <= e["ts"] < row["window_end"]]
    assert len(rows["c4"]) == len(rows["c6"]) == 90
    for q, size in (("c4", 4), ("c6", 6)):
        assert all(row["n"] == len(window(row, size)) and row["window_start"] == row["window_end"] - size
                   for row in rows[q])
    assert [row["window_end"] - 1 for row in rows["sum4"]] == list(range(30, 60))
    assert all(row["s"] == sum(e["a"] for e in window(row, 4)) for row in rows["sum4"])


def test_released_gives_what_the_watermark_passed_by_time_arrival_order_within():
    from pescheduler.operators.window import released

    one, two, three = (5, "a"), (6, "b"), (5, "c")
    assert released([], 9) == ([], [])
    assert released([one], 5) == ([one], []) and released([one], 4) == ([], [one])
    assert released([one, two], 5) == ([one], [two])          # pushed one at a time: the usual hold
    assert released([two, one], 5) == ([one], [two])          # out of order: the scan
    assert released([two, one], 6) == ([one, two], [])        # sorted by time
    assert released([two, one, three], 5) == ([one, three], [two])   # arrival order within a time
    assert released([two, one, three], 6) == ([one, three, two], [])
    held = [two]
    ready, rest = released(held, 5)
    assert ready == [] and rest is held                       # nothing passed: the hold is kept
