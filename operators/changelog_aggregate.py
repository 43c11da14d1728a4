"""A grouped aggregate over a changelog that retracts: updates and deletes take the old row back out.

``stream.key_by("id").latest().aggregate({"total": ("sum", "qty")}, by="region")`` keeps, per
``region``, the aggregates of the table's *current* rows. ``latest()`` emits each change with the
row it replaced (``{"op": "upsert"|"delete", "row", "previous"}``); two operators follow it:

* ``changelog_split`` (stateless) turns a change into a retraction of ``previous`` and an
  addition of ``row``, each ``{"sign": -1|1, <by>: its group, "row": row}``, so a row that moved
  group is taken out of the old group's copy and added to the new one's (they are routed by group);
* ``changelog_aggregate`` (KEYED by the group) subtracts retractions and folds additions, and
  after every batch emits what each group it touched became::

      {"op": "upsert", "region": "eu", "version": 4, "total": 12, "n": 3}
      {"op": "delete", "region": "us", "version": 2, "total": None, "n": None}  # its last row went

``version`` counts the rows emitted for the group (1, 2, ...; it survives the group's deletion),
so a table that receives the rows appended (Iceberg, Delta, Parquet) holds each group's current
aggregates in its row of the highest ``version``, whatever order a reader lists the files in; a
delete carries every output as ``None`` so a table's schema does not depend on which row came first.

Which aggregates retract: the *invertible* ones exactly (``count``, ``sum``, ``sumsq``, and so
``avg``, ``var``, ``stddev`` derived from them; a float sum drifts as any running float sum
does, ints and Decimals are exact); ``min`` and ``max`` keep the multiset of the group's values
(a ``Counter``) and scan its distinct values when a row is emitted. Anything else (``first``,
``percentile``, the sketches, plug-ins without ``subtract``) is refused when the operator is made,
naming it. A row that cannot be aggregated (missing field, ``None`` where a number goes) is
dead-lettered alone; its retraction later fails the same way and is dead-lettered too, so the
aggregate never subtracts what it did not add. A retraction for a group it does not hold is
dead-lettered (the changelog and the aggregate disagree: never silently ignored).

State: per group ``[rows counted, slots, {field: Counter}]`` and its ``version``; checkpoints carry it and copies
split and merge it by group, as ``latest``'s.
"""

from __future__ import annotations

from collections import Counter
from typing import Any, Callable

from pescheduler.aggregates import AggregatePlan, parse_request
from pescheduler.operator import Emitter, Operator, Parallelism

from .window import _plugin_aggregates

MULTISET = {"min": min, "max": max}      # kept as a multiset of values: they cannot subtract


class ChangelogSplit(Operator):
    """A ``latest()`` change as a retraction of the row it replaced and an addition of its row.

    ``by`` names the row field that is the group each of the two goes to (routing the next
    operator's copies by it). A tuple that is not a ``latest()`` change is dead-lettered.
    """

    name = "changelog_split"
    parallelism = Parallelism.STATELESS

    def __init__(self, by: str) -> None:
        if not isinstance(by, str):
            raise ValueError(f"changelog_split: by must be a field name, got {by!r}")
        self.by = by

    def process(self, batch: list, emit: Emitter) -> None:
        by = self.by
        for change in batch:
            op = change.get("op") if isinstance(change, dict) else None
            if op not in ("upsert", "delete"):
                emit.dead_letter(change, ValueError(
                    f"aggregate over a changelog reads latest()'s changes ({{'op': 'upsert'|'delete', "
                    f"'row', 'previous'}}), got op={op!r}: put .key_by(KEY).latest() before it"))
                continue
            previous, row = change.get("previous"), change.get("row")
            if previous is not None:
                emit({"sign": -1, by: previous.get(by), "row": previous})
            if row is not None:
                emit({"sign": 1, by: row.get(by), "row": row})


