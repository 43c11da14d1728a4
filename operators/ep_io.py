"""The two ends of a ``pescheduler.ep`` query as operators: schema check in, output processors out.

``ep_schema`` checks each event against its stream's schema and dead-letters
the ones that do not fit, with the error naming the field and the type it
expects (in-process, ``EventProcessor.push_event`` raises that same error to
the caller instead). ``ep_output`` hands each result to the query's output
processors. Both run the same way embedded in a
:class:`pescheduler.worker.chain.Chain` and in a deployed application.
"""

from __future__ import annotations

from types import MappingProxyType
from typing import Any, Callable, Mapping

from pescheduler.operator import Emitter, Operator, Parallelism, Sink, Source


class SchemaCheck(Operator):
    """Pass events that fit ``schema`` (a :class:`pescheduler.ep.Schema`); dead-letter the rest."""

    name = "ep_schema"
    parallelism = Parallelism.STATELESS

    def __init__(self, schema: Any) -> None:
        self.schema = schema

    def process(self, batch: list, emit: Emitter) -> None:
        check = self.schema.check_event
        for event in batch:
            try:
                check(event)
            except ValueError as exc:
                emit.dead_letter(event, exc)
            else:
                emit.append(event)


class OutputProcessors(Sink):
    """Call the output processors of each result's query.

    ``processors``: ``{query_id: [fn, ...]}``. With ``tagged`` the input is
    ``(query_id, row)`` pairs (a window shared by several queries); with
    ``grouped`` too, ``(query_id, rows, template, field)``: the rows one event
    gave one query (``ep_correlate``: a pair per event found), called in that
    order. ``rows`` is the list of rows when ``template`` is None; else it
    holds the partners, and each row is a copy of ``template`` with ``field``
    set to one of them, written here just before it is handed over (one loop
    over the pairs, not one that builds rows and one that hands them over).
    Without ``tagged``, every row belongs to the one query in ``processors``.
    The dict may be the caller's live one, so processors added later are
    called from then on.
    """

    name = "ep_output"
    # {query_id: first window_start}: a query created mid-stream gets only the windows it saw
    # whole (pescheduler.ep.api.first_whole_start). Set by the in-process engines, never a
    # parameter: a deployed application runs its queries from the stream's start.
    whole_from: Mapping[Any, int] = MappingProxyType({})

    def __init__(self, processors: dict[Any, list[Callable]], tagged: bool = False,
                 grouped: bool = False) -> None:
        if not tagged and (grouped or len(processors) != 1):
            raise ValueError(f"ep_output: untagged results belong to one query, got {list(processors)}"
                             + (" (grouped results are tagged)" if grouped else ""))
        self.processors = processors
        self.tagged, self.grouped = tagged, grouped

    def process(self, batch: list, emit: Emitter) -> None:
        # A processor that raises loses only its own call: the row is dead-lettered
        # with the error, and the other processors and queries still get theirs.
        # The hot path of Count queries: the processors called inline, no helper call per row (a
        # processor that adds or removes processors while called takes effect from the next
        # item on: the next row, or with ``grouped`` the next group).
        if not self.tagged:
            ((query_id, fns),) = self.processors.items()
            for row in batch:
                self._each(query_id, row, fns, emit)
            return
        processors = self.processors            # (processors.get(...), not a bound get: faster on 3.11)
        if self.whole_from and not self.grouped:
            batch = whole(batch, self.whole_from)
        if self.grouped:
            for query_id, rows, template, field in batch:
                fns = processors.get(query_id)
                if not fns:
                    continue
                if len(fns) > 1:
                    for row in (rows if template is None else _completed(template, field, rows)):
                        self._each(query_id, row, fns, emit)
                    continue
                fn, left = fns[0], iter(rows)
                while True:                         # one try per group; after a failure, go on
                    try:
                        if template is None:
                            for row in left:
                                fn(row)
                        else:
                            for partner in left:
                                row = template.copy()
                                row[field] = partner
                                fn(row)
                        break
                    except Exception as exc:
                        emit.dead_letter({"query": query_id, "row": row}, exc)
            return
        for query_id, row in batch:
            fns = processors.get(query_id)
            if not fns:
                continue
            if len(fns) == 1:                       # the usual case: no copy of the list per row
                try:
                    fns[0](row)
                except Exception as exc:
                    emit.dead_letter({"query": query_id, "row": row}, exc)
                continue
            self._each(query_id, row, fns, emit)

    @staticmethod
    def _each(query_id: Any, row: Any, fns: list, emit: Emitter) -> None:
        """Every processor of ``fns`` on ``row`` (a copy of the list: one may add or remove some)."""
        for fn in tuple(fns):
            try:
                fn(row)
            except Exception as exc:
                emit.dead_letter({"query": query_id, "row": row}, exc)


def whole(batch: list, whole_from: Mapping[Any, int]) -> list:
    """The ``(query_id, row)`` items of ``batch`` but the windows a query created mid-stream did
    not see whole (``row["window_start"]`` before its ``whole_from``)."""
    return [(q, row) for q, row in batch if q not in whole_from or row["window_start"] >= whole_from[q]]


def _completed(template: dict, field: str, partners: list) -> list:
    """The rows of a grouped item: ``template`` with ``field`` set to each partner."""
    rows = []
    for partner in partners:
        row = template.copy()
        row[field] = partner
        rows.append(row)
    return rows


class PushedSource(Source):
    """A source fed by calls (``offer``) rather than by reading: an ep stream in-process.

    Not registered: a deployed application reads a real source instead.
    """

    name = "ep_pushed"

    def __init__(self, max_delay: Any = 0) -> None:
        super().__init__(max_delay=max_delay)
        self._buffer: list = []
        self._ended = False

    def offer(self, events: list) -> None:
        self._buffer.extend(events)

    def end(self) -> None:
        self._ended = True

    def holding(self) -> bool:
        """Whether events offered are still to be read."""
        return bool(self._buffer)

    def read(self, n: int) -> list | None:
        if not self._buffer:
            return None if self._ended else []
        if len(self._buffer) <= n:                  # push_event: the whole buffer, not a copy
            batch, self._buffer = self._buffer, []
        else:
            batch, self._buffer = self._buffer[:n], self._buffer[n:]
        return batch
