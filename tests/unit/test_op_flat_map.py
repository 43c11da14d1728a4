"""flat_map: every item of fn's iterable, flattened in order."""

from pescheduler.operators.basic import FlatMap
from pescheduler.testing import run_operators


def test_flat_map_flattens_in_order():
    result = run_operators(["a b", "", "c"], FlatMap(str.split), batch_size=2, ts_field=None)
    assert result.output == ["a", "b", "c"]


def test_flat_map_error_dead_letters_only_the_bad_tuple():
    result = run_operators([2, None, 1], FlatMap(range), ts_field=None)
    assert result.output == [0, 1, 0]
    assert [d.item for d in result.dead_letters] == [None]
