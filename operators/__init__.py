"""The built-in operator plug-in, installed as ``pescheduler.operators``.

It registers through the ``pescheduler`` entry-point group
(``builtin-operators``) exactly as a third-party plug-in does:

* sources: ``iterable``, ``generator``, ``jsonl`` (:mod:`.sources`), ``kafka`` (:mod:`.kafka`),
  ``redis`` (:mod:`.redis_streams`), ``files`` (:mod:`.files`),
  ``postgres_cdc`` (:mod:`.postgres_cdc`)
* operators: ``map``, ``filter``, ``flat_map``, ``key_by``, ``union`` (:mod:`.basic`),
  ``window`` (:mod:`.window`), ``session_window`` (:mod:`.session`), ``count_window``
  (:mod:`.count_window`), ``over_window`` (:mod:`.over_window`), ``join`` (:mod:`.join`), ``pattern`` (:mod:`.pattern`),
  ``latest`` (:mod:`.latest`), ``changelog_split`` and ``changelog_aggregate`` (grouped aggregates
  over a changelog that retract, :mod:`.changelog_aggregate`), ``process`` (keyed process functions with timers, :mod:`.process`),
  ``join_asof`` (:mod:`.join_asof`), ``lookup`` (:mod:`.lookup`)
* sinks: ``jsonl``, ``print``, ``discard``, ``parquet`` (:mod:`.sinks`), ``kafka``, ``redis``,
  ``delta`` (:mod:`.delta`), ``iceberg`` (:mod:`.iceberg`)
* the ends of ``pescheduler.ep`` queries: ``ep_schema`` and the sink ``ep_output`` (:mod:`.ep_io`);
  filter-only ep queries of one stream together: ``ep_filter`` (:mod:`.ep_filter`); the other
  ep queries over the same inputs as one chain operator: ``ep_group`` (:mod:`.ep_group`); per-event
  windows of several sizes: ``ep_over`` (:mod:`.ep_over`); pattern queries of a stream with shared
  runs: ``ep_patterns`` (:mod:`.ep_pattern`); correlations of one shape sharing their buffers:
  ``ep_correlate`` (:mod:`.ep_correlate`)
* aggregates: ``count``, ``sum``, ``sumsq``, ``min``, ``max``, ``avg``, ``var``,
  ``stddev`` (:mod:`pescheduler.aggregates`)
"""

from __future__ import annotations

from pescheduler.aggregates import BUILTINS
from pescheduler.plugins import hookimpl

from .basic import Filter, FlatMap, KeyBy, Map, Union
from .changelog_aggregate import ChangelogAggregate, ChangelogSplit
from .count_window import CountWindow
from .delta import DeltaSink
from .files import FilesSource
from .ep_correlate import SharedCorrelations
from .ep_filter import SharedFilter
from .ep_group import QueryGroup
from .ep_over import OverLanes
from .ep_pattern import SharedPatterns
from .ep_io import OutputProcessors, SchemaCheck
from .iceberg import IcebergSink
from .join import Join
from .join_asof import AsofJoin
from .kafka import KafkaSink, KafkaSource
from .latest import Latest
from .lookup import Lookup
from .over_window import OverWindow
from .pattern import Pattern
from .postgres_cdc import PostgresCdcSource
from .process import Process
from .redis_streams import RedisStreamSink, RedisStreamSource
from .session import SessionWindow
from .sinks import DiscardSink, JsonlSink, ParquetSink, PrintSink
from .sources import GeneratorSource, IterableSource, JsonlSource
from .window import Window

OPERATORS = [IterableSource, GeneratorSource, JsonlSource, KafkaSource, RedisStreamSource, Map, Filter, FlatMap, KeyBy, Union, Window,
             SessionWindow, CountWindow, OverWindow, Join, Pattern, SchemaCheck, SharedFilter, QueryGroup, OverLanes, SharedPatterns, SharedCorrelations,
             JsonlSink, PrintSink, DiscardSink,
             Process,
             AsofJoin, Lookup,
             ParquetSink, KafkaSink, RedisStreamSink, OutputProcessors,
             FilesSource, DeltaSink, IcebergSink, PostgresCdcSource, Latest,
             ChangelogSplit, ChangelogAggregate]

__all__ = [cls.__name__ for cls in OPERATORS]


@hookimpl
def pescheduler_operators():
    """Every built-in source, operator and sink."""
    return list(OPERATORS)


@hookimpl
def pescheduler_aggregates():
    """The built-in window aggregates."""
    return list(BUILTINS.values())
