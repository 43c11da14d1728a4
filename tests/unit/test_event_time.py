"""Event time on sources: ts_field (name or callable), ts_unit, datetimes and ISO strings, and bad
event times as dead letters that never cost a valid window (pescheduler/eventtime.py, the driver)."""

import math
from datetime import datetime, timezone

import pytest

from pescheduler.eventtime import BadEventTime, EventTime
from pescheduler.operator import OperatorContext
from pescheduler.operators.sources import IterableSource
from pescheduler.plugins import load_plugins
from pescheduler.testing import run_operators

T0 = 1_700_000_000_000


def window():
    op = load_plugins().operator("window")(size="1s", aggregates={"n": ("count", "v")})
    op.open(OperatorContext(op_id="window-1", key_field="k"))
    return op


@pytest.mark.parametrize("unit,value", [("ms", T0), ("s", T0 / 1000), ("us", T0 * 1000), ("ns", T0 * 10**6)])
def test_every_unit_is_normalised_to_milliseconds(unit, value):
    assert EventTime("t", unit).millis({"t": value}) == T0


def test_datetimes_and_iso_strings_carry_their_own_unit():
    when = datetime.fromtimestamp(T0 / 1000, timezone.utc)
    assert EventTime("t", "s").millis({"t": when}) == T0
    assert EventTime("t").millis({"t": when.isoformat()}) == T0
    assert EventTime("t").millis({"t": "2023-11-14T22:13:20Z"}) == T0


@pytest.mark.parametrize("event", [{}, {"ts": None}, {"ts": "late"}, {"ts": math.nan}, {"ts": math.inf},
                                   {"ts": -math.inf}, {"ts": True}, {"ts": [1]}])
def test_missing_none_text_nan_and_infinite_times_are_refused_with_the_reason(event):
    with pytest.raises(BadEventTime, match="event time"):
        EventTime("ts").millis(event)


def test_a_bad_unit_or_field_is_refused_when_the_app_is_built():
    with pytest.raises(ValueError, match="ts_unit must be one of ms, s, us, ns"):
        IterableSource(items=[], ts_unit="minutes")
    with pytest.raises(ValueError, match="ts_field must be"):
        IterableSource(items=[], ts_field=3)


def test_a_nan_time_is_a_dead_letter_and_every_valid_window_is_kept():
    """Issue 31 item 7: one NaN among 18 events silently dropped 9 rows' windows."""
    events = [{"k": "a", "v": i, "ts": T0 + i * 500} for i in range(18)]
    events.insert(5, {"k": "a", "v": 99, "ts": math.nan})
    result = run_operators(events, window(), key_field="k")
    assert sum(row["n"] for row in result.output) == 18
    assert len(result.dead_letters) == 1 and "nan" in result.dead_letters[0].error
    assert result.dead_letters[0].item["v"] == 99


def test_missing_none_and_text_times_are_dead_letters_and_the_stream_goes_on():
    events = [{"k": "a", "v": i, "ts": T0 + i * 500} for i in range(10)]
    events[2:2] = [{"k": "a", "v": -1}, {"k": "a", "v": -2, "ts": None}, {"k": "a", "v": -3, "ts": "noon"}]
    result = run_operators(events, window(), key_field="k")
    assert sum(row["n"] for row in result.output) == 10
    assert sorted(d.item["v"] for d in result.dead_letters) == [-3, -2, -1]
    assert all("event time" in d.error for d in result.dead_letters)


def test_seconds_in_another_field_and_a_callable_both_drive_windows_in_milliseconds():
    by_seconds = IterableSource(items=[{"k": "a", "v": i, "at": T0 / 1000 + i * 0.5} for i in range(8)],
                                ts_field="at", ts_unit="s", max_delay=0)
    out = run_operators(by_seconds, window(), key_field="k").output
    assert [(r["window_start"], r["n"]) for r in out] == [(T0 + i * 1000, 2) for i in range(4)]
    by_callable = IterableSource(items=[{"k": "a", "v": i, "at": f"2023-11-14T22:13:2{i}Z"} for i in range(4)],
                                 ts_field=lambda e: e["at"], max_delay=0)
    result = run_operators(by_callable, window(), key_field="k")
    assert [(r["window_start"], r["n"]) for r in result.output] == [(T0 + i * 1000, 1) for i in range(4)]
    assert not result.dead_letters


def test_an_arrow_batch_keeps_its_valid_rows_and_names_each_bad_time():
    import pyarrow as pa

    batch = pa.RecordBatch.from_pylist([{"n": 0, "ts": 1000.5}, {"n": 1, "ts": float("nan")},
                                        {"n": 2, "ts": None}, {"n": 3, "ts": float("inf")}, {"n": 4, "ts": 3000.0}])
    kept, bad, top = EventTime("ts").stamp_columns(batch)
    assert kept.column("n").to_pylist() == [0, 4] and top == 3000 and isinstance(top, int)
    assert [(row["n"], reason) for row, reason in bad] == [
        (1, "bad event time: 'ts' is nan"), (2, "bad event time: 'ts' is None"), (3, "bad event time: 'ts' is inf")]
    whole = pa.RecordBatch.from_pylist([{"ts": 5}, {"ts": 7}])
    assert EventTime("ts").stamp_columns(whole) == (whole, [], 7)          # nothing wrong: the batch as is
    kept, bad, top = EventTime("when").stamp_columns(whole)
    assert kept.num_rows == 0 and top is None and "missing" in bad[0][1] and len(bad) == 2
