"""operators/latest.py: the current row per key of a changelog; deletes and key changes retract."""

from __future__ import annotations

import pickle

from pescheduler.operators import Latest
from pescheduler.state import key_group
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
    assert op.rows() == {3: {"id": 3, "v": "c"}}


def test_a_tuple_that_is_not_a_change_is_dead_lettered_and_the_stream_goes_on():
    result = run_operators([{"id": 1, "after": {}, "ts": 0}, change("insert", 2, {"id": 2})], Latest(key="id"))
    assert [o["id"] for o in result.output] == [2]
    assert len(result.dead_letters) == 1 and "op must be one of" in result.dead_letters[0].error


def test_state_is_whole_key_groups_that_split_merge_and_move():
    op = Latest(key="id")
    op.restore({"rows": {k: {"id": k} for k in range(100)}})    # a checkpoint of the old form still restores
    state = op.snapshot()
    owns = lambda k: key_group(k) % 2 == 0                       # noqa: E731 - copies own whole groups
    halves = [op.split_state(state, lambda k, r=r: owns(k) == r) for r in (True, False)]
    assert op.merge_states(halves)["groups"].keys() == dict(state["groups"]).keys()
    even = Latest(key="id")
    even.restore(halves[0])
    assert sorted(even.rows()) and all(owns(k) for k in even.rows())
    moved = op.export_groups(frozenset(list(dict(state["groups"]))[:3]))
    target = Latest(key="id")
    target.import_groups(pickle.loads(pickle.dumps(moved)))
    assert set(target.rows()) | set(op.rows()) == set(range(100)) and not set(target.rows()) & set(op.rows())


def test_the_disk_backend_gives_what_memory_gives_and_its_snapshot_restores_in_memory(tmp_path):
    import dask

    memory = run_operators(CHANGES, Latest(), key_field="id").output
    with dask.config.set({"pescheduler.state.backend": "disk", "pescheduler.state.dir": str(tmp_path)}):
        op = Latest()
        out = run_operators(CHANGES, op, key_field="id").output
        assert op._rows.backend == "disk"
    assert out == memory
    again = Latest(key="id")
    again.restore(pickle.loads(pickle.dumps(op.snapshot())))
    assert again.rows() == {3: {"id": 3, "v": "c"}}


def test_on_disk_a_batch_reads_its_keys_in_one_multi_get_encoded_in_one_batch(tmp_path, monkeypatch):
    """``latest`` on ``disk`` reads a batch's keys up front in one ``get_many`` (the keys encoded
    together, their key groups in one numpy pass), not a ``get`` per change with ``key_group``
    per new key (a fifth of its reads at 10^6 keys), and gives what ``memory`` gives for the same
    batches: inserts, updates of held and new keys, key changes, deletes, a repeated key and a
    change that is not one (dead-lettered)."""
    import random

    import dask

    import pescheduler.state.disk as disk

    rng = random.Random(3)
    batches = []
    for b in range(4):
        batch = [change("insert", k, {"v": k}) for k in range(b * 500, b * 500 + 500)]
        batch += [change("update", rng.randrange(2000), {"v": -b}) for _ in range(100)]
        batch += [change("delete", rng.randrange(2000), before={"id": 0}) for _ in range(30)]
        batch += [change("update", 5000 + b, {"v": b}, before={"id": rng.randrange(b * 500 + 1)}),
                  {"id": 7, "ts": 0}, change("update", b, {"v": "again"})]
        rng.shuffle(batch)
        batches.append(batch)
    memory = run_operators([c for b in batches for c in b], Latest(), key_field="id")
    calls = {"get": 0, "key_group": 0}
    real_get, real_group = disk.DiskState.get, disk.key_group

    def counted_get(self, *a):
        calls["get"] += 1
        return real_get(self, *a)

    def counted_group(key):
        calls["key_group"] += 1
        return real_group(key)

    monkeypatch.setattr(disk.DiskState, "get", counted_get)
    monkeypatch.setattr(disk, "key_group", counted_group)
    with dask.config.set({"pescheduler.state.backend": "disk", "pescheduler.state.dir": str(tmp_path)}):
        op = Latest()
        out = run_operators([c for b in batches for c in b], op, key_field="id")
        assert op._rows.backend == "disk"
        rows = op.rows()
    changes = sum(map(len, batches))
    assert out.output == memory.output and len(out.dead_letters) == len(memory.dead_letters) == 4
    assert calls["get"] == 0 and calls["key_group"] < changes / 20, (calls, changes)
    assert rows == _rows_of(memory.output) and len(rows) > 1000


def _rows_of(output: list) -> dict:
    rows: dict = {}
    for o in output:
        if o["op"] == "upsert":
            rows[o["id"]] = o["row"]
        else:
            rows.pop(o["id"], None)
    return rows
