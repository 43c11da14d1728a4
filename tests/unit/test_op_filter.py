"""filter: keeps the tuples fn accepts, in order."""

from pescheduler.operators.basic import Filter
from pescheduler.testing import run_operators


def test_filter_keeps_matching_tuples():
    result = run_operators(list(range(10)), Filter(lambda x: x % 3 == 0), batch_size=4, ts_field=None)
    assert result.output == [0, 3, 6, 9]


def test_filter_error_dead_letters_only_the_bad_tuple():
    result = run_operators([{"s": 9}, {}, {"s": 1}], Filter(lambda t: t["s"] > 5), ts_field=None)
    assert result.output == [{"s": 9}]
    assert [d.item for d in result.dead_letters] == [{}]
