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

State: per group ``[rows counted, slots, {field: Counter}, version]`` (an emptied group keeps
its version), in the deployment's keyed state backend (``pescheduler.state``: memory or disk,
docs/state.md): a snapshot holds whole key groups and a rescale moves key groups, as ``latest``'s.
"""

from __future__ import annotations

from collections import Counter
from typing import Any, Callable

from pescheduler.aggregates import AggregatePlan, parse_request
from pescheduler.operator import Emitter, Operator, OperatorContext, Parallelism
from pescheduler.state import MemoryState, adopt, key_group, pack_group
from pescheduler.state.groups import add_groups, merge_groups, restore_groups, snapshot_groups, split_groups, take_groups

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
        # group -> [rows counted, slots, {field: Counter}, rows emitted for it (its version)]; in
        # memory until open() moves it to the deployment's backend (restore comes before open)
        self._groups = MemoryState()
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

    def open(self, context: OperatorContext) -> None:
        super().open(context)
        self._groups = adopt(context, self._groups)

    # -- data -------------------------------------------------------------------------
    def process(self, batch: list, emit: Emitter) -> None:
        """One backend read and at most one write per group the batch touches (a group put since the
        snapshot is changed in place, no read or write: ``writable``), then one row per group."""
        keys, by = self._groups, self.by
        written = keys.writable() or {}          # None on disk (copies): every group is put back
        touched: dict[Any, list] = {}            # group -> [state, held before the batch, to put]
        for t in batch:
            try:
                g = t[by]
                entry = touched.get(g)
                if entry is None:
                    state = written.get(g)
                    fresh = state is None
                    entry = [keys.get(g) if fresh else state, False, fresh]
                    entry[1] = entry[0] is not None and entry[0][0] > 0
                entry[0] = self._apply(g, t, entry[0])
                touched.setdefault(g, entry)
            except Exception as exc:            # _apply changes nothing before it raises
                emit.dead_letter(t, exc)
        puts = []
        for g, (state, held, fresh) in touched.items():
            if state[0] == 0 and not held:      # made and emptied within the batch: never seen (a
                continue                        # group read back to what the backend holds: no put)
            state[3] += 1
            if fresh:
                puts.append((g, state))
            if state[0] == 0:
                emit({"op": "delete", by: g, "version": state[3], **dict.fromkeys(self.aggregates)})
            else:
                emit(self._result(g, state, state[3]))
        if puts:
            keys.write_many(puts)

    def _apply(self, g: Any, t: dict, state: list | None) -> list:
        """``t`` folded into (or subtracted from) its group's ``state``: ``[rows, slots, {field:
        Counter}, version]``, rows 0 when the group holds none (then only its version counts)."""
        row = t["row"]
        if self.by not in row:
            raise KeyError(f"changelog_aggregate: the row has no group field {self.by!r}")
        values = [row[f] for f in self._fields]
        if t["sign"] > 0:
            for v in values:
                v < v                            # noqa: B015 - a value min/max cannot order is refused now
            if state is None:
                state = [0, self._fold(None, row), {f: Counter() for f in self._fields}, 0]
            elif state[0] == 0:                 # changed in place: it may be the backend's own list
                state[1], state[2] = self._fold(None, row), {f: Counter() for f in self._fields}
            else:
                self._fold(state[1], row)
            state[0] += 1
            for f, v in zip(self._fields, values):
                state[2][f][v] += 1
            return state
        if state is None or state[0] == 0 or any(state[2][f][v] <= 0 for f, v in zip(self._fields, values)):
            raise ValueError(f"changelog_aggregate: a retraction of a row group {g!r} does not hold")
        self._subtract(state[1], row)
        state[0] -= 1
        for f, v in zip(self._fields, values):
            counts = state[2][f]
            counts[v] -= 1
            if not counts[v]:
                del counts[v]
        if state[0] == 0:
            state[1] = state[2] = None          # no float residue survives an emptied group
        return state

    def _result(self, g: Any, state: list, version: int) -> dict:
        out: list = []
        self._rows([(g, state[1])], None, None, out.append)
        row = {"op": "upsert", self.by: g, "version": version, **out[0]}
        for name, (pick, fld) in self._multiset.items():
            row[name] = pick(state[2][fld])
        return row

    # -- state: groups, in whole key groups -------------------------------------------------
    def snapshot(self) -> dict:
        """The key groups of the keyed state (packed when read: a copy)."""
        return {"aggregates": self.aggregates, "groups": snapshot_groups(self._groups)}

    def restore(self, state: dict) -> None:
        self._check(state)
        restore_groups(self._groups, _groups(state))

    def _check(self, state: dict) -> None:
        if state["aggregates"] != self.aggregates:
            raise ValueError(f"changelog_aggregate: the checkpoint computed {state['aggregates']}, "
                             f"this operator {self.aggregates}")

    def export_groups(self, groups: frozenset[int]) -> dict:
        """A rescale takes key groups ``groups`` away: their groups' aggregates, removed here, packed
        only when the part is pickled (pescheduler/worker/handover.py)."""
        return {"aggregates": self.aggregates, "groups": take_groups(self._groups, groups)}

    def import_groups(self, state: dict) -> None:
        """Key groups another instance exported join this running one."""
        self._check(state)
        add_groups(self._groups, state["groups"])

    def split_state(self, state: dict, owns: Callable[[Any], bool]) -> dict:
        """The key groups where ``owns(group)``."""
        return {"aggregates": state["aggregates"], "groups": split_groups(_groups(state), owns)}

    def merge_states(self, states: list) -> dict:
        """Every instance's key groups (disjoint: copies are routed by group)."""
        return {"aggregates": states[0]["aggregates"],
                "groups": merge_groups([_groups(s) for s in states])}


def _groups(state: dict) -> dict:
    """A snapshot's key groups; one a checkpoint took while the groups were dicts of the operator's
    own (``groups``: ``{group: [n, slots, multisets]}`` and ``versions``) is grouped here, so it
    still restores."""
    if "versions" not in state:
        return state["groups"]
    by_group: dict[int, list] = {}
    held = state["groups"]
    for g in {**dict.fromkeys(held), **dict.fromkeys(state["versions"])}:
        version = state["versions"].get(g, 0)
        if g in held:
            n, slots, multisets = held[g]
            value = [n, list(slots), {f: Counter(c) for f, c in multisets.items()}, version]
        else:
            value = [0, None, None, version]
        by_group.setdefault(key_group(g), []).append((g, value))
    return {kg: (items[0][0], pack_group(items)) for kg, items in by_group.items()}
