"""Routers: weighted shares (whole batches) and key-group ownership, on their own."""

from __future__ import annotations

import os
import subprocess
import sys
from collections import Counter

from pescheduler.plan.routing import even_key_groups
from pescheduler.wire import KEY_GROUPS, RouterTargets, key_group
from pescheduler.worker.routing import Router


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
    code = "from pescheduler.wire import key_group; print(key_group('car-0042'), key_group(('a', 1)))"
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


# -- STATELESS copies: each batch to the instance with the most room (issue 15) -------------------

def credit_router(channels, fused=()):
    """A by-credit router over real sending ends (``ChannelOut``: credit, buffer, hold); the
    instances in ``fused`` run in the router's own PE (no channel)."""
    from pescheduler.worker.channels import ChannelOut

    outs = [None if i in fused else ChannelOut(f"c{i}", credits) for i, credits in enumerate(channels)]
    targets = [(lambda b, i=i: None) if outs[i] is None else outs[i].send for i in range(len(outs))]
    names = tuple(["x"] + [f"x#{i}" for i in range(1, len(outs))])
    router = Router(RouterTargets(names, (1,) * len(outs), by_credit=True), targets, channels=outs)
    return router, outs


def test_by_credit_each_batch_goes_to_the_instance_with_the_most_room():
    router, (slow, fast) = credit_router([8, 8])
    slow.gate.credits = 0                     # the original's receiver is starved: nothing comes back
    for b in range(6):
        router.send([b])
    assert router.tuples == [0, 6] and len(fast.pending) == 6
    fast.gate.credits = 0                     # now both are out of credit: the smaller backlog goes first
    for b in range(6):
        router.send([b])
    assert router.tuples == [6, 6] and slow.data_pending() == fast.data_pending() == 6


def test_by_credit_goes_in_turn_while_every_instance_has_room_and_a_full_ones_turn_goes_to_the_most_room():
    """bench/parallel.py: a copy on the source's own worker shares its event loop, so its channel
    shows little room during the source's turns; sending each batch to the most room sent nearly
    all of them to the remote original (one copy: 1.21x instead of 1.87x). Turns come first."""
    router, outs = credit_router([8, 8, 0], fused={2})
    picks = []

    def send(n):
        for b in range(n):
            before = list(router.tuples)
            router.send([b])
            picks.append(next(i for i in range(3) if router.tuples[i] > before[i]))

    send(6)
    assert picks == [0, 1, 2, 0, 1, 2], "room everywhere: weighted turns, the fused instance too"
    outs[0].gate.credits = 0                  # the original's receiver is starved
    send(6)
    assert picks[6:] == [1, 1, 2, 1, 1, 2], "its turns go to the channel with the most room"


def test_by_credit_a_held_channel_comes_last_and_never_counts_as_room():
    router, (held, live) = credit_router([8, 8])
    held.hold("m1")
    live.gate.credits = 0
    for b in range(3):
        router.send([b])
    assert router.tuples == [0, 3], "a backlog behind credit beats one behind a rewire"
    full = lambda c: c.full(2)                # noqa: E731  (out of credit, 2 batches buffered)
    assert router.room_besides(live, full) is False      # the held one does not relieve the live one
    assert router.room_besides(held, full) is False
    other, (a, b) = credit_router([8, 8])
    a.gate.credits = 0
    for n in range(3):
        a.send([n])
    assert other.room_besides(a, full) is True and other.room_besides(live, full) is None


def test_router_targets_route_by_credit_only_a_stateless_operator():
    from pescheduler.plan.routing import Route, router_targets

    route = Route(users={"x#1": ("up",)})
    assert router_targets("x", ["x#1"], route, "up", ["up"], stateless=True).by_credit
    assert not router_targets("x", ["x#1"], route, "up", ["up"]).by_credit          # MERGEABLE: weighted
    keyed = Route(key_groups=even_key_groups(["x", "x#1"]))
    spec = router_targets("x", ["x#1"], keyed, "up", ["up"], stateless=True)
    assert spec.owners and not spec.by_credit
    got, targets = collecting(2)
    router = Router(spec, targets, "key", channels=[None, None])
    assert router.channels is None            # keyed routing never goes by credit
