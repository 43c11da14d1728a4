"""Pattern semantics against a brute-force reference over every contiguous subsequence.

The reference enumerates, per key and start step, every choice of one event per
timestamp step and every reading of those events as symbols that the regular
expression accepts (within ``within``, predicates and ``do`` applied in order),
and keeps each distinct (events, output) once: what operators/pattern.py
documents. Patterns are chosen so that one match parses in several ways.
"""

import pickle
import re
from collections import Counter
from itertools import groupby, product

import pytest
from hypothesis import given, settings, strategies as st

from pescheduler.operator import MAX_WATERMARK, Emitter
from pescheduler.operators.pattern import Pattern
from pescheduler.state import key_group
from test_op_pattern import backend, opened  # noqa: F401 (the backend fixture)

PATTERNS = ["x (y | y)", "x y* y*", "(x | y) y+", "x? y+ x?", "(x y | x) y?", "x (y | x y)*", "x | y+"]
DEFINE = {"x": lambda e, m: e["a"] <= 2, "y": lambda e, m: e["a"] >= m.get("z", 0)}
DO = {"x": lambda e, m: {"z": e["a"], "ids": m.get("ids", ()) + (e["id"],)},
      "y": lambda e, m: {"ids": m.get("ids", ()) + (e["id"],)}}


def reference(events, pattern, within):
    rx = re.compile(pattern.replace(" ", ""))
    found = set()
    for _, mine in groupby(sorted(events, key=lambda e: e["k"]), key=lambda e: e["k"]):
        ordered = sorted(mine, key=lambda e: e["ts"])
        steps = [list(g) for _, g in groupby(ordered, key=lambda e: e["ts"])]
        for j in range(len(steps)):
            for end in range(j + 1, len(steps) + 1):
                if steps[end - 1][0]["ts"] - steps[j][0]["ts"] > within:
                    break
                for chosen in product(*steps[j:end]):
                    for word in product("xy", repeat=len(chosen)):
                        if not rx.fullmatch("".join(word)):
                            continue
                        m = {}
                        for e, s in zip(chosen, word):
                            if not DEFINE[s](e, m):
                                break
                            m = {**m, **DO[s](e, m)}
                        else:
                            result = {**m, "start_ts": chosen[0]["ts"], "ts": chosen[-1]["ts"]}
                            found.add(tuple(sorted(result.items())))
    return found


event = st.fixed_dictionaries({"k": st.integers(0, 1), "ts": st.integers(0, 6), "a": st.integers(0, 4)})


@settings(max_examples=150, deadline=None)
@given(st.lists(event, min_size=1, max_size=9), st.sampled_from(PATTERNS), st.integers(0, 4))
def test_each_distinct_match_is_reported_exactly_once(events, pattern, within):
    events = [{**e, "id": i} for i, e in enumerate(events)]
    op = Pattern(pattern, DEFINE, do=DO, within=within, key="k")
    out = Emitter()
    op.process(events, out)
    op.on_watermark(MAX_WATERMARK, out)
    got = Counter(tuple(sorted(r.items())) for r in out)
    assert set(got) == reference(events, pattern, within)
    assert all(n == 1 for n in got.values()), got


def test_the_issue_examples_report_one_match():
    for pattern, expected in (("x (y | y)", [(1, 2)]), ("x y* y*", [(1, 1), (1, 2)])):   # "x" alone too
        op = Pattern(pattern, {"x": lambda e, m: e["a"] == 0, "y": lambda e, m: e["a"] == 1})
        out = Emitter()
        op.process([{"a": 0, "ts": 1}, {"a": 1, "ts": 2}], out)
        op.on_watermark(MAX_WATERMARK, out)
        assert [(r["start_ts"], r["ts"]) for r in out] == expected, pattern


@pytest.mark.parametrize("move", ["snapshot", "export"])
def test_a_keyed_pattern_splits_into_copies_and_merges_back(backend, move):
    """Key groups move with their runs and waiting events, as a window's panes do: through a
    snapshot split and merged (a restore), or exported from a running instance and imported
    into another (a live Replicate and Release, pescheduler/worker/handover.py)."""
    define = {"x": lambda e, m: True, "y": lambda e, m: e["a"] > m["z"]}
    do = {"x": lambda e, m: {"z": e["a"]}}
    events = [{"k": k, "a": a, "ts": ts} for ts, (k, a) in enumerate([(0, 1), (1, 5), (0, 2), (1, 3), (0, 0)])]

    def fresh():
        return opened(Pattern("x y+", define, do=do, within=10, key="k"), backend)
    whole, out = fresh(), Emitter()
    whole.process(events, out)
    whole.on_watermark(2, out)
    state = pickle.loads(pickle.dumps(whole.snapshot()))
    parts = []
    if move == "snapshot":
        for owns in (lambda k: k == 0, lambda k: k == 1):
            part = fresh()
            part.restore(whole.split_state(state, owns))
            parts.append(part)
        merged = fresh()
        merged.restore(pickle.loads(pickle.dumps(whole.merge_states([p.snapshot() for p in parts]))))
    else:
        original, copy = fresh(), fresh()
        original.restore(state)
        copy.import_groups(pickle.loads(pickle.dumps(original.export_groups(frozenset([key_group(1)])))))
        assert set(original.runs()) == {0} and set(copy.runs()) == {1}
        parts = [original, copy]
        merged = fresh()
        merged.restore(state)
        other = fresh()
        other.restore(state)
        merged.export_groups(frozenset([key_group(1)]))
        merged.import_groups(pickle.loads(pickle.dumps(other.export_groups(frozenset([key_group(1)])))))
    rest = [{"k": 0, "a": 9, "ts": 5}, {"k": 1, "a": 9, "ts": 5}]
    split_out = Emitter()
    for part in parts:
        part.process(rest, split_out)
        part.on_watermark(MAX_WATERMARK, split_out)
    whole.process(rest, out)
    whole.on_watermark(MAX_WATERMARK, out)
    merged_out = Emitter()
    merged.process(rest, merged_out)
    merged.on_watermark(MAX_WATERMARK, merged_out)
    late = [r for r in out if r["ts"] > 2]
    assert sorted(map(str, split_out)) == sorted(map(str, late)) == sorted(map(str, merged_out)) and late
