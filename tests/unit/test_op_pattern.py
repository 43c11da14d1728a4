"""Pattern against a brute-force reference that enumerates matches with Python's ``re``."""

import pickle
import re
from collections import Counter
from functools import lru_cache
from itertools import product

import dask
import pytest
from hypothesis import given, settings, strategies as st

from pescheduler.operator import MIN_WATERMARK
from pescheduler.operator import MAX_WATERMARK, Emitter, OperatorContext
from pescheduler.operators.pattern import Pattern
from pescheduler.testing import run_operators


@pytest.fixture(params=["memory", "disk"], scope="module")
def backend(request, tmp_path_factory):
    """The backend an opened pattern keeps its runs in."""
    with dask.config.set({"pescheduler.state.backend": request.param,
                          "pescheduler.state.dir": str(tmp_path_factory.mktemp("state"))}):
        yield request.param


def opened(op, backend):
    """``op`` opened: its runs in ``backend``."""
    op.open(OperatorContext(op_id="pattern-1"))
    assert op._runs.backend == backend
    return op


def took(e, m, sym):
    return {"path": m.get("path", ()) + ((e["id"], sym),)}


# JEPC correlation: x starts, y continues x's value by +1, u continues y's by +1.
JEPC = dict(define={"x": lambda e, m: True,
                    "y": lambda e, m: e["a"] - m["z1"] == 1,
                    "u": lambda e, m: e["a"] - m.get("z2", m["z1"]) == 1},   # y? skipped: from x
            do={"x": lambda e, m: {**took(e, m, "x"), "z1": e["a"]},
                "y": lambda e, m: {**took(e, m, "y"), "z2": e["a"]},
                "u": lambda e, m: took(e, m, "u")})
# a rising run: y+ climbs by 1 each step from x, u ends it one higher or equal
TREND = dict(define={"x": lambda e, m: e["a"] <= 2,
                     "y": lambda e, m: e["a"] - m.get("z", e["a"] - 1) == 1,      # may start: (x | y)
                     "u": lambda e, m: e["a"] - m.get("z", e["a"]) in (0, 1)},
             do={s: (lambda s: lambda e, m: {**took(e, m, s), "z": e["a"]})(s) for s in "xyu"})
CASES = [("x y u", JEPC), ("x y+ u", TREND), ("x y* u?", TREND), ("(x | y) u+", TREND),
         ("x (y u)+", TREND), ("x y? u", JEPC)]


@lru_cache(maxsize=None)
def language(pattern, n):
    """Symbol strings of length <= n that match ``pattern`` (symbols are one letter here)."""
    rx = re.compile(pattern.replace(" ", ""))
    words = {"".join(w) for k in range(1, n + 1) for w in product("xyu", repeat=k) if rx.fullmatch("".join(w))}
    return words, {w[:i] for w in words for i in range(1, len(w) + 1)}


def reference(steps, pattern, spec, within):
    """Per watermark call: Counter of match paths, and late ids, by the documented semantics."""
    wm, kept, late_at, per_call = MIN_WATERMARK, [], {}, []
    for i, (kind, arg) in enumerate(steps):
        if kind == "W":
            wm = max(wm, arg)
            per_call.append(wm)
        else:
            for e in arg:
                if e["ts"] <= wm:
                    late_at.setdefault(i, []).append(e["id"])
                else:
                    kept.append(e)
    words, prefixes = language(pattern, within + 1)
    define, do = spec["define"], spec["do"]
    matches = []                                        # (last ts, path)
    for k in {e["k"] for e in kept}:
        stream = sorted((e for e in kept if e["k"] == k), key=lambda e: e["ts"])   # stable
        ts_steps = sorted({e["ts"] for e in stream})
        groups = [[e for e in stream if e["ts"] == t] for t in ts_steps]

        def dfs(j, m, word, start):
            if j == len(groups) or groups[j][0]["ts"] - start > within:
                return
            for e in groups[j]:
                for s in "xyu":
                    if word + s in prefixes and define[s](e, m):
                        m2 = {**m, **do[s](e, m)}
                        if word + s in words:
                            matches.append((e["ts"], m2["path"]))
                        dfs(j + 1, m2, word + s, start)

        for j in range(len(groups)):
            dfs(j, {}, "", groups[j][0]["ts"])
    expected, prev = [], MIN_WATERMARK
    for w in per_call:
        expected.append(Counter(p for ts, p in matches if prev < ts <= w))
        prev = max(prev, w)
    return expected, late_at


def run(op, steps):
    per_call, late_at = [], {}
    for i, (kind, arg) in enumerate(steps):
        emit = Emitter()
        if kind == "W":
            op.on_watermark(arg, emit)
            per_call.append(Counter(t["path"] for t in emit))
        else:
            op.process(arg, emit)
            assert not emit
            if emit.sides:
                late_at[i] = [t["id"] for t in emit.sides["late"]]
    return per_call, late_at


event = st.fixed_dictionaries({"k": st.integers(0, 1), "ts": st.integers(0, 12), "a": st.integers(0, 4)})
batch = st.tuples(st.just("E"), st.lists(event, min_size=1, max_size=6))
step = st.one_of(batch, batch, st.tuples(st.just("W"), st.integers(0, 3)))   # 2 batches : 1 watermark
scenario = st.tuples(st.lists(step, min_size=2, max_size=14), st.sampled_from(CASES), st.integers(0, 5))


def numbered(steps):
    out, n, wm = [], 0, -1
    for kind, arg in steps:
        if kind == "W":
            wm += arg
            out.append(("W", wm))
        else:
            out.append(("E", [{**e, "id": n + i} for i, e in enumerate(arg)]))
            n += len(arg)
    return out + [("W", MAX_WATERMARK)]


