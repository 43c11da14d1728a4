"""``latest``: the current row per key of a changelog (``postgres_cdc``'s changes, or any stream of them).

``stream.key_by("id").latest()`` reads changes ``{"op": "insert"|"update"|"delete",
<key>, "after", ...}`` and keeps ``after`` per key; a delete removes the key.
For each change it emits what the current state became::

    {"op": "upsert", "id": 7, "row": {...new row...}, "previous": {...row it replaced...} | None}
    {"op": "delete", "id": 7, "row": None, "previous": {...row removed...}}

so a consumer can retract ``previous`` and add ``row`` (a running sum per
group stays exact under updates and deletes). A delete of a key it does not
hold emits nothing; a tuple without an ``op`` it knows is dead-lettered.
State is per key (KEYED), in the deployment's keyed state backend
(``pescheduler.state``: memory or disk, docs/state.md), so ``state="disk"`` bounds a large
table's memory: a snapshot holds whole key groups, and copies split and merge them (a rescale
moves key groups). An update that changes the key arrives under the new
key; its old key is deleted by the ``before`` it carries only if that key is
held by this instance, so keep key-changing updates out of a copied ``latest``
(or key tables by a column that never changes).
"""

from __future__ import annotations

from operator import methodcaller
from typing import Any, Callable

from pescheduler.operator import Emitter, Operator, OperatorContext, Parallelism
from pescheduler.state import MemoryState, adopt
from pescheduler.state.groups import add_groups, merge_groups, restore_groups, snapshot_groups, split_groups, take_groups, write_batch

from .window import key_getter

OPS = ("insert", "update", "delete")
_BEFORE = methodcaller("get", "before")   # a change's old key, if it changed its key
_UNREAD = object()                      # a key this batch has not written yet: read it from the backend


