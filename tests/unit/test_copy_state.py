"""Keyed state split by key group and merged back: what moves when copies come and go."""

from __future__ import annotations


from pescheduler import Emitter
from pescheduler.operator import OperatorContext
from pescheduler.plugins import load_plugins
from pescheduler.wire import key_group
from pescheduler.testing import run_operators

EVENTS = [{"car": f"car-{i % 37}", "speed": float(i % 90), "ts": i * 250} for i in range(2000)]


def window(**params):
    cls = load_plugins().operator("window")
    op = cls(size="10s", aggregates={"avg": ("avg", "speed"), "n": ("count", "speed")}, **params)
    op.open(OperatorContext(op_id="window-1", key_field="car"))
    return op


def fired(op, events, upto):

    op.process(events, Emitter())
    out = Emitter()
    op.on_watermark(upto, out)
    return out


def test_window_state_split_in_two_fires_exactly_what_one_instance_fires():
    whole = window()
    expected = fired(whole, EVENTS[:1500], 200_000)
    one, left, right = window(), window(), window()
    one.process(EVENTS[:1500], Emitter())
    state = one.snapshot()
    mine = {g for g in range(128) if g % 2}
    left.restore(one.split_state(state, lambda k: key_group(k) in mine))
    right.restore(one.split_state(state, lambda k: key_group(k) not in mine))
    got = list(fired(left, [], 200_000)) + list(fired(right, [], 200_000))
    key = lambda r: (r["window_start"], r["car"])
    assert sorted(got, key=key) == sorted(expected, key=key) and got


def test_window_merge_of_splits_is_the_original_state():
    op = window()
    op.process(EVENTS, Emitter())
    state = op.snapshot()
    parts = [op.split_state(state, lambda k, r=r: key_group(k) % 3 == r) for r in range(3)]
    merged = op.merge_states(parts)
    assert merged["groups"] == state["groups"] and merged["watermark"] == state["watermark"]


def test_join_state_splits_and_merges_by_key():
    join = load_plugins().operator("join")
    op = join(within="5s", on="car")
    state = {"within": op.within, "watermark": 7, "left": {"a": [1], "b": [2]}, "right": {"b": [3]}}
    parts = [op.split_state(state, lambda k, want=want: k == want) for want in ("a", "b")]
    assert parts[0]["left"] == {"a": [1]} and parts[1]["right"] == {"b": [3]}
    assert op.merge_states(parts) == state


def test_window_split_asks_about_key_groups_not_keys():
    """A rescale's split of a time window picks whole key groups: owns() is asked once per group."""
    op = window()
    op.process([{"car": f"car-{i}", "speed": 1.0, "ts": 0} for i in range(1000)], Emitter())
    state = op.snapshot()
    asked = []
    part = op.split_state(state, lambda k: asked.append(k) or key_group(k) % 2 == 0)
    assert 0 < len(asked) <= 128
    assert part["groups"] and all(g % 2 == 0 for g in part["groups"])
