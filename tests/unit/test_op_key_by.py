"""key_by: tuples pass unchanged; ``field`` is what the keyed operator after it uses."""

import pytest

from pescheduler.operators.basic import KeyBy
from pescheduler.operators.window import Window
from pescheduler.testing import run_operators


def test_key_by_passes_tuples_through_unchanged():
    items = [{"car": "a", "ts": 1}, {"car": "b", "ts": 2}]
    result = run_operators(items, KeyBy("car"))
    assert result.output == items and result.output[0] is items[0]
    assert KeyBy(field="car").parameters() == {"field": "car"}


def test_key_by_field_keys_the_following_window():
    items = [{"car": c, "ts": t} for c, t in (("b", 1), ("a", 2), ("b", 3))]
    key_by = KeyBy("car")
    result = run_operators(items, key_by, Window(10, aggregates={"n": "count"}), key_field=key_by.field)
    assert [(r["car"], r["n"]) for r in result.output] == [("b", 2), ("a", 1)]


def test_key_by_rejects_a_non_key():
    with pytest.raises(TypeError, match="field name or a callable"):
        KeyBy(3)
