"""operators/changelog_aggregate.py: grouped aggregates over latest()'s changes retract updates and deletes."""

from __future__ import annotations

import pickle
import random

import pytest

from pescheduler import Application
from pescheduler.operators import ChangelogAggregate, ChangelogSplit, Latest
from pescheduler.state import key_group
from pescheduler.testing import run_graph, run_operators

AGGS = {"n": "count", "total": ("sum", "qty"), "mean": ("avg", "qty"),
        "lo": ("min", "qty"), "hi": ("max", "qty")}


pytestmark = pytest.mark.usefixtures("backend")     # every test on both keyed state backends (conftest)


def random_changes(seed: int, n: int = 2_000) -> list[dict]:
    """Inserts, updates (some moving a row to another region) and deletes of 60 ids."""
    rng, live, changes = random.Random(seed), set(), []
    for ts in range(n):
        k = rng.randrange(60)
        row = {"id": k, "region": rng.choice("abcd"), "qty": rng.randrange(-5, 50)}
        if k in live and rng.random() < 0.3:
            live.discard(k)
            changes.append({"op": "delete", "id": k, "before": {"id": k}, "after": None, "ts": ts})
        else:
            changes.append({"op": "update" if k in live else "insert", "id": k, "after": row, "ts": ts})
            live.add(k)
    return changes


def reference(changes: list[dict]) -> dict:
    """Plain Python: the table's current rows, grouped and aggregated from scratch."""
    rows: dict = {}
    for c in changes:
        if c["op"] == "delete":
            rows.pop(c["id"], None)
        else:
            rows[c["id"]] = c["after"]
    groups: dict = {}
    for r in rows.values():
        groups.setdefault(r["region"], []).append(r["qty"])
    return {g: {"n": len(q), "total": sum(q), "mean": sum(q) / len(q), "lo": min(q), "hi": max(q)}
            for g, q in groups.items()}


def current(results: list[dict]) -> dict:
    """The aggregate's changelog folded into its current rows per region."""
    state: dict = {}
    for r in results:
        if r["op"] == "delete":
            state.pop(r["region"])          # a delete of a group never emitted would raise here
        else:
            state[r["region"]] = {k: v for k, v in r.items() if k not in ("op", "region", "version")}
    return state


def aggregate_ops() -> tuple:
    return Latest(), ChangelogSplit("region"), ChangelogAggregate("region", AGGS)


@pytest.mark.parametrize("seed", [1, 2, 3])
@pytest.mark.parametrize("batch_size", [1, 7, 1000])
def test_the_aggregate_of_the_current_rows_matches_a_from_scratch_reference(seed, batch_size):
    changes = random_changes(seed)
    out = run_operators(changes, *aggregate_ops(), key_field="id", batch_size=batch_size).output
    assert current(out) == reference(changes) and current(out)


def test_an_update_that_moves_a_row_retracts_it_from_its_old_group_and_a_delete_empties_a_group():
    changes = [{"op": "insert", "id": 1, "after": {"id": 1, "region": "a", "qty": 5}, "ts": 0},
               {"op": "insert", "id": 2, "after": {"id": 2, "region": "a", "qty": 9}, "ts": 1},
               {"op": "update", "id": 1, "after": {"id": 1, "region": "b", "qty": 7}, "ts": 2},
               {"op": "delete", "id": 2, "before": {"id": 2}, "after": None, "ts": 3}]
    out = run_operators(changes, *aggregate_ops(), key_field="id", batch_size=1).output
    assert [(r["op"], r["region"], r["version"], r["total"], r["hi"]) for r in out] == [
        ("upsert", "a", 1, 5, 5), ("upsert", "a", 2, 14, 9),
        ("upsert", "a", 3, 9, 9), ("upsert", "b", 1, 7, 7),      # 5 left a: its max falls back to 9
        ("delete", "a", 4, None, None)]


def test_through_the_stream_api_three_lines():
    app = Application("cdc-agg")
    changes = random_changes(4, 500)
    cdc = app.source("iterable", items=changes)
    totals = cdc.key_by("id").latest().aggregate(AGGS, by="region")
    assert current(run_graph(totals).output) == reference(changes)
    keyed = cdc.key_by("id").latest().key_by("region").aggregate(AGGS)      # by= from the key_by before it
    assert current(run_graph(keyed).output) == reference(changes)


