"""Vectorised pane state for the event-time window: Arrow batches in, Arrow batches out.

The window (``window.py``) hands a ``pyarrow.RecordBatch`` here when its plan
is one query of ``count``/``sum``/``sumsq``/``min``/``max`` (and ``avg`` over
them) keyed by a field. Keys get a dense index (first seen first); a pane
keeps one numpy array per slot over that index, so a batch costs a few numpy
calls per pane instead of Python work per tuple. Sums use ``np.add.at``,
which adds in row order exactly as the per-tuple code does, so the results
are bit-identical to the row path (a test checks it).

Anything else (nulls in a read column, an unsupported aggregate, a mix of row
and columnar state) is handed back as "not handled" and the window takes
rows, after :meth:`ColumnarPanes.to_dicts` turned the arrays into its
ordinary ``{pane: {key: slots}}`` state. Keys map to slots in
``key_slots.py``, vectorised whatever dictionary each batch brings.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pescheduler.state import KEY_GROUPS
from pescheduler.state.groups import split_by_group

from .key_slots import KeySlots
from .pane_layers import TakenGroups

_BASE = {"count", "sum", "sumsq", "min", "max"}


def columnar_spec(plan: Any, query: Any, key: Any, named: bool) -> list | None:
    """Per output ``(name, kind, slot(s))`` if this window can run columnar, else None."""
    if named or not isinstance(key, str) or not plan.slots:
        return None
    if any(n.aggregate.name not in _BASE for n in plan.slots):
        return None
    outs = []
    for name, node in query.outputs:
        agg = node.aggregate
        if agg.is_base and agg.name in _BASE:
            outs.append((name, "slot", node.slot))
        elif agg.name == "avg":
            by = {u.aggregate.name: u.slot for u in node.uses}
            outs.append((name, "avg", (by["sum"], by["count"])))
        else:
            return None
    return outs


_NEVER = np.iinfo(np.int64).max
_SPARE_PANES = 4           # fired panes kept for reuse: a tumbling window makes one a slide, a sliding a few
ROWS = 4096                # keys a pane's rows are made for at a time (PaneRows)


def _ascending(ts: np.ndarray) -> bool:
    """Event times in order: panes are then slices (views), not masked copies of every column."""
    return len(ts) < 2 or bool((ts[1:] >= ts[:-1]).all())


class _Pane:
    """One pane's slot arrays over the key index; ``first[k]``: when key ``k`` first arrived."""

    __slots__ = ("slots", "present", "first")

    def __init__(self, slots: list, capacity: int) -> None:
        self.slots = slots
        self.present = np.zeros(capacity, dtype=bool)
        self.first = np.full(capacity, _NEVER, dtype=np.int64)

    def copy(self) -> "_Pane":
        twin = _Pane([s.copy() for s in self.slots], 0)
        twin.present, twin.first = self.present.copy(), self.first.copy()
        return twin

    def order(self) -> np.ndarray:
        """The pane's key indices, first seen first."""
        keys = np.flatnonzero(self.present)
        return keys[np.argsort(self.first[keys])]     # arrival numbers are unique: any sort will do


