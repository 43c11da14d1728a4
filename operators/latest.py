"""``latest``: the current row per key of a changelog (``postgres_cdc``'s changes, or any stream of them).

``stream.key_by("id").latest()`` reads changes ``{"op": "insert"|"update"|"delete",
<key>, "after", ...}`` and keeps ``after`` per key; a delete removes the key.
For each change it emits what the current state became::

    {"op": "upsert", "id": 7, "row": {...new row...}, "previous": {...row it replaced...} | None}
    {"op": "delete", "id": 7, "row": None, "previous": {...row removed...}}

so a consumer can retract ``previous`` and add ``row`` (a running sum per
group stays exact under updates and deletes). A delete of a key it does not
hold emits nothing; a tuple without an ``op`` it knows is dead-lettered.
State is per key (KEYED): copies split and merge it by key group, and
checkpoints carry it. An update that changes the key arrives under the new
key; its old key is deleted by the ``before`` it carries only if that key is
held by this instance, so keep key-changing updates out of a copied ``latest``
(or key tables by a column that never changes).
"""

from __future__ import annotations

from typing import Any, Callable

from pescheduler.operator import Emitter, Operator, OperatorContext, Parallelism

from .window import key_getter

OPS = ("insert", "update", "delete")


class Latest(Operator):
    """Current row per key of a changelog; see the module docstring."""

    name = "latest"
    parallelism = Parallelism.KEYED

    def __init__(self, key: str | Callable | None = None) -> None:
        self.key = key
        self._rows: dict[Any, dict] = {}

    def open(self, context: OperatorContext) -> None:
        super().open(context)
        if self.key is None:
            self.key = context.key_field
        if self.key is None:
            raise ValueError("latest: key the stream first (stream.key_by(\"id\").latest()) or give key=")
        self._key_of = key_getter(self.key)
        self._key_name = "key" if callable(self.key) else self.key

    def process(self, batch: list, emit: Emitter) -> None:
        for change in batch:
            try:
                self._apply(change, emit)
            except Exception as exc:            # _apply changes nothing before it raises
                emit.dead_letter(change, exc)

    def _apply(self, change: dict, emit: Emitter) -> None:
        op = change.get("op")
        if op not in OPS:
            raise ValueError(f"latest: op must be one of {', '.join(OPS)}, got {op!r}")
        key = self._key_of(change)
        if op == "update" and change.get("before"):
            self._moved(self._key_of(change["before"]), key, emit)
        if op != "delete":
            previous, self._rows[key] = self._rows.get(key), change["after"]
            emit({"op": "upsert", self._key_name: key, "row": change["after"], "previous": previous})
        elif key in self._rows:
            emit({"op": "delete", self._key_name: key, "row": None, "previous": self._rows.pop(key)})

    def _moved(self, old: Any, key: Any, emit: Emitter) -> None:
        """An update that changed the key: the old key's row goes, when this instance holds it."""
        if old != key and old in self._rows:
            emit({"op": "delete", self._key_name: old, "row": None, "previous": self._rows.pop(old)})

    # -- state: rows by key ----------------------------------------------------------
    def snapshot(self) -> dict:
        return {"rows": dict(self._rows)}

    def restore(self, state: dict) -> None:
        self._rows = dict(state["rows"])

    def split_state(self, state: dict, owns: Callable[[Any], bool]) -> dict:
        """The rows of the keys where ``owns(key)``."""
        return {"rows": {k: row for k, row in state["rows"].items() if owns(k)}}

    def merge_states(self, states: list) -> dict:
        """Every instance's rows (their keys are disjoint)."""
        return {"rows": {k: row for st in states for k, row in st["rows"].items()}}
