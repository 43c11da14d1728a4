"""Routers: weighted shares (whole batches) and key-group ownership, on their own."""

from __future__ import annotations

import os
import subprocess
import sys
from collections import Counter

from pescheduler.plan.routing import KEY_GROUPS, Router, RouterTargets, even_key_groups, key_group


def collecting(n):
    got = [[] for _ in range(n)]
    return got, [got[i].append for i in range(n)]


def test_weighted_round_robin_gives_exact_shares_evenly_spaced():
    got, targets = collecting(3)
    router = Router(RouterTargets(("x", "x#1", "x#2"), (1, 2, 1)), targets)
    picks = []
    for b in range(8):
        before = [len(g) for g in got]
        router.send([b])
        picks.append(next(i for i in range(3) if len(got[i]) > before[i]))
    assert Counter(picks) == {0: 2, 1: 4, 2: 2}
    assert all(picks[i] != picks[i + 1] or picks[i] == 1 for i in range(7))    # spaced, not bunched
    assert router.tuples == [2, 4, 2]


def test_keyed_router_sends_each_key_to_the_owner_of_its_group():
    owners = even_key_groups(["x", "x#1"])
    spec = RouterTargets(("x", "x#1"), owners=tuple("x" if g in owners["x"] else "x#1"
                                                    for g in range(KEY_GROUPS)))
    got, targets = collecting(2)
    router = Router(spec, targets, key_field="key")
    batch = [{"key": f"car-{i % 50}", "n": i} for i in range(1000)]
    router.send(batch)
    for i, part in enumerate(got):
        for b in part:
            assert all(("x", "x#1")[i] == ("x" if key_group(t["key"]) in owners["x"] else "x#1") for t in b)
    assert sum(len(b) for part in got for b in part) == 1000
    assert all(got), "50 keys over 128 groups: both instances own some"


def test_key_group_is_stable_across_processes():
    """crc32, not hash(): routers and state splits in different processes agree on a str key."""
    code = "from pescheduler.plan.routing import key_group; print(key_group('car-0042'), key_group(('a', 1)))"
    seen = {subprocess.run([sys.executable, "-c", code], env={**os.environ, "PYTHONHASHSEED": seed},
                           capture_output=True, text=True, check=True, timeout=60).stdout
            for seed in ("1", "2")}
    assert seen == {f"{key_group('car-0042')} {key_group(('a', 1))}\n"}
    small = {key_group(k) for k in range(50)}
    assert len(small) > 30 and max(small) >= 64, "small int keys spread over the groups"


def test_an_arrow_batch_is_split_by_key_group_as_arrow_exactly_as_its_rows_would_be():
    """Issue 16: a copied keyed window fed columnar batches; the split stays Arrow (per-key order
    within each part kept) and sends every row where the row path would."""
    import pyarrow as pa

    owners = even_key_groups(["x", "x#1"])
    spec = RouterTargets(("x", "x#1"), owners=tuple("x" if g in owners["x"] else "x#1" for g in range(KEY_GROUPS)))
    rows = [{"car": f"car-{i * 7 % 50}", "n": i} for i in range(1000)]
    for batch in (pa.RecordBatch.from_pylist(rows),
                  pa.RecordBatch.from_arrays([pa.array([r["car"] for r in rows]).dictionary_encode(),
                                              pa.array([r["n"] for r in rows])], names=["car", "n"])):
        arrow, arrow_targets = collecting(2)
        plain, plain_targets = collecting(2)
        router = Router(spec, arrow_targets, key_field="car")
        router.send(batch)
        Router(spec, plain_targets, key_field="car").send(rows)
        assert all(isinstance(b, pa.RecordBatch) for part in arrow for b in part)
        assert [[r for b in part for r in b.to_pylist()] for part in arrow] == \
            [[r for b in part for r in b] for part in plain]
        assert router.tuples == [sum(len(b) for b in part) for part in plain] and all(router.tuples)