class ChangelogAggregate(Operator):
    """Aggregates per group of a changelog's current rows; see the module docstring.

    ``by`` names the row field whose value is a row's group. ``aggregates`` are
    ``{output: (function, field)}`` as a window's, of the functions that can retract (count,
    sum, sumsq, avg, var, stddev, min, max).
    """

    name = "changelog_aggregate"
    parallelism = Parallelism.KEYED

    def __init__(self, by: str, aggregates: dict) -> None:
        if not isinstance(by, str):
            raise ValueError(f"changelog_aggregate: by must be a field name, got {by!r}")
        if not isinstance(aggregates, dict) or not aggregates:
            raise ValueError(f"changelog_aggregate: aggregates must be a non-empty dict "
                             f"{{name: (function, field)}}, got {aggregates!r}")
        clash = {by, "op", "version"} & set(aggregates)
        if clash:
            raise ValueError(f"changelog_aggregate: output names {sorted(clash)} clash with the group "
                             f"field, 'op' or 'version'; rename them")
        self.by, self.aggregates = by, dict(aggregates)
        self._groups: dict[Any, list] = {}
        self._versions: dict[Any, int] = {}     # group -> rows emitted for it
        self._compile()

    def _compile(self) -> None:
        plan = AggregatePlan(registry=_plugin_aggregates())
        folded, self._multiset = {}, {}
        for out, spec in self.aggregates.items():
            fn, fld = parse_request(out, spec)
            fname = fn if isinstance(fn, str) else fn.name
            if fname in MULTISET:
                self._multiset[out] = (MULTISET[fname], fld)
            else:
                folded[out] = spec
        query = plan.add(folded)
        if not plan.invertible:
            cannot = [repr(n) for n in plan.slots if n.aggregate.subtract is None]
            raise ValueError(f"changelog_aggregate: {', '.join(cannot)} cannot take a row back out; over a "
                             f"changelog use count, sum, sumsq, avg, var, stddev (exact) or min, max (multiset)")
        self._fields = sorted({fld for _, fld in self._multiset.values()}, key=repr)
        self._fold, self._subtract = plan.folder(), plan.subtractor()
        self._rows = plan.row_writer(query, self.by, window=False)

    # -- data -------------------------------------------------------------------------
    def process(self, batch: list, emit: Emitter) -> None:
        # groups in order of first touch this batch -> whether they were held (so emitted) before it
        touched: dict[Any, bool] = {}
        groups = self._groups
        for t in batch:
            try:
                g = t[self.by]
                held = g in groups
                self._apply(t)
                touched.setdefault(g, held)
            except Exception as exc:            # _apply changes nothing before it raises
                emit.dead_letter(t, exc)
        for g, held in touched.items():
            state = groups.get(g)
            if state is None and not held:      # made and emptied within the batch: never seen
                continue
            version = self._versions[g] = self._versions.get(g, 0) + 1
            if state is None:
                emit({"op": "delete", self.by: g, "version": version, **dict.fromkeys(self.aggregates)})
            else:
                emit(self._result(g, state, version))

    def _apply(self, t: dict) -> None:
        g, row = t[self.by], t["row"]
        if self.by not in row:
            raise KeyError(f"changelog_aggregate: the row has no group field {self.by!r}")
        values = [row[f] for f in self._fields]
        state = self._groups.get(g)
        if t["sign"] > 0:
            for v in values:
                v < v                            # noqa: B015 - a value min/max cannot order is refused now
            if state is None:
                state = [0, self._fold(None, row), {f: Counter() for f in self._fields}]
                self._groups[g] = state
            else:
                self._fold(state[1], row)
            state[0] += 1
            for f, v in zip(self._fields, values):
                state[2][f][v] += 1
            return
        if state is None or any(state[2][f][v] <= 0 for f, v in zip(self._fields, values)):
            raise ValueError(f"changelog_aggregate: a retraction of a row group {g!r} does not hold")
        self._subtract(state[1], row)
        state[0] -= 1
        for f, v in zip(self._fields, values):
            counts = state[2][f]
            counts[v] -= 1
            if not counts[v]:
                del counts[v]
        if state[0] == 0:
            del self._groups[g]                 # no float residue survives an emptied group

    def _result(self, g: Any, state: list, version: int) -> dict:
        out: list = []
        self._rows([(g, state[1])], None, None, out.append)
        row = {"op": "upsert", self.by: g, "version": version, **out[0]}
        for name, (pick, fld) in self._multiset.items():
            row[name] = pick(state[2][fld])
        return row

    # -- state: groups ------------------------------------------------------------------
    def snapshot(self) -> dict:
        return {"aggregates": self.aggregates, "versions": dict(self._versions),
                "groups": {g: [n, list(s), {f: Counter(c) for f, c in m.items()}]
                           for g, (n, s, m) in self._groups.items()}}

    def restore(self, state: dict) -> None:
        if state["aggregates"] != self.aggregates:
            raise ValueError(f"changelog_aggregate: the checkpoint computed {state['aggregates']}, "
                             f"this operator {self.aggregates}")
        self._versions = dict(state["versions"])
        self._groups = {g: [n, list(s), {f: Counter(c) for f, c in m.items()}]
                        for g, (n, s, m) in state["groups"].items()}

    def split_state(self, state: dict, owns: Callable[[Any], bool]) -> dict:
        """The groups where ``owns(group)``."""
        return {**state, "groups": {g: v for g, v in state["groups"].items() if owns(g)},
                "versions": {g: v for g, v in state["versions"].items() if owns(g)}}

    def merge_states(self, states: list) -> dict:
        """Every instance's groups (disjoint: copies are routed by group)."""
        return {**states[0], "groups": {g: v for st in states for g, v in st["groups"].items()},
                "versions": {g: v for st in states for g, v in st["versions"].items()}}
