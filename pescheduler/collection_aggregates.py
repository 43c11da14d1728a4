"""The aggregates that keep a collection or a sketch: distinct counts, percentiles,
first/last by event time, top-k (the ones a dashboard reaches for).

Unlike ``sum`` or ``count`` their accumulators are containers, and copying a set
or a sketch per tuple would make a window quadratic. So ``update`` changes the
accumulator in place and returns it: a pane owns its accumulators alone, every
``merge`` builds a new one (a pane merged into several sliding windows is never
changed), and a checkpoint pickles the state at its barrier. Sketches pickle as
their own serialized bytes, so a snapshot holds plain bytes.

Parametrised ones (``("percentile", field, q)``, ``("top_k", field, k)``) are
built per parameter by :func:`parametrised` and cached, so two requests with the
same parameter are one aggregate and share one accumulator in a plan.

Error bounds (the sketches, from the ``datasketches`` library):
``approx_count_distinct`` is an HLL sketch of ``lg_k = 12`` (4,096 buckets),
relative standard error 1.04 / sqrt(4096) = 1.6 %; ``approx_percentile`` is a
KLL sketch of ``k = 200``, rank error 1.33 % of the count (99 % confidence).
"""

from __future__ import annotations

import math
from collections import Counter
from functools import lru_cache
from typing import Any

HLL_LG_K = 12
"""log2 of the HLL sketch's buckets: 4,096, a 1.6 % relative standard error."""
HLL_RELATIVE_ERROR = 1.04 / math.sqrt(2 ** HLL_LG_K)
KLL_K = 200
"""KLL sketch size: a 1.33 % normalised rank error (99 % confidence)."""
KLL_RANK_ERROR = 0.0133


SKETCHES = {"requires": ("datasketches",), "install": "pescheduler[sketches]"}
"""What the sketch aggregates need installed, checked at deploy (``Aggregate.requires``)."""


def _sketches():
    """The ``datasketches`` module, or an error naming the extra that installs it."""
    try:
        import datasketches
    except ModuleNotFoundError as exc:
        raise ModuleNotFoundError('approximate aggregates need datasketches: '
                                  'pip install "pescheduler[sketches]"') from exc
    return datasketches


class DistinctSketch:
    """An HLL sketch of the distinct values seen (ints, floats, strings)."""

    __slots__ = ("sketch",)

    def __init__(self, sketch: Any = None) -> None:
        self.sketch = sketch if sketch is not None else _sketches().hll_sketch(HLL_LG_K)

    def add(self, value: Any) -> "DistinctSketch":
        if not isinstance(value, (int, float, str)):
            raise TypeError(f"approx_count_distinct takes ints, floats or strings, got {value!r}")
        self.sketch.update(value)
        return self

    def merged(self, other: "DistinctSketch") -> "DistinctSketch":
        ds = _sketches()
        union = ds.hll_union(HLL_LG_K)
        union.update(self.sketch)
        union.update(other.sketch)
        return DistinctSketch(union.get_result(ds.tgt_hll_type.HLL_4))

    def estimate(self) -> int:
        return round(self.sketch.get_estimate())

    def __reduce__(self):
        return _distinct_from_bytes, (self.sketch.serialize_compact(),)


def _distinct_from_bytes(data: bytes) -> DistinctSketch:
    return DistinctSketch(_sketches().hll_sketch.deserialize(data))


class QuantileSketch:
    """A KLL sketch of the (float) values seen."""

    __slots__ = ("sketch",)

    def __init__(self, sketch: Any = None) -> None:
        self.sketch = sketch if sketch is not None else _sketches().kll_doubles_sketch(KLL_K)

    def add(self, value: Any) -> "QuantileSketch":
        self.sketch.update(float(value))
        return self

    def merged(self, other: "QuantileSketch") -> "QuantileSketch":
        copy = _quantiles_from_bytes(self.sketch.serialize())
        copy.sketch.merge(other.sketch)
        return copy

    def __reduce__(self):
        return _quantiles_from_bytes, (self.sketch.serialize(),)


def _quantiles_from_bytes(data: bytes) -> QuantileSketch:
    return QuantileSketch(_sketches().kll_doubles_sketch.deserialize(data))


def _set_add(acc: set, value: Any) -> set:
    acc.add(value)
    return acc


def _list_add(acc: list, value: Any) -> list:
    acc.append(value)
    return acc


def _count_add(acc: Counter, value: Any) -> Counter:
    acc[value] += 1
    return acc