class Latest(Operator):
    """Current row per key of a changelog; see the module docstring."""

    name = "latest"
    parallelism = Parallelism.KEYED
    _read: dict | None = None               # the batch's rows read up front (_prefetched), or None

    def __init__(self, key: str | Callable | None = None) -> None:
        self.key = key
        # key -> its current row; in memory until open() moves it to the deployment's backend
        # (restore comes before open)
        self._rows = MemoryState()

    def open(self, context: OperatorContext) -> None:
        super().open(context)
        if self.key is None:
            self.key = context.key_field
        if self.key is None:
            raise ValueError("latest: key the stream first (stream.key_by(\"id\").latest()) or give key=")
        self._key_of = key_getter(self.key)
        self._key_name = "key" if callable(self.key) else self.key
        self._rows = adopt(context, self._rows)

    def process(self, batch: list, emit: Emitter) -> None:
        # A batch's rows are gathered in ``now`` (key -> its row, None once deleted) and written
        # to the backend once, at the end: a dict store per change instead of a backend call
        # (on memory a put is a Python call with two stores; write_many two dict updates).
        # Hot loop: an insert or an update (after moving its row when it changed its key) is
        # applied inline, its previous row read with ``read`` (never a copy: it is only emitted,
        # as the row stored is); a delete goes through _delete. Two Python calls a change
        # (the former _apply, _current) and ``get``, a Python method while a checkpoint's view is live on
        # memory, were most of this operator's own time in a fill.
        now: dict = {}
        rows = self._rows
        read = self._read = self._prefetched(batch) if rows.reads_in_batches else None
        lookup, key_of, name = rows.read, self._key_of, self._key_name
        try:
            for change in batch:
                try:
                    op = change.get("op")
                    if op != "insert" and op != "update":
                        self._delete(change, op, emit, now)
                        continue
                    key = key_of(change)
                    if op == "update" and "before" in change and change["before"]:
                        self._moved(key_of(change["before"]), key, emit, now)
                    after = change["after"]
                    if after is None:
                        raise ValueError(f"latest: an {op} without its row (after=None)")
                    if key in now:                  # tests, not calls: a fill's keys are in neither
                        previous = now[key]
                    elif read is not None and key in read:
                        previous = read[key]
                    else:
                        previous = lookup(key)
                    now[key] = after
                    emit({"op": "upsert", name: key, "row": after, "previous": previous})
                except Exception as exc:            # the change dead-lettered, the stream goes on
                    emit.dead_letter(change, exc)
        finally:
            self._read = None
            write_batch(rows, now)

    def _delete(self, change: dict, op: Any, emit: Emitter, now: dict) -> None:
        """A change that is no upsert: a delete, or an op that is none of :data:`OPS` (raised)."""
        if op != "delete":
            raise ValueError(f"latest: op must be one of {', '.join(OPS)}, got {op!r}")
        self._drop(self._key_of(change), emit, now)

    def _current(self, key: Any, now: dict) -> Any:
        """The key's row as this batch left it so far (None once deleted), else the backend's."""
        row = now.get(key, _UNREAD)
        if row is not _UNREAD:
            return row
        read = self._read
        if read is not None:
            row = read.get(key, _UNREAD)
            if row is not _UNREAD:
                return row
        return self._rows.read(key)             # only emitted, never changed: no copy

    def _prefetched(self, batch: list) -> dict:
        """The rows of the batch's keys as the backend holds them before it, in one ``get_many``
        (disk: the keys encoded in one batch and one multi-get, against a get per change: a
        call, an encode and a lookup each). A change whose key cannot be read is left to
        the loop, which dead-letters it."""
        key_of = self._key_of
        try:                                # in C: every change a dict with its key and no "before"
            if not any(map(_BEFORE, batch)):
                keys = list(map(key_of, batch))
                return dict(zip(keys, self._rows.get_many(keys)))
        except Exception:                   # a change that is not one: read as below, _delete or the loop says why
            pass
        keys = []
        for change in batch:
            try:
                keys.append(key_of(change))
                before = change.get("before")
                if before:
                    keys.append(key_of(before))
            except Exception:
                continue
        try:
            return dict(zip(keys, self._rows.get_many(keys)))
        except TypeError:                   # an unhashable key: read one at a time (_delete or the loop says why)
            return {}

    def _moved(self, old: Any, key: Any, emit: Emitter, now: dict) -> None:
        """An update that changed the key: the old key's row goes, when this instance holds it."""
        if old != key:
            self._drop(old, emit, now)

    def _drop(self, key: Any, emit: Emitter, now: dict) -> None:
        previous = self._current(key, now)
        if previous is not None:
            now[key] = None
            emit({"op": "delete", self._key_name: key, "row": None, "previous": previous})

    # -- state: rows by key, in whole key groups ------------------------------------------
    def rows(self) -> dict:
        """Every key's current row (a copy: for tests and inspection, not the hot path)."""
        return dict(self._rows.entries())

    def snapshot(self) -> dict:
        """The key groups of the keyed state (packed when read: a copy)."""
        return {"groups": snapshot_groups(self._rows)}

    def restore(self, state: dict) -> None:
        if "rows" in state:                     # a checkpoint from before the keyed state backend
            self._rows.drop_groups(self._rows.groups())
            for k, row in state["rows"].items():
                self._rows.put(k, row)
            return
        restore_groups(self._rows, state["groups"])

    def export_groups(self, groups: frozenset[int]) -> dict:
        """A rescale takes key groups ``groups`` away: their rows, removed here, packed only when
        the part is pickled (pescheduler/worker/handover.py)."""
        return {"groups": take_groups(self._rows, groups)}

    def import_groups(self, state: dict) -> None:
        """Key groups another instance exported join this running one."""
        add_groups(self._rows, state["groups"])

    def split_state(self, state: dict, owns: Callable[[Any], bool]) -> dict:
        """The key groups where ``owns(key)``."""
        return {"groups": split_groups(state["groups"], owns)}

    def merge_states(self, states: list) -> dict:
        """Every instance's key groups (disjoint)."""
        return {"groups": merge_groups([s["groups"] for s in states])}