class ColumnarPanes:
    """``{pane_start: _Pane}`` plus the dense key index they share."""

    def __init__(self, plan: Any, key: str, ts_field: str, slide: int, size: int, outputs: list) -> None:
        self.kinds = [(n.aggregate.name, n.field) for n in plan.slots]
        self.key, self.ts_field, self.slide, self.size, self.outputs = key, ts_field, slide, size, outputs
        self.panes: dict[int, _Pane] = {}
        self.keys = KeySlots()              # key -> slot, shared by every pane
        self._dict_cache: tuple = (None, None)
        self._slots = np.empty(0, dtype=np.int64)     # the batch's key indices and slots (_key_indices)
        self._spare: list[_Pane] = []                  # fired panes, their arrays kept for new ones
        self.seq = 0                        # tuples folded so far: arrival order across batches
        self.dtypes: dict = {}

    # -- in -------------------------------------------------------------------------------
    def add(self, batch: Any, lim: int, late: Callable) -> bool:
        """Fold ``batch`` in; False (nothing changed) when it needs the row path."""
        cols = {}
        for name in {self.ts_field, *(f for kind, f in self.kinds if kind != "count")}:
            i = batch.schema.get_field_index(name)
            if i < 0:
                return False
            arr = batch.column(i)
            if arr.null_count or not (pa.types.is_integer(arr.type) or pa.types.is_floating(arr.type)):
                return False
            cols[name] = arr.to_numpy()
            if name != self.ts_field and self.dtypes.setdefault(name, cols[name].dtype) != cols[name].dtype:
                return False
        ki = batch.schema.get_field_index(self.key)
        if ki < 0 or batch.column(ki).null_count:
            return False
        gidx = self._key_indices(batch.column(ki))
        ts = cols[self.ts_field]
        if not len(ts):
            return True
        slide = self.slide
        # Panes are found from the batch's time range and a few comparisons,
        # not a modulo per row (the costliest line of this method before).
        lo_ts, hi_ts = int(ts.min()), int(ts.max())
        late_below = lim - lim % slide + slide       # ts below: its pane starts at or before lim
        if lo_ts < late_below:
            is_late = ts < late_below
            for t in batch.filter(pa.array(is_late)).to_pylist():
                late(t)
            keep = ~is_late
            gidx, cols = gidx[keep], {k: v[keep] for k, v in cols.items()}
            ts = cols[self.ts_field]
            if not len(ts):
                return True
            lo_ts = int(ts.min())
        base, self.seq = self.seq, self.seq + len(ts)   # arrival numbers of these rows: base + position
        cols = {f: cols[f] for kind, f in self.kinds if kind != "count"}     # what the slots read
        lo, hi = lo_ts - lo_ts % slide, hi_ts - hi_ts % slide
        if lo == hi:
            self._fold(lo, gidx, cols, base, None)
            return True
        if _ascending(ts):                          # in time order (most sources): each pane is a slice
            cuts = np.searchsorted(ts, np.arange(lo + slide, hi + 1, slide, dtype=np.int64)).tolist()
            start = 0
            for p, stop in zip(range(lo, hi + 1, slide), [*cuts, len(ts)]):
                if stop > start:
                    self._fold(p, gidx[start:stop], {k: v[start:stop] for k, v in cols.items()}, base + start, None)
                start = stop
            return True
        if hi - lo == slide:                        # two panes: one comparison
            second = ts >= hi
            parts = [(lo, ~second), (hi, second)]
        elif (hi - lo) // slide < 64:               # a few panes: bucket by binary search
            bounds = np.arange(lo + slide, hi + 1, slide, dtype=np.int64)
            bucket = np.searchsorted(bounds, ts, side="right")
            parts = ((p, bucket == j) for j, p in enumerate(range(lo, hi + 1, slide)))
        else:
            bucket = ts - ts % slide
            parts = ((p, bucket == p) for p in np.unique(bucket).tolist())
        for p, sel in parts:
            if sel.any():
                self._fold(p, gidx[sel], {k: v[sel] for k, v in cols.items()}, base, sel)
        return True

    def _key_indices(self, arr: Any) -> np.ndarray:
        if not pa.types.is_dictionary(arr.type):
            arr = pc.dictionary_encode(arr)
        dictionary = arr.dictionary
        known, mapping = self._dict_cache
        if known is None or not (known is dictionary or known.equals(dictionary)):
            mapping = self.keys.slots(dictionary)
            self._dict_cache = (dictionary, mapping)
        indices, n = arr.indices.to_numpy(), len(arr)
        if len(self._slots) < 2 * n:             # buffers reused by every batch: no fresh pages per batch
            self._slots = np.empty(max(2 * n, 2 * len(self._slots)), dtype=np.int64)
        at, out = self._slots[:n], self._slots[n:2 * n]
        np.copyto(at, indices, casting="same_kind")   # take() would make its own int64 copy of int32 indices
        return np.take(mapping, at, out=out, mode="clip")       # mode "raise" copies ``out`` too

    def _pane(self, p: int) -> _Pane:
        """Pane ``p``, made or grown to every key known so far."""
        n = len(self.keys)
        pane = self.panes.get(p)
        if pane is None:
            pane = self.panes[p] = self._new_pane(n)
        elif len(pane.present) < n:
            self._grow(pane, n)
        return pane

    def _fold(self, p: int, idx: np.ndarray, cols: dict, base: int, sel: np.ndarray | None) -> None:
        """Add rows ``idx`` (key indices; the batch's rows where ``sel``, all if None) to pane ``p``;
        ``base``: the arrival number of the batch's first row (of ``idx``'s first when ``sel`` is None)."""
        pane = self._pane(p)
        fresh = ~pane.present[idx]
        if fresh.any():                              # keys new to the pane: note their first arrival
            new = idx[fresh]
            at = np.flatnonzero(fresh) if sel is None else np.flatnonzero(sel)[fresh]
            np.minimum.at(pane.first, new, at + base)
            pane.present[new] = True
        for s, (kind, f) in zip(pane.slots, self.kinds):
            if kind == "count":
                s += np.bincount(idx, minlength=len(s))
            elif kind == "sum":
                np.add.at(s, idx, cols[f])
            elif kind == "sumsq":
                v = cols[f]
                np.add.at(s, idx, v * v)
            elif kind == "min":
                np.minimum.at(s, idx, cols[f])
            else:
                np.maximum.at(s, idx, cols[f])

    def _new_pane(self, n: int) -> _Pane:
        """An empty pane over ``n`` keys: a fired one's arrays refilled when it has as many keys. A pane
        is a few arrays of one entry per key; made afresh, each one is new pages to fault in (the
        allocator gives them back when a pane is dropped), a cost a fresh worker paid every pane."""
        while self._spare:
            pane = self._spare.pop()
            if len(pane.present) == n and len(pane.slots) == len(self.kinds):
                pane.present.fill(False)
                pane.first.fill(_NEVER)
                for s, (kind, f) in zip(pane.slots, self.kinds):
                    s.fill(self._fill(kind, s.dtype))
                return pane
        return _Pane([self._empty(kind, f, n) for kind, f in self.kinds], n)

    def _dtype(self, kind: str, f: Any) -> Any:
        return np.int64 if kind == "count" else self.dtypes.get(f, np.float64)

    def _empty(self, kind: str, f: Any, n: int) -> np.ndarray:
        dtype = self._dtype(kind, f)
        return np.full(n, self._fill(kind, dtype), dtype=dtype)

    @staticmethod
    def _fill(kind: str, dtype: Any) -> Any:
        """A slot's value before any row: 0 for counts and sums, the dtype's far end for min and max."""
        if kind in ("count", "sum", "sumsq"):
            return 0
        if np.issubdtype(dtype, np.floating):
            return np.inf if kind == "min" else -np.inf
        return np.iinfo(dtype).max if kind == "min" else np.iinfo(dtype).min

    def _grow(self, pane: _Pane, n: int) -> None:
        extra = n - len(pane.present)
        pane.present = np.concatenate([pane.present, np.zeros(extra, dtype=bool)])
        pane.first = np.concatenate([pane.first, np.full(extra, _NEVER, dtype=np.int64)])
        pane.slots = [np.concatenate([s, self._empty(kind, f, extra)])
                      for s, (kind, f) in zip(pane.slots, self.kinds)]

    # -- out ------------------------------------------------------------------------------
    def window(self, starts: list, ws: int, we: int) -> Any:
        """One window's rows as a RecordBatch: panes merged in order, keys first seen first."""
        n = len(self.keys)
        for p in starts:
            if len(self.panes[p].present) < n:
                self._grow(self.panes[p], n)
        first = self.panes[starts[0]]
        if len(starts) == 1:
            order, slots = first.order(), first.slots
        else:
            seen, order_parts = first.present.copy(), [first.order()]
            slots = [s.copy() for s in first.slots]
            for p in starts[1:]:
                pane = self.panes[p]
                o = pane.order()
                order_parts.append(o[~seen[o]])
                seen |= pane.present
                for acc, s, (kind, _f) in zip(slots, pane.slots, self.kinds):
                    if kind in ("count", "sum", "sumsq"):
                        np.add(acc, s, out=acc)
                    elif kind == "min":
                        np.minimum(acc, s, out=acc)
                    else:
                        np.maximum(acc, s, out=acc)
            order = np.concatenate(order_parts)
        m = len(order)
        keys = self.keys.array()
        # String keys stay dictionary-encoded, as they came: indices into the key list, no string copied.
        arrays = [pa.DictionaryArray.from_arrays(order.astype(np.int32), keys)
                  if pa.types.is_string(keys.type) or pa.types.is_large_string(keys.type)
                  else keys.take(pa.array(order)),
                  pa.array(np.full(m, ws, dtype=np.int64)), pa.array(np.full(m, we, dtype=np.int64))]
        names = [self.key, "window_start", "window_end"]
        for name, kind, ref in self.outputs:
            if kind == "slot":
                arrays.append(pa.array(slots[ref][order]))
            else:
                total, count = slots[ref[0]][order], slots[ref[1]][order]
                arrays.append(pa.array(total / count if np.issubdtype(total.dtype, np.floating)
                                       else total.astype(np.float64) / count))
            names.append(name)
        return pa.RecordBatch.from_arrays(arrays, names=names)

    def drop(self, bound: int) -> None:
        for p in [p for p in self.panes if p <= bound]:
            pane = self.panes.pop(p)
            if len(self._spare) < _SPARE_PANES:
                self._spare.append(pane)

    def to_dicts(self) -> dict:
        """The state as the window's ``{pane: {key: slots}}`` (Python values, keys in order)."""
        keys = self.keys.keys
        return {p: dict(PaneRows(pane, keys).items()) for p, pane in sorted(self.panes.items())}

    def frozen(self) -> Callable[[], dict]:
        """The panes as they are now, for a checkpoint: each pane's arrays copied (a ``memcpy``
        each, in the PE's turn), and what reads them as rows (``{pane start: PaneRows}``) in
        whichever thread calls it (a checkpoint's writer). Made in the turn, the rows stopped the
        stream for a time that grew with the keys (a Python list per key, and every key packed by
        key group there: 3.9-5.7 s at 10^6 keys). The key list only grows: the copies read its
        first keys."""
        panes = {p: pane.copy() for p, pane in self.panes.items()}
        slots, n = self.keys, len(self.keys)

        def rows() -> dict:
            slots.grouped(n)                # the keys' groups made here, for a rescale's export
            return {p: PaneRows(pane, slots.keys) for p, pane in sorted(panes.items())}
        return rows

    def add_rows(self, tables: dict) -> bool:
        """Rows of key groups another instance held (a rescale's import: ``{pane start: {key:
        slots}}``, disjoint from the keys present here) put into the arrays, each key after the
        ones seen so far, as a row window's ``update`` appends them; False (nothing changed) when a
        value does not fit its slot's array. Made rows, a window of 10^6 keys took them back in
        0.19-0.24 s in the gaining turn."""
        columns = {}
        for p, table in tables.items():
            if table:
                try:
                    columns[p] = [np.array(col, dtype=self._dtype(kind, f))
                                  for col, (kind, f) in zip(zip(*table.values()), self.kinds)]
                except (TypeError, ValueError, OverflowError):
                    return False
                if len(columns[p]) != len(self.kinds):
                    return False
        for p, cols in columns.items():
            idx = self.keys.looked_up(list(tables[p]))
            pane = self._pane(p)
            pane.present[idx] = True
            pane.first[idx] = np.arange(self.seq, self.seq + len(idx))
            self.seq += len(idx)
            for s, col in zip(pane.slots, cols):
                s[idx] = col
        return True

    def export(self, groups: frozenset[int]) -> "TakenColumns":
        """A rescale takes key groups ``groups``: each pane copied as at a snapshot, the moving
        rows made from the copies by whoever reads them (:class:`TakenColumns`: the part, when
        pickled, off the turn), and the moving keys cleared here (not present, slots as before
        any row), in numpy: the panes stay arrays. Made rows in the turn, a window of 10^6 keys
        paused 1.4-2.1 s. The keys' groups come from ``KeySlots.grouped`` (made by the last
        checkpoint's writer; here only for the keys since)."""
        of = self.keys.grouped(len(self.keys))
        gone = np.zeros(KEY_GROUPS, dtype=bool)
        gone[list(groups)] = True
        moving = gone[of]
        taken = {}
        for p, pane in sorted(self.panes.items()):
            taken[p] = pane.copy()
            idx = np.flatnonzero(moving[:len(pane.present)] & pane.present)
            pane.present[idx] = False
            pane.first[idx] = _NEVER
            for s, (kind, _f) in zip(pane.slots, self.kinds):
                s[idx] = self._fill(kind, s.dtype)
        return TakenColumns(taken, self.keys.keys, of, gone)