def test_a_row_that_cannot_be_aggregated_is_dead_lettered_and_its_retraction_too_so_nothing_drifts():
    changes = [{"op": "insert", "id": 1, "after": {"id": 1, "region": "a", "qty": None}, "ts": 0},
               {"op": "insert", "id": 2, "after": {"id": 2, "region": "a", "qty": 3}, "ts": 1},
               {"op": "update", "id": 1, "after": {"id": 1, "region": "a", "qty": 4}, "ts": 2},
               {"op": "upsert", "id": 3, "ts": 3}]
    result = run_operators(changes, *aggregate_ops(), key_field="id", batch_size=1)
    assert current(result.output) == {"a": {"n": 2, "total": 7, "mean": 3.5, "lo": 3, "hi": 4}}
    assert len(result.dead_letters) == 3     # the None row, its retraction, the op latest does not know


def test_aggregates_that_cannot_retract_are_refused_by_name():
    with pytest.raises(ValueError, match=r"first\(qty\) cannot take a row back out"):
        ChangelogAggregate("region", {"f": ("first", "qty")})


def test_state_checkpoints_splits_and_merges_by_group():
    changes = random_changes(5, 300)
    ops = aggregate_ops()
    first = run_operators(changes, *ops, key_field="id").output
    agg = ops[2]
    state = pickle.loads(pickle.dumps(agg.snapshot()))
    halves = [agg.split_state(state, lambda g, r=r: g in "ab" if r else g not in "ab") for r in (0, 1)]
    assert agg.merge_states(halves)["groups"] == state["groups"]
    assert sorted(halves[0]["groups"]) == sorted(key_group(g) for g in "cd")     # whole key groups
    again = ChangelogAggregate("region", AGGS)
    again.restore(state)
    more = [{"op": "delete", "id": k, "before": {"id": k}, "after": None, "ts": 0} for k in range(60)]
    latest = Latest()
    latest.restore(ops[0].snapshot())
    out = run_operators(more, latest, ChangelogSplit("region"), again, key_field="id").output
    assert current(first + out) == {} and {r["op"] for r in out} == {"delete"}
    assert sorted(r["region"] for r in out) == sorted(current(first))


def test_the_groups_are_in_the_backend_and_move_as_key_groups_to_another_instance(backend):
    """A rescale's hand-over (pescheduler/worker/handover.py): the groups of some key groups leave
    with their aggregates and versions, the next changes of both halves continue them exactly."""
    changes = random_changes(6, 600)
    head, tail = changes[:400], changes[400:]
    ops = aggregate_ops()
    out = run_operators(head, *ops, key_field="id", batch_size=50).output
    agg = ops[2]
    assert agg._groups.backend == backend and len(agg._groups) == len(current(out))
    moving = frozenset(key_group(g) for g in "ac")
    latest = Latest()
    latest.restore(ops[0].snapshot())
    split = run_operators(tail, latest, ChangelogSplit("region"), key_field="id", batch_size=50).output
    out += run_operators(split[:100], agg, batch_size=50, ts_field=None).output   # turns before the export
    part = pickle.loads(pickle.dumps(agg.export_groups(moving)))
    copy = ChangelogAggregate("region", AGGS)
    run_operators([], copy)                     # opened in the backend, then given the groups
    copy.import_groups(part)
    assert sorted(g for g, _ in copy._groups.items(key_group("a"))) == ["a"]
    for instance, mine in ((agg, lambda g: key_group(g) not in moving), (copy, lambda g: key_group(g) in moving)):
        rows = [r for r in split[100:] if mine(r["region"])]
        out += run_operators(rows, instance, batch_size=50, ts_field=None).output
    assert current(out) == reference(changes)
    versions = {}
    for r in out:
        assert r["version"] == versions.get(r["region"], 0) + 1      # versions go on where they were
        versions[r["region"]] = r["version"]


def test_a_checkpoint_taken_while_the_groups_were_dicts_still_restores_split_and_merged():
    """Before the groups lived in the keyed state backend a snapshot held ``groups`` as ``{group:
    [n, slots, multisets]}`` and ``versions``; such a checkpoint restores, and splits by key group."""
    old = {"aggregates": {"n": "count", "total": ("sum", "qty")},
           "versions": {"a": 3, "b": 2, "gone": 5},
           "groups": {"a": [2, [2, 9], {}], "b": [1, [1, 4], {}]}}
    halves = [ChangelogAggregate("region", old["aggregates"]).split_state(old, lambda g, r=r: (g == "a") == r)
              for r in (True, False)]
    assert sorted(halves[0]["groups"]) == [key_group("a")]                   # as whole key groups
    agg = ChangelogAggregate("region", old["aggregates"])
    agg.restore(agg.merge_states(halves))
    rows = [{"sign": 1, "region": g, "row": {"region": g, "qty": 1}} for g in ("a", "b", "gone")]
    out = run_operators(rows, agg, ts_field=None).output
    assert [(r["region"], r["version"], r["n"], r["total"]) for r in out] == [
        ("a", 4, 3, 10), ("b", 3, 2, 5), ("gone", 6, 1, 1)]
