"""pescheduler.ep on every provider: every query kind against plain Python, schemas, sharing, lifecycle.

Each test taking ``provider`` runs on the native engine, sqlite, DuckDB and a
real PostgreSQL server (tests/unit/conftest.py); what only the native
engine has (its operator graph) is checked there alone.
"""

import random

import pytest

from pescheduler import ep
from pescheduler.operators.window import Window
from pescheduler.testing import run_operators

SCHEMA = {"id": str, "a": int, "b": float}


def processor(*streams, max_delay=0, provider="native"):
    proc = ep.EventProcessor(provider)
    for name in streams:
        proc.register_stream(name, SCHEMA, max_delay=max_delay)
    return proc


def collect(proc, query_id, definition):
    rows = []
    proc.create_query(query_id, definition)
    proc.add_output_processor(query_id, rows.append)
    return rows


def events(n=300, seed=3):
    rnd = random.Random(seed)
    return [({"id": f"s{rnd.randint(0, 2)}", "a": rnd.randint(0, 9), "b": float(rnd.randint(0, 9))}, i * 2)
            for i in range(n)]


def test_filter_aggregate_correlate_pattern_equal_plain_python(provider):
    proc = processor("s", "t", provider=provider)
    window = ep.Tumbling(20)
    filtered = collect(proc, "f", ep.Stream("s").filter(ep.col("a") - ep.col("b") == 1))
    counted = collect(proc, "n", ep.Stream("s", window=window, key="id").aggregate({"n": "count"}))
    pairs = collect(proc, "c", ep.Stream("s", window=window)
                    .correlate("t", ep.left("a") - ep.right("b") == 2))
    rising = collect(proc, "p", ep.Stream("s", window=window).pattern(
        "x y", {"x": True, "y": ep.col("a") - ep.measure("z") == 1}, do={"x": {"z": ep.col("a")}}))
    n = 300 if provider == "native" else 150
    s, t = events(n, seed=1), events(n, seed=2)
    for (ps, ts), (pt, tt) in zip(s, t):
        proc.push_event("s", ps, ts)
        proc.push_event("t", pt, tt)
    proc.close()
    es = [{**p, "ts": ts} for p, ts in s]
    et = [{**p, "ts": ts} for p, ts in t]
    assert filtered == [e for e in es if e["a"] - e["b"] == 1]
    expected = {}
    for e in es:
        key = (e["ts"] // 20 * 20, e["id"])
        expected[key] = expected.get(key, 0) + 1
    assert sorted((r["window_start"], r["id"], r["n"]) for r in counted) == \
        sorted((ws, k, n) for (ws, k), n in expected.items())
    assert sorted((p["left"]["ts"], p["right"]["ts"]) for p in pairs) == sorted(
        (l["ts"], r["ts"]) for l in es for r in et
        if abs(l["ts"] - r["ts"]) <= 20 and l["a"] - r["b"] == 2)
    assert [(m["start_ts"], m["ts"]) for m in rising] == [
        (x["ts"], y["ts"]) for x, y in zip(es, es[1:]) if y["a"] - x["a"] == 1]


def test_a_definition_may_be_a_generated_list_of_operator_objects():
    fluent = ep.Stream("s", window=ep.Sliding(20, 10)).filter(bool).aggregate({"m": ("avg", "a")})
    generated = ep.Definition([ep.Stream("s", window=ep.Sliding(20, 10)), ep.Filter(bool),
                               ep.Aggregate({"m": ("avg", "a")}), ep.Output()])
    assert generated.steps[:3] == fluent.steps
    with pytest.raises(ValueError, match="at most one of Aggregate"):
        ep.Definition([ep.Stream("s"), ep.Aggregate({}), ep.Filter(bool)])
    with pytest.raises(ValueError, match="starts with an ep.Stream"):
        ep.Definition([ep.Filter(bool)])


def test_session_and_count_windows_through_ep(provider):
    proc = processor("s", provider=provider)
    sessions = collect(proc, "s", ep.Stream("s", window=ep.Session(5), key="id").aggregate({"n": "count"}))
    counts = collect(proc, "c", ep.Stream("s", window=ep.CountWindow(3), key="id")
                     .aggregate({"hi": ("max", "a")}))
    for ts, a in [(0, 1), (3, 5), (9, 2), (10, 7), (11, 0)]:
        proc.push_event("s", {"id": "x", "a": a, "b": 0.0}, ts)
    proc.close()
    assert [(r["window_start"], r["window_end"], r["n"]) for r in sessions] == [(0, 8, 2), (9, 16, 3)]
    assert [(r["window_start"], r["window_end"], r["hi"]) for r in counts] == [(0, 10, 5)]


@pytest.mark.parametrize("payload, ts, message", [
    ({"id": "x", "a": "1", "b": 1.0}, 0, "field 'a' must be int, got str '1'"),
    ({"id": "x", "a": True, "b": 1.0}, 0, "field 'a' must be int, got bool"),
    ({"id": "x", "b": 1.0}, 0, r"field 'a' \(int\) is missing"),
    ({"id": "x", "a": 1, "b": 1.0, "c": 2}, 0, "unknown field 'c'"),
    ({"id": "x", "b": 1.0, "c": 2}, 0, r"field 'a' \(int\) is missing"),     # as many fields as the schema
    ({"id": "x", "a": None, "b": 1.0}, 0, "field 'a' must be int, got NoneType None"),
    ({"id": "x", "a": 1, "b": 1.0}, "0", "'ts' must be int"),
    ([1, 2], 0, "an event is a dict of {id: str, a: int, b: float}"),
])
def test_a_bad_event_raises_naming_the_field_and_changes_nothing(payload, ts, message, provider):
    proc = processor("s", provider=provider)
    rows = collect(proc, "q", ep.Stream("s", window=ep.Tumbling(10)).aggregate({"s": ("sum", "b")}))
    proc.push_event("s", {"id": "x", "a": 1, "b": 2}, 1)           # an int is a float
    with pytest.raises(ep.SchemaError, match=message):
        proc.push_event("s", payload, ts)
    with pytest.raises(ep.SchemaError, match="event 1: .*no event of this call was processed"):
        proc.push_events("s", [({"id": "x", "a": 1, "b": 4.0}, 2), (payload, ts)])
    proc.push_event("s", {"id": "y", "a": 1, "b": 3.0}, 5)
    proc.close()
    assert rows == [{"window_start": 0, "window_end": 10, "s": 5}]
    assert proc.dead_letters() == []


def test_queries_on_one_stream_and_window_share_one_operator_and_come_and_go(provider):
    native = provider == "native"
    proc = processor("s", provider=provider)
    window = ep.Sliding(40, 10)
    spec = {"all": {"m": ("avg", "a"), "sd": ("stddev", "a")}, "mean": {"m": ("avg", "a")},
            "late": {"v": ("var", "a"), "lo": ("min", "b")}}
    rows = {q: collect(proc, q, ep.Stream("s", window=window, key="id").aggregate(spec[q]))
            for q in ("all", "mean")}
    shared = [n for n in proc._nodes.values() if isinstance(n.op, Window)] if native else []
    assert not native or len(shared) == 1 and shared[0].op.plan.layout == ("sum(a)", "count(None)", "sumsq(a)")
    stream = events(400)
    for i, (payload, ts) in enumerate(stream):
        if i == 150:
            proc.remove_query("all")
            rows["late"] = collect(proc, "late", ep.Stream("s", window=window, key="id")
                                   .aggregate(spec["late"]))
        proc.push_event("s", payload, ts)
    proc.close()
    # "all" left: what only it read is freed; "late", created mid-stream, has a window of its
    # own (it computes over the events pushed after it, as on a database), so the shared one is
    # unchanged, and reports only the windows it saw whole (docs/operators.md)
    windows = [n for n in proc._nodes.values() if isinstance(n.op, Window)] if native else []
    assert not native or shared[0].op.plan.layout == ("sum(a)", "count(None)") and len(windows) == 2

    def alone(q, start=0):
        return run_operators([{**p, "ts": ts} for p, ts in stream[start:]],
                             Window(40, 10, aggregates=spec[q], key="id"), batch_size=1, max_delay=0).output
    assert rows["mean"] == alone("mean")                           # exact across the changes
    assert rows["all"] == alone("all")[:len(rows["all"])] and rows["all"]
    newest = max(ts for _, ts in stream[:150])
    assert rows["late"] == [r for r in alone("late") if r["window_start"] > newest] and rows["late"]


def test_output_processors_come_and_go_and_a_failing_one_disturbs_nothing(provider):
    proc = processor("s", provider=provider)
    first, second = [], []
    proc.create_query("q", ep.Stream("s").filter(ep.col("a") > 0))
    proc.add_output_processor("q", first.append)
    proc.add_output_processor("q", lambda row: 1 / 0)
    proc.push_event("s", {"id": "x", "a": 1, "b": 0.0}, 0)
    proc.add_output_processor("q", second.append)
    proc.remove_output_processor("q", first.append)
    proc.push_event("s", {"id": "x", "a": 2, "b": 0.0}, 1)
    assert [r["a"] for r in first] == [1] and [r["a"] for r in second] == [2]
    dead = proc.dead_letters()
    assert len(dead) == 2 and "ZeroDivisionError" in dead[0].error and dead[0].item["query"] == "q"
    with pytest.raises(ValueError, match="not an output processor"):
        proc.remove_output_processor("q", first.append)


def test_late_events_lifecycle_errors_and_the_module_functions(provider):
    proc = processor("s", max_delay=5, provider=provider)
    rows = collect(proc, "q", ep.Stream("s", window=ep.Tumbling(10)).aggregate({"n": "count"}))
    for ts in (0, 30, 12, 26):               # watermark 24 after ts 30: 12 is late, 26 is not
        proc.push_event("s", {"id": "x", "a": 1, "b": 0.0}, ts)
    assert [e["ts"] for e in proc.late("q")] == [12]
    with pytest.raises(ValueError, match="read by queries \\['q'\\]"):
        proc.remove_stream("s")
    with pytest.raises(KeyError, match="unknown stream 'nope'"):
        proc.push_event("nope", {}, 0)
    with pytest.raises(ValueError, match="exists already"):
        proc.create_query("q", ep.Stream("s"))
    with pytest.raises(ValueError, match="an aggregate needs a window"):
        proc.create_query("bad", ep.Stream("s").aggregate({"n": "count"}))
    assert "bad" not in proc._processors
    assert provider != "native" or len(proc._nodes) == 2
    proc.remove_query("q")                   # its open windows go with it
    proc.remove_stream("s")
    proc.close()
    assert [(r["window_start"], r["n"]) for r in rows] == [(0, 1)]
    with pytest.raises(RuntimeError, match="closed"):
        proc.register_stream("s", SCHEMA)
    seen = []
    ep.register_stream("module-level", SCHEMA)
    ep.create_query("module-q", ep.Stream("module-level"))
    ep.add_output_processor("module-q", seen.append)
    ep.push_event("module-level", {"id": "x", "a": 1, "b": 0.0}, 7)
    ep.remove_output_processor("module-q", seen.append)
    ep.remove_query("module-q")
    ep.remove_stream("module-level")
    assert seen == [{"id": "x", "a": 1, "b": 0.0, "ts": 7}]


def test_application_has_the_same_operators_with_a_schema_check_per_stream(provider):
    proc = processor("s", "t", provider=provider)
    proc.create_query("m", ep.Stream("s", window=ep.Tumbling(10)).aggregate({"m": ("avg", "a")}))
    proc.create_query("m2", ep.Stream("s", window=ep.Tumbling(10)).aggregate({"n": "count"}))
    proc.create_query("c", ep.Stream("s", window=ep.Tumbling(10)).correlate("t"))
    app = proc.application("ep-app", {"s": [({"id": "x", "a": 1, "b": 0.0}, 0)], "t": ("jsonl", {"path": "t.jsonl"})})
    names = {op_id: node.name for op_id, node in app.nodes.items()}
    assert names == {"stream.s.source": "iterable", "stream.s": "ep_schema", "stream.t.source": "jsonl",
                     "stream.t": "ep_schema", "window1.s": "window", "window1.s.out": "ep_output",
                     "ep_group2.s+t": "ep_group", "ep_group2.s+t.out": "ep_output"}
    assert app.nodes["window1.s"].params["queries"] == {"m": {"m": ("avg", "a")}, "m2": {"n": "count"}}
    assert app.nodes["ep_group2.s+t"].inputs == [("stream.s", "out"), ("stream.t", "out")]
    assert [name for name, _ in app.nodes["ep_group2.s+t"].params["members"]["c"]["ops"]] == ["join"]
    with pytest.raises(ValueError, match="no source for stream 't'"):
        proc.application("ep-app", {"s": []})


def test_unshared_processor_gives_each_query_its_own_window_and_the_same_results():
    runs = {}
    for share in (True, False):
        proc = ep.EventProcessor(share=share)
        proc.register_stream("s", SCHEMA)
        rows = [collect(proc, q, ep.Stream("s", window=ep.Sliding(30, "event"), key="id")
                        .aggregate({"m": ("avg", "a"), "sd": ("stddev", "b")})) for q in range(3)]
        windows = [n for n in proc._nodes.values() if n.name == "over_window"]
        lanes = [lane for n in proc._nodes.values() if n.name == "ep_over" for lane in n.op.lanes.values()]
        assert (len(lanes), len(windows)) == ((1, 0) if share else (0, 3))
        for payload, ts in events(200):
            proc.push_event("s", payload, ts)
        proc.close()
        runs[share] = rows
    assert runs[True] == runs[False] and all(runs[True])


def test_correlate_with_keys_equals_the_same_predicate_tested_on_every_pair(provider):
    runs = []
    for keyed in (False, True):
        proc = processor("s", "t", provider=provider)
        spec = (ep.Correlate("t", left_key=ep.col("a") - 2, right_key="b") if keyed else
                ep.Correlate("t", ep.left("a") - ep.right("b") == 2))
        rows = collect(proc, "c", ep.Definition([ep.Stream("s", window=ep.Tumbling(20)), spec]))
        n = 300 if provider == "native" else 100          # a database: fewer statements, same coverage
        for (ps, ts), (pt, tt) in zip(events(n, seed=1), events(n, seed=2)):
            proc.push_event("s", ps, ts)
            proc.push_event("t", {**pt, "b": float(int(pt["b"]))}, tt)
        proc.close()
        runs.append(sorted((r["left"]["ts"], r["right"]["ts"]) for r in rows))
    assert runs[0] == runs[1] and runs[0]


def test_equal_keys_are_derived_only_where_moving_a_term_across_equals_is_exact():
    from pescheduler.joinkeys import equi_keys

    ints = {("left", "a"): int, ("right", "b"): int, ("left", "x"): float}
    types = lambda side, name: ints.get((side, name))          # noqa: E731
    keys = equi_keys((ep.left("a") - ep.right("b") == 2) & (ep.left("a") > 0), types)
    assert keys is not None and keys[0]({"a": 5}) == keys[1]({"b": 3}) == 3
    assert equi_keys(ep.left("a") + 1 == ep.right("b") * 2, types)[1]({"b": 4}) == 8
    for not_exact in (ep.left("x") - ep.right("b") == 2,        # a float field: rounding
                      ep.left("a") / 2 == ep.right("b"),        # division
                      ep.left("a") - ep.right("b") == 2.0,      # a float literal
                      ep.left("a") - ep.right("b") > 2,         # not an equation
                      ep.left("a") * ep.right("b") == 2):       # a term reading both sides
        assert equi_keys(not_exact, types) is None, not_exact