def exact_percentile(values: list, q: float) -> float:
    """The ``q`` quantile with linear interpolation between ranks (numpy's default)."""
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q
    lo = math.floor(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def top_k(counts: Counter, k: int) -> list[tuple[Any, int]]:
    """The ``k`` most frequent ``(value, count)``; ties by value, so any split merges alike."""
    try:
        ranked = sorted(counts.items(), key=lambda vc: (-vc[1], vc[0]))
    except TypeError:                      # values that do not order: ties by their repr
        ranked = sorted(counts.items(), key=lambda vc: (-vc[1], repr(vc[0])))
    return ranked[:k]


def _earlier(a: tuple | None, b: tuple | None) -> tuple | None:
    """The ``(ts, value)`` of the smaller event time; ``a`` (seen first) on a tie."""
    return b if a is None or (b is not None and b[0] < a[0]) else a


def _later(a: tuple | None, b: tuple | None) -> tuple | None:
    """The ``(ts, value)`` of the larger event time; ``b`` (seen later) on a tie."""
    return a if b is None or (a is not None and a[0] > b[0]) else b


def collection_aggregates(Aggregate: type) -> tuple:
    """The unparametrised ones, built with the ``Aggregate`` class (no import cycle)."""
    return (
        Aggregate("count_distinct", create=set, update=_set_add, merge=lambda a, b: a | b,
                  result=len, doc="the number of distinct values of the field (exact: holds every value)"),
        Aggregate("approx_count_distinct", create=DistinctSketch, update=DistinctSketch.add,
                  merge=DistinctSketch.merged, result=DistinctSketch.estimate, **SKETCHES,
                  doc="the number of distinct values, estimated (HyperLogLog, relative standard error 1.6 %)"),
        Aggregate("first", create=lambda: None, update=_earlier, merge=_earlier,
                  result=lambda a: a[1], timed=True, doc="the field's value at the earliest event time"),
        Aggregate("last", create=lambda: None, update=_later, merge=_later,
                  result=lambda a: a[1], timed=True, doc="the field's value at the latest event time"),
    )


def _check_fraction(name: str, q: Any) -> float:
    if isinstance(q, bool) or not isinstance(q, (int, float)) or not 0 <= q <= 1:
        raise ValueError(f"{name}: q must be a number in [0, 1], e.g. ({name!r}, 'latency', 0.99); "
                         f"got {q!r}")
    return float(q)


@lru_cache(maxsize=None)
def parametrised(Aggregate: type, name: str, param: Any) -> Any:
    """``percentile``/``approx_percentile`` of ``q``, ``top_k`` of ``k``: one object per parameter."""
    if name == "top_k":
        if isinstance(param, bool) or not isinstance(param, int) or param < 1:
            raise ValueError(f"top_k: k must be a positive int, e.g. ('top_k', 'page', 10); got {param!r}")
        return Aggregate(f"top_k({param})", create=Counter, update=_count_add,
                         merge=lambda a, b: a + b, result=lambda c: top_k(c, param))
    q = _check_fraction(name, param)
    if name == "percentile":
        return Aggregate(f"percentile({q})", create=list, update=_list_add, merge=lambda a, b: a + b,
                         result=lambda values: exact_percentile(values, q))
    return Aggregate(f"approx_percentile({q})", create=QuantileSketch, update=QuantileSketch.add,
                     merge=QuantileSketch.merged, result=lambda s: s.sketch.get_quantile(q), **SKETCHES)


PARAMETRISED = {
    "percentile": ("q", "float", "the fraction in [0, 1]: 0.5 the median, 0.99 the 99th percentile",
                   "the q quantile of the field, interpolated linearly between ranks as numpy's "
                   "default (exact: holds every value)"),
    "approx_percentile": ("q", "float", "the fraction in [0, 1]: 0.5 the median, 0.99 the 99th percentile",
                          f"the q quantile of the field, estimated (KLL sketch, rank error "
                          f"{KLL_RANK_ERROR:.2%} of the count at 99 % confidence)"),
    "top_k": ("k", "int", "how many values: the k most frequent",
              "the k most frequent values of the field as (value, count) pairs, most frequent first, "
              "ties by value (exact: counts every value)"),
}
"""Aggregates requested as ``(name, field, parameter)``: the parameter's name, type and meaning, and
what the aggregate computes (``plugins --describe`` and docs/reference.md show them)."""
