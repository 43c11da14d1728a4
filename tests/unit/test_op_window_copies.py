"""Every window kind's state splits by key and merges back: what moves when copies come and go."""

import pytest

from pescheduler.operator import MIN_WATERMARK
from pescheduler.operator import MAX_WATERMARK, OperatorContext
from pescheduler.operators.count_window import CountWindow
from pescheduler.operators.over_window import OverWindow
from pescheduler.operators.session import SessionWindow
from pescheduler.operators.window import Window
from pescheduler.wire import key_group
from test_op_window import AGGS, feed

EVENTS = [{"k": f"k{i % 7}", "v": i % 13, "ts": 3 * i - (i % 5)} for i in range(600)]
KINDS = {"window": lambda: Window(60, 20, AGGS), "session": lambda: SessionWindow(4, AGGS),
         "count": lambda: CountWindow(6, 3, AGGS), "over": lambda: OverWindow(30, AGGS),
         "shared": lambda: SessionWindow(4, queries={"a": {"n": "count"}, "b": {"m": ("avg", "v")}})}


def opened(window):
    window.open(OperatorContext("w", key_field="k"))
    return window


def run(windows_by_key, batches, state):
    """Feed each window the tuples of its own keys, as a keyed router would; all output, by key."""
    out = []
    for owns, window in windows_by_key:
        tail = feed(window, [[t for t in b if owns(t["k"])] for b in batches], list(state))
        window.on_watermark(MAX_WATERMARK, tail)
        out += tail
    return sorted(map(repr, out))


@pytest.mark.parametrize("kind", KINDS)
def test_split_in_two_then_merged_back_fires_what_one_instance_fires(kind):
    make = KINDS[kind]
    batches = [EVENTS[b:b + 10] for b in range(0, len(EVENTS), 10)]
    one = opened(make())
    state = [MIN_WATERMARK, MIN_WATERMARK]
    feed(one, batches[:30], state)            # what it emitted so far is not compared
    snap = one.snapshot()
    everything = run([(lambda k: True, one)], batches[30:], state)

    odd = lambda k: key_group(k) % 2 == 1      # copies own whole key groups (k1, k2 share one)
    even = lambda k: not odd(k)
    parts = [one.split_state(snap, owns) for owns in (odd, even)]
    halves = [opened(make()) for _ in parts]
    for half, part in zip(halves, parts):
        half.restore(part)
    assert run(list(zip((odd, even), halves)), batches[30:], state) == everything

    merged = opened(make())
    merged.restore(one.merge_states(parts))
    assert run([(lambda k: True, merged)], batches[30:], state) == everything
