"""The time window's panes in the disk backend: the store is their home, the panes dict a write buffer.

On ``deploy(state="disk")`` a :class:`~pescheduler.operators.window.Window` keeps its
panes in its operator's :class:`~pescheduler.state.DiskState`, one entry per key:
``key -> {pane start: [seq, slots]}`` (``seq``: the order the key was first seen in
that pane, so a fired window lists its keys exactly as the dict panes do). The per-tuple
path is unchanged: tuples fold into the window's ``_panes`` dicts, which here are only a
write buffer, *spilled* into the store (a get, a merge of the pane's partial slots, a
put per buffered key) when it holds more than ``Window.buffer_entries`` (key, pane)
entries, and before a snapshot or an export. So the window's memory is the buffer, the
store's cache and the rows of the windows firing, whatever its number of keys. While the
store holds no pane (a state that fits in the buffer) windows fire from the buffer exactly
as on ``memory``, at its speed; once it holds some, the buffer is spilled before a window
fires or panes expire, and windows fire from the store.

A watermark that fires a window (or expires panes) reads the store one key group at a
time: each key's panes of every firing window are merged, panes no window can reach any
more are removed, and the rows are emitted window by window, by end, keys in first-seen
order. The store's key groups are what a snapshot (``form: keys``, written incrementally
by the worker), a rescale (``export_groups``/``import_groups``) and a restore move.

The ``memory`` backend does not come here: its panes stay the window's dicts (a
plain dict fold per tuple; a store lookup per tuple measured 1.3-1.6x slower,
docs/state.md).
"""

from __future__ import annotations

from operator import itemgetter
from typing import Any, Iterator

from pescheduler.state import backend_name, keyed_state, unpack_group
from pescheduler.state.groups import (GroupMemo, add_groups, pack_namespaced, restore_groups, snapshot_groups,
                                      take_groups, take_namespaced, unpack_namespaced)

_by_place = itemgetter(0, 1)
_first = itemgetter(0)


def open_store(op: Any, context: Any) -> Any:
    """The window's store when its deployment's backend is ``disk``, else None."""
    if op._store is None and backend_name(context.extra.get("state")) == "disk":
        return keyed_state(context, "panes")
    return op._store


def buffered(op: Any) -> int:
    """(key, pane) entries waiting in the write buffer."""
    return sum(map(len, op._panes.values()))


def spill(op: Any) -> None:
    """Move the write buffer into the store: one multi-get and one write batch for the buffered
    keys. A pane entry
    new to the store takes the next ``seq`` (panes ascending, keys first-seen), one already
    there merges the buffered slots after its own (they are later tuples of the same pane)."""
    panes = op._panes
    if not panes:
        return
    store, merge, seq = op._store, op._merge, op._seq
    per_key: dict = {}
    for p in sorted(panes):
        for k, s in panes[p].items():
            seq += 1
            per_key.setdefault(k, []).append((p, seq, s))
    keys = list(per_key)
    found = store.get_many(keys)                  # one multi-get, one write batch
    for k, held in zip(keys, found):
        if held is None:
            per_key[k] = {p: [q, s] for p, q, s in per_key[k]}
            continue
        for p, q, s in per_key[k]:
            e = held.get(p)
            if e is None:
                held[p] = [q, s]
            else:
                e[1] = merge(e[1], s)
        per_key[k] = held
    store.write_many(per_key.items())
    op._seq = seq
    op._starts.update(panes)
    op._panes = {}


def on_watermark(op: Any, watermark: int, emit: Any) -> None:
    """Fire the windows ``watermark`` completes and expire the panes none can reach, from the store."""
    op._wm = watermark
    bound = watermark - op.size + 1
    starts = sorted(op._starts.union(op._panes))
    if starts:
        fires: list = []
        op._fire(starts, watermark + 1, lambda sel, ws, we: fires.append((sel, ws, we)))
        if fires or starts[0] <= bound:
            spill(op)
            _fire_and_expire(op, fires, bound, emit)
    op._fired_end = (watermark + 1) - (watermark + 1) % op.slide


