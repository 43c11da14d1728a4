"""map: one output per input; a failing tuple is dead-lettered alone."""

from pescheduler.operators.basic import Map
from pescheduler.testing import run_operators


def test_map_applies_fn_to_every_tuple_in_order():
    result = run_operators([{"x": i} for i in range(5)], Map(lambda t: t["x"] * 10),
                           batch_size=2, ts_field=None)
    assert result.output == [0, 10, 20, 30, 40]


def test_map_error_dead_letters_only_the_bad_tuple():
    result = run_operators([4, 2, 0, 1], Map(lambda x: 8 // x), ts_field=None)
    assert result.output == [2, 4, 8]
    assert [d.item for d in result.dead_letters] == [0]
    assert "ZeroDivisionError" in result.dead_letters[0].error