@settings(max_examples=200, deadline=None)
@given(case=scenario)
def test_pattern_equals_brute_force_reference(backend, case):
    steps, (pattern, spec), within = case
    steps = numbered(steps)
    op = opened(Pattern(pattern, within=within, key="k", **spec), backend)
    assert run(op, steps) == reference(steps, pattern, spec, within)
    assert op.runs() == {} and op.snapshot()["pending"] == []


@settings(max_examples=50, deadline=None)
@given(case=scenario, cut=st.integers(0, 20))
def test_snapshot_restore_mid_stream_equals_uninterrupted(backend, case, cut):
    steps, (pattern, spec), within = case
    steps = numbered(steps)
    cut = min(cut, len(steps))
    whole = run(Pattern(pattern, within=within, key="k", **spec), steps)
    first = opened(Pattern(pattern, within=within, key="k", **spec), backend)
    head = run(first, steps[:cut])
    second = opened(Pattern(pattern, within=within, key="k", **spec), backend)
    state = first.snapshot()
    second.restore(pickle.loads(pickle.dumps(state)))
    tail = run(second, steps[cut:])
    assert (head[0] + tail[0], {**head[1], **{i + cut: v for i, v in tail[1].items()}}) == whole


def test_jepc_pattern_through_the_chain_with_late_events():
    events = [{"k": "s", "ts": t, "a": a} for t, a in [(1, 5), (2, 6), (3, 7), (4, 9), (5, 10), (6, 11)]]
    events.append({"k": "s", "ts": 0, "a": 4})         # arrives after the watermark passed it
    op = Pattern("x y u", define=JEPC["define"],
                 do={"x": lambda e, m: {"z1": e["a"]}, "y": lambda e, m: {"z2": e["a"]}},
                 within=5, output=lambda m: {"start": m["z1"]})
    result = run_operators(events, op, batch_size=3, max_delay=0, key_field="k")
    assert result.output == [{"start": 5}, {"start": 9}]
    assert result.sides["late"] == [{"k": "s", "ts": 0, "a": 4}]


def test_equal_timestamps_are_alternatives_and_within_is_inclusive():
    define = {"x": lambda e, m: e["s"] == "x", "y": lambda e, m: e["s"] == "y"}
    out = Emitter()
    op = Pattern("x y", define=define, within=1)
    op.process([{"s": "x", "ts": 1}, {"s": "y", "ts": 2, "n": 1}, {"s": "y", "ts": 2, "n": 2},
                {"s": "x", "ts": 4}, {"s": "y", "ts": 4}], out)
    op.on_watermark(MAX_WATERMARK, out)
    assert [(t["start_ts"], t["ts"]) for t in out] == [(1, 2), (1, 2)]   # two alternatives, x@4 y@4 none
    out = Emitter()
    op = Pattern("x y", define=define, within=1)
    op.process([{"s": "x", "ts": 1}, {"s": "y", "ts": 3}], out)
    op.on_watermark(MAX_WATERMARK, out)
    assert out == []                                    # 2 ms apart, within 1


def test_open_ended_repetition_reports_every_extension_once():
    op, out = Pattern("x y+", define={"x": lambda e, m: e["a"] == 0, "y": lambda e, m: e["a"] == 1},
                      do={"y": lambda e, m: {"n": m.get("n", 0) + 1}}), Emitter()
    op.process([{"a": a, "ts": t} for t, a in enumerate([0, 1, 1, 1, 0])], out)
    op.on_watermark(10, out)
    assert [t["n"] for t in out] == [1, 2, 3]


def test_keying_parsing_and_guards():
    op = Pattern("x", define={"x": lambda e, m: True})
    assert op.parallelism.name == "SINGLETON"
    op.open(OperatorContext(op_id="pattern-1", key_field="k"))
    assert op.parallelism.name == "KEYED"
    for bad, err in [("x*", "empty"), ("x |", "empty"), ("(x y", "missing"), ("+x", "nothing"),
                     ("x z", "define"), ("x $", "unexpected")]:
        with pytest.raises(ValueError, match=err):
            Pattern(bad, define={"x": lambda e, m: True, "y": lambda e, m: True})
    with pytest.raises(ValueError, match="do="):
        Pattern("x", define={"x": lambda e, m: True}, do={"q": lambda e, m: {}})
    with pytest.raises(ValueError, match="symbols"):
        Pattern("y", define={"y": bool}).restore(op.snapshot())


def test_a_checkpoint_of_the_per_key_form_restores_split_and_merged(backend):
    """Before the runs lived in the keyed state backend a snapshot held ``runs`` by key: such a
    checkpoint still restores (and splits and merges, for copies)."""
    define = {"x": lambda e, m: e["a"] == 0, "y": lambda e, m: e["a"] == 1}

    def fresh():
        return Pattern("x y+", define, key="k")
    first, out = opened(fresh(), backend), Emitter()
    first.process([{"k": k, "a": 0, "ts": 1} for k in (0, 1)] + [{"k": 0, "a": 1, "ts": 3}], out)
    first.on_watermark(2, out)
    new = first.snapshot()
    old = {**{k: v for k, v in new.items() if k != "groups"}, "runs": first.runs()}
    second = fresh()
    second.restore(second.merge_states([second.split_state(old, lambda k, i=i: k == i) for i in (0, 1)]))
    opened(second, backend)
    assert second.runs() == first.runs() and set(first.runs()) == {0, 1}
    for op in (first, second):
        got = Emitter()
        op.process([{"k": 1, "a": 1, "ts": 4}], got)
        op.on_watermark(MAX_WATERMARK, got)
        assert sorted((r["start_ts"], r["ts"]) for r in got) == [(1, 3), (1, 4)]
