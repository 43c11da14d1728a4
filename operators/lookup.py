"""Lookup join: enrich each event with its key's row of a table.

``stream.lookup(table, key="customer_id", as_of=False)`` emits, for every event
``e``, exactly one result ``{"left": e, "right": row, "ts": e[on]}`` with ``row``
the table's row of key ``e[key]`` (``None`` when the table has none). The table is

* a **static** one: ``rows=`` (an iterable of dicts, kept as the operator's
  parameter) or ``path=`` (a JSON-lines file, read when the operator opens),
  each row keyed by its ``table_key`` field (default ``key``); or
* a **changelog** on the second input: ``postgres_cdc``'s changes
  (``{"op": "insert"|"update"|"delete", <key>, "after", "ts"}``) or a
  ``latest()``'s (``{"op": "upsert"|"delete", <key>, "row"}``), keyed by ``key``.

With a changelog, ``as_of=False`` takes the table as it is when the event
arrives (changes apply as they come: a processing-time lookup, whose result
depends on how the two inputs interleave); ``as_of=True`` takes the table's
version as of the event's time (an event-time temporal join): the last change of
the key with ``ts <= e[on]``, exact under out-of-order input within the
watermark (the backward :mod:`as-of join <.join_asof>`, whose rules it follows
for waiting, ties and late events). A change whose ``op`` is unknown is
dead-lettered.

State: a changelog's current rows (one per key) live in the keyed state
backend, so checkpoints hold them and copies move them by key group (KEYED).
"""

from __future__ import annotations

import json
from typing import Any, Callable, Iterable

from pescheduler.operator import Emitter, OperatorContext

from pescheduler.state.groups import write_batch

from .join_asof import _NOTHING, LEFT, AsofJoin
from .window import key_getter

_ROW = {"insert": "after", "update": "after", "upsert": "row", "delete": None}


def row_of(change: dict) -> dict | None:
    """The table row a change leaves (``None``: the key is deleted)."""
    op = change.get("op")
    if op not in _ROW:
        raise ValueError(f"lookup: a table change's op must be one of {', '.join(_ROW)}, got {op!r}")
    return None if _ROW[op] is None else change[_ROW[op]]


class Lookup(AsofJoin):
    """Enrich events from a static table or a changelog; see the module docstring.

    ``key``: the events' key field (and the changelog's). ``rows``: a static table, an iterable of
    rows. ``path``: a static table, a JSON-lines file read at open. ``table_key``: the static rows'
    key field (default ``key``). ``as_of``: take the changelog's row as of the event's time, not as
    it is on arrival. ``on``: the time field of events and changes.
    """

    name = "lookup"

    def __init__(self, key: str | Callable | None = None, rows: Iterable[dict] | None = None,
                 path: str | None = None, table_key: str | Callable | None = None, as_of: bool = False,
                 on: str = "ts") -> None:
        super().__init__(by=key, on=on)
        if rows is not None and path is not None:
            raise ValueError("lookup: give rows= or path= for a static table, not both")
        static = rows is not None or path is not None
        if as_of and static:
            raise ValueError("lookup: as_of=True needs a changelog table (its versions have times); "
                             "a static table has one version")
        self.as_of, self.path = bool(as_of), path
        self._table_key = key_getter(key if table_key is None else table_key)
        self._static = None if rows is None else self._index(rows)
        self._is_static = static

    def _index(self, rows: Iterable[dict]) -> dict:
        return {self._table_key(row): row for row in rows}

    def open(self, context: OperatorContext) -> None:
        super().open(context)
        if self.path is not None:
            with open(self.path) as f:
                self._static = self._index(json.loads(line) for line in f if line.strip())

    def process_input(self, input_index: int, batch: list, emit: Emitter) -> None:
        """Events (input 0) are enriched on arrival, table changes (input 1) applied on arrival,
        unless ``as_of``: then both wait for the watermark (the as-of join's order)."""
        if self.as_of:
            super().process_input(input_index, batch, emit)
            return
        take = self._enrich if input_index == LEFT else self._take_right
        now: dict = {}                          # a batch of changes, written once (write_batch)
        try:
            for t in batch:
                try:
                    take(self._key_of(t), t, emit, now)
                except Exception as exc:
                    emit.dead_letter(t, exc)
        finally:
            write_batch(self._keys, now, _NOTHING)

    def _enrich(self, k: Any, e: Any, emit: Emitter, now: dict) -> None:
        """An event, enriched on arrival (a batch of events writes nothing: ``now`` stays empty)."""
        if self._is_static:
            emit(self._result(e, e.get(self.on), self._static.get(k)))
            return
        last, _ = self._keys.get(k, (None, ()))
        emit(self._result(e, e.get(self.on), None if last is None else last[1]))

    def _take_right(self, k: Any, change: Any, emit: Emitter, now: dict) -> None:
        """A change: the key's row becomes what it leaves (a deleted key is forgotten)."""
        if self._is_static:
            raise ValueError("lookup: a static table (rows= or path=) has no second input")
        try:
            row = row_of(change)
        except ValueError as exc:
            emit.dead_letter(change, exc)
            return
        now[k] = _NOTHING if row is None else ((change.get(self.on), row), ())
