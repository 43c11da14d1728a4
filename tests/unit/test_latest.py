"""operators/latest.py: the current row per key of a changelog; deletes and key changes retract."""

from __future__ import annotations

from pescheduler.operators import Latest
from pescheduler.testing import run_operators


def change(op, key, after=None, before=None) -> dict:
    return {"op": op, "id": key, "after": after, **({"before": before} if before else {}), "ts": 0}


CHANGES = [change("insert", 1, {"id": 1, "v": "a"}), change("insert", 2, {"id": 2, "v": "b"}),
           change("update", 1, {"id": 1, "v": "c"}), change("delete", 2, before={"id": 2}),
           change("delete", 9, before={"id": 9}),
           change("update", 3, {"id": 3, "v": "c"}, before={"id": 1})]


def test_upserts_and_deletes_carry_the_row_they_replaced_and_the_state_is_the_current_rows():
    op = Latest()
    out = run_operators(CHANGES, op, key_field="id").output
    assert [(o["op"], o["id"], o["row"], o["previous"]) for o in out] == [
        ("upsert", 1, {"id": 1, "v": "a"}, None), ("upsert", 2, {"id": 2, "v": "b"}, None),
        ("upsert", 1, {"id": 1, "v": "c"}, {"id": 1, "v": "a"}), ("delete", 2, None, {"id": 2, "v": "b"}),
        ("delete", 1, None, {"id": 1, "v": "c"}), ("upsert", 3, {"id": 3, "v": "c"}, None)]  # 9: never held
    assert op.snapshot() == {"rows": {3: {"id": 3, "v": "c"}}}


def test_a_tuple_that_is_not_a_change_is_dead_lettered_and_the_stream_goes_on():
    result = run_operators([{"id": 1, "after": {}, "ts": 0}, change("insert", 2, {"id": 2})], Latest(key="id"))
    assert [o["id"] for o in result.output] == [2]
    assert len(result.dead_letters) == 1 and "op must be one of" in result.dead_letters[0].error


def test_state_splits_by_key_and_merges_back():
    op = Latest(key="id")
    state = {"rows": {k: {"id": k} for k in range(10)}}
    halves = [op.split_state(state, lambda k, r=r: k % 2 == r) for r in (0, 1)]
    assert sorted(halves[1]["rows"]) == [1, 3, 5, 7, 9]
    assert op.merge_states(halves) == state
    op.restore(halves[0])
    assert op.snapshot() == halves[0]