class TakenColumns(TakenGroups):
    """A rescale's moving key groups of a columnar window (:meth:`ColumnarPanes.export`): the
    panes' arrays as copied at the export, read once by the first group asked for (a
    ``TakenPane`` pickled in the hand-over's thread), each pane's moving rows only: a key's
    place is its rank in the pane's first-seen order (numpy), its group the one ``KeySlots``
    made. Rows of every key, grouped by a crc each, took the move 2.0-2.9 s at 10^6 keys
    against 1.45 for the rows the turn made before (a Release right after waited for it)."""

    def __init__(self, panes: dict, keys: list, of: np.ndarray, gone: np.ndarray) -> None:
        super().__init__()
        self._panes, self._keys, self._of, self._gone = panes, keys, of, gone

    def _done(self) -> None:
        self._panes = {}

    def _read(self) -> dict[int, dict]:
        out: dict[int, dict] = {}
        keys = self._keys
        for p, pane in sorted(self._panes.items()):
            order = pane.order()                            # every key of the pane, first seen first
            of = self._of[order]
            ranks = np.flatnonzero(self._gone[of])           # the moving ones' places, ascending
            for g, places in split_by_group(ranks.tolist(), of[ranks].tobytes()).items():
                out.setdefault(g, {})[p] = (places, dict(_rows(pane, keys, order[places])))
        return out


class PaneRows:
    """One pane's ``(key, slots)`` in first-seen order, made from its arrays a slice of
    :data:`ROWS` keys at a time: no call over the whole pane holds the GIL (``tolist`` of 10^6
    values: 20-40 ms), and no dict of the pane's size is built (a checkpoint's writer reads the
    rows once, by key group: ``pane_layers.pane_groups``)."""

    __slots__ = ("pane", "keys")

    def __init__(self, pane: _Pane, keys: list) -> None:
        self.pane, self.keys = pane, keys

    def items(self) -> Any:
        order = self.pane.order()
        for i in range(0, len(order), ROWS):
            yield from _rows(self.pane, self.keys, order[i:i + ROWS])


def _rows(pane: _Pane, keys: list, at: np.ndarray) -> Any:
    """``(key, slots)`` of the key indices ``at`` of ``pane``, in their order."""
    return zip(map(keys.__getitem__, at.tolist()), map(list, zip(*[s[at].tolist() for s in pane.slots])))