def _fire_and_expire(op: Any, fires: list, bound: int, emit: Any) -> None:
    """One pass over the store, a key group at a time (its entries read, then written back in one
    batch)."""
    store, merge = op._store, op._merge
    rows: list[list] = [[] for _ in fires]
    for g in store.groups():
        puts, deletes = [], []
        for k, held in list(store.items(g)):
            for i, (sel, _ws, _we) in enumerate(fires):
                place = merged = None
                for p in sel:
                    e = held.get(p)
                    if e is None:
                        continue
                    if place is None:
                        place, merged = (p, e[0]), e[1]
                    else:
                        merged = merge(merged, e[1])
                if place is not None:
                    rows[i].append((place, k, merged))
            old = [p for p in held if p <= bound]
            if len(old) == len(held):
                deletes.append(k)
            elif old:
                for p in old:
                    del held[p]
                puts.append((k, held))
        store.write_many(puts, deletes)
    op._starts = {p for p in op._starts if p > bound}
    for (_sel, ws, we), found in zip(fires, rows):
        found.sort(key=_first)
        op._emit([(k, m) for _place, k, m in found], ws, we, emit.append)


def slot_lists(op: Any) -> Iterator[list]:
    """Every stored slot list, each key group put back once its lists were changed (a query left)."""
    spill(op)
    store = op._store
    for g in store.groups():
        entries = list(store.items(g))
        for _k, held in entries:
            yield from (e[1] for e in held.values())
        for k, held in entries:
            store.put(k, held)


def snapshot(op: Any) -> dict:
    """The store's key groups as a view (written incrementally by a checkpoint), with the seq
    counter and the pane starts held."""
    spill(op)
    return {"layout": op.plan.layout, "size": op.size, "slide": op.slide, "form": "keys",
            "groups": snapshot_groups(op._store), "seq": op._seq, "starts": sorted(op._starts),
            "watermark": op._wm, "fired_end": op._fired_end}


def restore_keys(op: Any, state: dict | None) -> None:
    """Make the store hold exactly a ``form: keys`` snapshot's groups (None: nothing), and the
    write buffer an exported part's buffered entries (``buffer``: :func:`export_groups`)."""
    restore_groups(op._store, {} if state is None else state["groups"])
    op._seq = 0 if state is None else state["seq"]
    op._starts = set() if state is None else set(state["starts"])
    op._panes = unpack_namespaced(state.get("buffer") or {}) if state is not None else {}


def export_groups(op: Any, groups: frozenset[int]) -> dict:
    """Key groups ``groups`` taken out of the store, packed when the part is pickled, and their
    entries in the write buffer taken out of it (``buffer``, as namespaced groups: deltas on the
    stored ones, added to the receiving instance's buffer). The whole buffer spilled here, in the
    PE's turn, was most of a Replicate's pause at 10^5 keys (95-103 ms: up to ``buffer_entries``
    keys read and written); the moving part of it now goes as it is, the rest stays."""
    return {"form": "keys", "seq": op._seq, "starts": sorted(op._starts), "groups": take_groups(op._store, groups),
            "buffer": take_namespaced(op._panes, groups, op._group_of)}


def import_groups(op: Any, state: dict) -> None:
    """Another instance's exported groups into this one's store, their buffered entries into its
    write buffer (the groups are new here: no entry of theirs is buffered)."""
    add_groups(op._store, state["groups"])
    op._seq = max(op._seq, state["seq"])
    op._starts.update(state["starts"])
    for p, table in unpack_namespaced(state.get("buffer") or {}).items():
        op._panes.setdefault(p, {}).update(table)


def keys_to_panes(groups: Any) -> dict:
    """``{pane start: {key: slots}}`` of a ``form: keys`` snapshot's groups, keys first-seen."""
    found = []
    for _g, (_key, data) in groups.items():
        entries = data if type(data) is dict else unpack_group(data)
        for k, held in entries.items():
            for p, (q, s) in held.items():
                found.append((p, q, k, s))
    found.sort(key=_by_place)
    panes: dict = {}
    for p, _q, k, s in found:
        panes.setdefault(p, {})[k] = s
    return panes


def stored(state: dict) -> Any:
    """A ``form: keys`` state's stored groups; refused with buffered entries (an exported disk
    part's ``buffer``: deltas on the stored entries, which only a disk window merges)."""
    if state.get("buffer"):
        raise ValueError("a disk window's exported key groups with buffered entries go only into a disk window")
    return state["groups"]


def as_panes(state: dict, memo: GroupMemo) -> dict:
    """A snapshot in the dict panes' form (a ``form: keys`` one converted; others as they are)."""
    if state.get("form") != "keys":
        return state
    out = {k: v for k, v in state.items() if k not in ("form", "seq", "starts", "buffer")}
    out["groups"] = pack_namespaced(keys_to_panes(stored(state)), memo)
    return out
