"""Event-time windows: tumbling or sliding, keyed, with shared incremental aggregates.

``window(size, slide=None, aggregates={name: (function, field)})`` emits one
dict per key and window::

    {"car": "car-0042", "window_start": 1_700_000_040_000,
     "window_end": 1_700_000_100_000, "avg_speed": 13.9}

Times are milliseconds, windows are aligned to multiples of ``slide`` (of
``size`` when tumbling) and their end is exclusive. A sliding window is
incremental: the stream is cut into *panes* of ``slide``, each tuple updates
the accumulators of one pane, and a window's result merges its
``size / slide`` panes (so ``size`` must be a multiple of ``slide``).

Firing: window ``[start, end)`` fires when the watermark reaches ``end - 1``.
Windows fire in order of ``window_end``; within a window, keys come in the
order they were first seen in its panes (earliest pane first). The end of the
stream (watermark ``MAX_WATERMARK``) fires every window still open. A
``flush`` without end of stream fires nothing: a keyed window's open state
moves by ``snapshot``/``restore``, it is not emitted half-done.

Late events: a tuple whose pane can no longer reach any unfired window
(``pane_start + size - 1 <= watermark``) goes to the ``late`` side output,
where the runtime counts it; nothing is dropped silently. A tuple that cannot
be aggregated (missing field, wrong type) is dead-lettered alone; the rest of
its batch counts.

Several named queries can share one window (``queries={query_id:
aggregates}``, then ``add_query`` / ``remove_query`` while the stream runs):
see :class:`AggregatingWindow`, the base of every window kind here and in
``session.py``, ``count_window.py`` and ``over_window.py``.

State (:class:`Window`): on the ``memory`` backend the panes are the operator's dicts
(``{pane start: {key: slots}}``: the hot path is a dict fold, no key-group lookup per
tuple); a checkpoint freezes them as they are and its writer packs them off the PE's loop
(``pane_layers.py``). On ``disk`` (``deploy(state="disk")``) those dicts are only a write buffer of
at most ``Window.buffer_entries`` (key, pane) entries, spilled into the operator's
store (``key -> {pane start: [seq, slots]}``, ``seq`` the first-seen order) when full
and at a snapshot or export; once the store holds panes, windows fire from it
(``window_store.py``). Either way a rescale moves key groups
(``export_groups``/``import_groups``).
"""

from __future__ import annotations

import sys
from bisect import bisect_left
from operator import itemgetter
from typing import Any, Callable, Iterable

from pescheduler.aggregates import AggregatePlan, Query
from pescheduler.operator import MIN_WATERMARK
from pescheduler.operator import Emitter, Operator, OperatorContext, Parallelism
from pescheduler.state.groups import GroupMemo, merge_groups, snapshot_groups, split_groups, unpack_namespaced

from . import window_store
from .pane_layers import PaneLayers, TakenPane, representative, slot_copier
from pescheduler.timeutil import parse_duration

RESERVED = ("window_start", "window_end")


def _plugin_aggregates() -> dict:
    """The aggregates registered by plug-ins (the built-ins are the plan's fallback)."""
    from pescheduler.plugins import active_plugins

    return active_plugins().aggregates


class AggregatingWindow(Operator):
    """What every window kind shares: the aggregate plan, its queries and their rows.

    One instance serves one query (``aggregates={name: (function, field)}``:
    it emits plain rows) or several named ones (``queries={query_id:
    aggregates}``: it emits ``(query_id, row)`` pairs). Named queries share
    one :class:`AggregatePlan`, so each distinct aggregate is computed once
    per window however many queries read it; :meth:`add_query` and
    :meth:`remove_query` change the plan while the stream runs, keeping the
    state of every aggregate still in use (the Oracle data-stream method).

    Subclasses keep slot lists in their state, implement ``_slot_lists`` (every
    live one, for compaction when a query leaves) and ``_compile_state`` (the
    generated code their hot path calls), and call ``_emit`` to fire a window.
    """

    parallelism = Parallelism.KEYED
    outputs = ("late",)

    def _init_aggregates(self, aggregates: dict | None, queries: dict | None,
                         key: str | Callable | None, ts_field: str) -> None:
        if aggregates is not None and queries is not None:
            raise ValueError(f"{self.name}: give aggregates= (one query) or queries= (several), not both")
        for what in (aggregates, queries):
            if not isinstance(what, (dict, type(None))):
                raise TypeError(f"aggregates must be a dict {{name: (function, field)}} and queries "
                                f"a dict {{query_id: aggregates}}, got {what!r}")
        if ts_field is None:
            raise ValueError("a window needs event time: ts_field names the timestamp field (ms)")
        self.key = key
        self.ts_field = ts_field
        self.named = queries is not None
        self.plan = AggregatePlan(registry=_plugin_aggregates())
        self._queries: dict[Any, tuple[dict, Query]] = {}
        self._key_name = _key_name(key)
        for qid, requests in ((queries or {}) if self.named else {None: aggregates or {}}).items():
            self._queries[qid] = (dict(requests), self._checked_add(qid, requests))
        self._recompile()

    def open(self, context: OperatorContext) -> None:
        super().open(context)
        if self.key is None and context.key_field is not None:
            self.key, self._key_name = context.key_field, _key_name(context.key_field)
            self._compiled = None               # the key is in the generated code
            self._recompile()

    def _checked_add(self, qid: Any, requests: dict) -> Query:
        if not isinstance(requests, dict):
            raise TypeError(f"query {qid!r}: aggregates must be a dict {{name: (function, field)}}, "
                            f"got {requests!r}")
        reserved = set(RESERVED + ((self._key_name,) if self._key_name else ()))
        clash = reserved & set(requests)
        if clash:
            raise ValueError(f"aggregate output names {sorted(clash)} clash with the key or "
                             f"window fields; rename them")
        return self.plan.add(requests)

    # -- queries while the stream runs ----------------------------------------------------
    def add_query(self, query_id: Any, aggregates: dict) -> None:
        """Start computing ``aggregates`` for ``query_id``, sharing what the plan already has.

        Aggregates new to the plan start empty, so the query reports a (key,
        window) only when it saw every tuple of it; the other queries go on
        exactly as before.
        """
        if not self.named:
            raise ValueError(f"{self.name}: add_query needs a window made with queries= (named queries)")
        if query_id in self._queries:
            raise ValueError(f"{self.name}: query {query_id!r} exists already")
        self._queries[query_id] = (dict(aggregates), self._checked_add(query_id, aggregates))
        self._recompile()

    def remove_query(self, query_id: Any) -> None:
        """Stop ``query_id``; aggregates no other query reads are released with their state."""
        if not self.named or query_id not in self._queries:
            raise KeyError(f"{self.name}: no query {query_id!r}; known: {list(self._queries)}")
        freed = self.plan.remove(self._queries.pop(query_id)[1])
        if freed:
            for slots in self._slot_lists():
                for i in freed:                  # highest first: later indices stay valid
                    if i < len(slots):
                        del slots[i]
        self._recompile()

    @property
    def query_ids(self) -> list:
        return list(self._queries)

    def _recompile(self) -> None:
        """Regenerate what the plan's change made stale: all of it when the slots changed,
        else only the new queries' row writers (adding K queries stays linear in K)."""
        if self.plan.layout != getattr(self, "_compiled", None):
            self._compiled, self._writers = self.plan.layout, {}
            self._merge = self.plan.merger()
            self._compile_state()
        writers = self._writers
        for qid, (_, query) in self._queries.items():
            if qid not in writers:
                writers[qid] = self.plan.row_writer(query, self._key_name)
        for qid in set(writers) - set(self._queries):
            del writers[qid]
        self._rows = list(writers.items())

    def _compile_state(self) -> None:
        """Generate the hot-path code for the current plan and key: by default the
        per-tuple folder and key getter that windows placing tuples one at a time use."""
        self._fold = self.plan.folder(ts_field=self.ts_field)
        self._key_of = key_getter(self.key)

    def _slot_lists(self) -> Iterable[list]:
        """Every slot list in the state (so ``remove_query`` can drop freed slots)."""
        return ()

    def _emit(self, groups: Iterable, ws: int, we: int, out: Callable) -> None:
        """Rows of one fired window for every query: plain rows, or ``(query_id, row)``."""
        if not self.named:
            self._rows[0][1](groups, ws, we, out)
            return
        groups = list(groups)
        for qid, rows in self._rows:
            rows(groups, ws, we, lambda row, q=qid: out((q, row)))

    # -- windows that take tuples in event-time order ------------------------------------------
    def _hold(self, batch: list, emit: Emitter) -> None:
        """Keep ``(ts, key, t)`` until the watermark passes ``ts`` (``self._pending``, keyed so
        that state splits by key); late tuples go aside, ones without a ts or key are dead."""
        hold(batch, emit, self.ts_field, self._wm, self._pending, self._key_of)

    def _release(self, watermark: int) -> list:
        """``(ts, key, t)`` the watermark has passed, by ``ts`` (arrival order within a timestamp)."""
        self._wm = watermark
        ready, self._pending = released(self._pending, watermark)
        return ready

    # -- state ------------------------------------------------------------------------------
    def parameters(self) -> dict:
        """What makes an equivalent instance: the queries as they are now, not as first given."""
        params = super().parameters()
        if self.named:
            params["queries"] = {qid: dict(req) for qid, (req, _) in self._queries.items()}
        return params

    def _check_state(self, state: dict, **shape: Any) -> None:
        """Refuse state of a different plan layout or window shape."""
        mine = {"layout": self.plan.layout, **shape}
        theirs = {k: state.get(k) for k in mine}
        if theirs != mine:
            raise ValueError(f"{self.name} state of {theirs} cannot be restored into {mine}")


def key_getter(key: str | Callable | None) -> Callable:
    """``t -> key``: a field, a callable, or one global group (``None``)."""
    if key is None:
        return lambda t: None
    return key if callable(key) else itemgetter(key)


def _key_name(key: str | Callable | None) -> str | None:
    """The field a row carries its key under: the key field, ``"key"`` for a callable."""
    return None if key is None else ("key" if callable(key) else key)


class Window(AggregatingWindow):
    """Keyed event-time window with aggregates; see the module docstring.

    ``key``: a field name or a callable; by default the key of the preceding
    ``key_by`` (``context.key_field``). A callable key is emitted as ``"key"``;
    with no key at all there is one global group and no key field.
    ``queries={query_id: aggregates}`` instead of ``aggregates`` shares one
    plan between named queries (see :class:`AggregatingWindow`).
    """

    name = "window"
    columnar = True         # Arrow batches are aggregated vectorised (columnar_window.py)

    def __init__(self, size: Any, slide: Any = None, aggregates: dict | None = None,
                 key: str | Callable | None = None, ts_field: str = "ts",
                 queries: dict | None = None) -> None:
        self.size = parse_duration(size)
        self.slide = self.size if slide is None else parse_duration(slide)
        if self.size <= 0 or self.slide <= 0:
            raise ValueError(f"window size and slide must be positive, got size={size!r}, slide={slide!r}")
        if self.size % self.slide:
            raise ValueError(f"window size ({self.size} ms) must be a multiple of slide "
                             f"({self.slide} ms): sliding windows are built from panes of slide")
        self._panes: dict[Any, dict] = {}          # pane start -> {key: slots}, keys first-seen
        self._wm = MIN_WATERMARK
        self._fired_end: int | None = None          # every window ending at or before is done
        self._cols = None                           # ColumnarPanes while Arrow batches come in
        self._group_of = GroupMemo()                # key -> key group, for snapshots
        self._layers = PaneLayers()                 # memory: the panes' layers a snapshot froze
        # disk backend only (window_store.py): the panes' home; self._panes is then its write buffer
        self._store = None
        self._seq = 0                               # first-seen numbers handed out to stored entries
        self._starts: set = set()                   # pane starts present in the store
        self._stash = None                          # a disk snapshot restored before open
        self._init_aggregates(aggregates, queries, key, ts_field)

    # (key, pane) entries the write buffer holds on disk before a spill: about 10 MB of slots. Panes
    # that live and fire within it never touch the store (a small state runs at the dicts' speed).
    buffer_entries = 65_536

    def open(self, context: OperatorContext) -> None:
        super().open(context)
        disk = window_store.open_store(self, context)     # None on the memory backend
        if disk is not None:
            self._store = disk
            if self._stash is not None:
                window_store.restore_keys(self, self._stash)
                self._stash = None
            self._to_dicts()
            window_store.spill(self)
        else:
            self._unstash()
            if getattr(self, "_colspec", None) is not None and "pyarrow" in sys.modules:
                # Arrow batches may come (the PE's columnar source imported pyarrow): the columnar
                # panes' module is imported now, while the PE opens, not inside its first batch
                # (10 ms of a 2 M-event run's ~100 on one worker without bytecode caching, issue 34).
                from . import columnar_window  # noqa: F401

    def _unstash(self) -> None:
        """A disk snapshot restored into a memory instance becomes ordinary panes."""
        if self._stash is not None:
            self._panes, self._stash = window_store.keys_to_panes(window_store.stored(self._stash)), None

    def _compile_state(self) -> None:
        self._update = self.plan.pane_updater(self.key, self.ts_field, self.slide, fixed=not self.named)
        self._copy_slots = slot_copier(self.plan)
        self._to_dicts()
        self._colspec = None if self.named else (self.key, self.plan.layout)

    def _columns(self, batch: Any, late: Callable) -> bool:
        """Fold an Arrow batch in vectorised; False when it must go the row path (always on disk:
        the store holds row panes)."""
        if self._store is not None:
            return False
        if self._cols is None:
            if self._colspec is None or self._panes:
                return False
            from .columnar_window import ColumnarPanes, columnar_spec

            outputs = columnar_spec(self.plan, self._queries[None][1], self.key, self.named)
            if outputs is None:
                self._colspec = None
                return False
            self._cols = ColumnarPanes(self.plan, self.key, self.ts_field, self.slide, self.size, outputs)
        elif self._panes:
            return False
        return self._cols.add(batch, self._wm - self.size + 1, late)

    def _to_dicts(self) -> None:
        """Columnar state becomes ordinary panes (rows arrived, a query changed, a restore)."""
        if self._cols is not None:
            self._panes.update(self._cols.to_dicts())
            self._cols = None
            self._layers.mark_whole()

    def _slot_lists(self) -> Iterable[list]:
        if self._store is not None:
            return window_store.slot_lists(self)
        self._layers.own(self._panes, self._copy_slots)
        return (s for d in self._panes.values() for s in d.values())

    # -- data -------------------------------------------------------------------------
    def process(self, batch: Any, emit: Emitter) -> None:
        late: list = []
        if not isinstance(batch, list):
            if self._columns(batch, late.append):
                for t in late:
                    emit.to("late", t)
                return
            batch = batch.to_pylist()
        if self._cols is not None:
            self._to_dicts()
        items = iter(batch)
        lim = self._wm - self.size + 1          # panes starting at or before this are late
        layers = self._layers
        older, copy = layers.older, layers.copier(self._copy_slots)
        failed = self._update(items, self._panes, lim, late.append, older, copy)
        while failed is not None:               # rare: a bad tuple; go on after it
            emit.dead_letter(*failed)
            failed = self._update(items, self._panes, lim, late.append, older, copy)
        for t in late:
            emit.to("late", t)
        if self._store is not None and window_store.buffered(self) > self.buffer_entries:
            window_store.spill(self)

    def on_watermark(self, watermark: int, emit: Emitter) -> None:
        if self._starts:                        # disk, panes in the store: fire from there
            window_store.on_watermark(self, watermark, emit)
            return
        self._wm = watermark                    # memory, or disk with every pane in the buffer
        cols = self._cols
        if cols is not None and cols.panes:
            starts = sorted(cols.panes)
            self._fire(starts, watermark + 1, lambda sel, ws, we: emit.columns(cols.window(sel, ws, we)))
            cols.drop(watermark - self.size + 1)
        if self._panes:
            starts = sorted(self._panes)
            self._fire(starts, watermark + 1,
                       lambda sel, ws, we: self._emit(self._window(sel), ws, we, emit.append))
            self._drop(starts, watermark)
        # Even with nothing to fire, windows ending here are done: a tuple
        # arriving later must not reopen them.
        self._fired_end = (watermark + 1) - (watermark + 1) % self.slide

    def _fire(self, starts: list, last_end: int, fire: Callable) -> None:
        """``fire(pane starts, ws, we)`` for every window ending in ``(fired_end, last_end]``
        that has data, by end."""
        size, slide = self.size, self.slide
        end = starts[0] + slide
        if self._fired_end is not None:
            end = max(end, self._fired_end + slide)
        while end <= last_end:
            lo = bisect_left(starts, end - size)
            if lo == len(starts):
                break
            if starts[lo] >= end:               # a gap with no data: jump to the next pane
                end = starts[lo] + slide
                continue
            hi = bisect_left(starts, end, lo)
            fire(starts[lo:hi], end - size, end)
            end += slide

    def _window(self, starts: list) -> Any:
        """``(key, slots)`` of one window: its panes merged, keys in first-seen order."""
        items, panes = self._layers.items, self._panes
        if len(starts) == 1:
            return items(panes, starts[0])
        merged = dict(items(panes, starts[0]))
        merge = self._merge
        for p in starts[1:]:
            for k, s in items(panes, p):
                a = merged.get(k)
                merged[k] = s if a is None else merge(a, s)
        return merged.items()

    def _drop(self, starts: list, watermark: int) -> None:
        """Forget panes that can reach no unfired window."""
        bound = watermark - self.size + 1
        for p in starts:
            if p > bound:
                break
            del self._panes[p]
            self._layers.drop(p)

    # -- state --------------------------------------------------------------------------
    def snapshot(self) -> dict:
        """Panes as whole key groups, watermark and fired frontier. Memory: the panes frozen as
        they are, packed by whoever reads the view (a checkpoint's writer, off the PE's loop:
        ``pane_layers.py``); Arrow panes copied (a ``memcpy`` per array) and made rows there too.
        Disk: the store's view (``form: keys``), written incrementally."""
        if self._store is not None:
            return window_store.snapshot(self)
        self._unstash()
        if self._cols is not None:
            groups = snapshot_groups(self._layers.freeze_made(self._cols.frozen()))
        else:
            groups = snapshot_groups(self._layers.freeze(self._panes))
        return {"layout": self.plan.layout, "size": self.size, "slide": self.slide,
                "groups": groups, "watermark": self._wm, "fired_end": self._fired_end}

    def restore(self, state: dict) -> None:
        self._check_state(state, size=self.size, slide=self.slide)
        self._cols = None
        self._layers.clear()
        self._wm = state["watermark"]
        self._fired_end = state["fired_end"]
        keys = state.get("form") == "keys"
        if self._store is not None:
            self._panes = {}
            if keys:
                window_store.restore_keys(self, state)
            else:
                window_store.restore_keys(self, None)
                self._panes = unpack_namespaced(state["groups"])
                window_store.spill(self)
        elif keys:                          # before open: its backend decides (open)
            self._panes, self._stash = {}, state
        else:
            self._panes, self._stash = unpack_namespaced(state["groups"]), None

    # -- copies: key groups move with their panes ---------------------------------------
    def export_groups(self, groups: frozenset[int]) -> dict:
        """A rescale takes key groups ``groups`` away (pescheduler/worker/handover.py): their
        panes in :meth:`snapshot`'s form, removed here. Memory: O(panes) in the PE's turn, the
        panes' layers taken as they are and their moving entries read when the part is pickled,
        off the turn; here they are hidden until their pane is dropped (``pane_layers.py``,
        ``PaneLayers.export``); Arrow panes copied, their moving keys cleared here in numpy and
        made rows when the part is pickled (``ColumnarPanes.export``). Disk: the groups taken out
        of the store, packed when the part is pickled, with the moving entries of its write
        buffer."""
        base = {"layout": self.plan.layout, "size": self.size, "slide": self.slide,
                "watermark": self._wm, "fired_end": self._fired_end}
        if self._store is not None:
            return {**base, **window_store.export_groups(self, groups)}
        self._unstash()
        if self._cols is not None:          # Arrow panes stay arrays: the moving rows made off the turn
            taken = self._cols.export(frozenset(groups))
        else:
            taken = self._layers.export(self._panes, frozenset(groups), self._group_of._of)
        return {**base, "groups": {g: (representative(g), TakenPane(taken, g)) for g in sorted(groups)}}

    def import_groups(self, state: dict) -> None:
        """Key groups another instance exported (:meth:`export_groups`) join this running one, at
        the least advanced watermark and frontier of the two (as a merge of their snapshots)."""
        self._check_state(state, size=self.size, slide=self.slide)
        keys = state.get("form") == "keys"
        if keys != (self._store is not None) or self._stash is not None:
            self.restore(self.merge_states([self.snapshot(), state]))     # another form: the long way
            return
        self._wm = min(self._wm, state["watermark"])
        fired = (self._fired_end, state["fired_end"])
        self._fired_end = None if None in fired else min(fired)
        if keys:
            window_store.import_groups(self, state)
            return
        tables = unpack_namespaced(state["groups"])
        if self._cols is not None and self._cols.add_rows(tables):     # Arrow panes stay arrays
            return
        self._to_dicts()
        self._layers.mark_whole()           # keys at places the tops do not say, the watermark back
        for p, table in tables.items():
            self._panes.setdefault(p, {}).update(table)

    def split_state(self, state: dict, owns: Callable[[Any], bool]) -> dict:
        """The key groups where ``owns(key)``, with their panes (and an exported disk part's
        buffered entries); watermark and fired frontier as they were."""
        out = {**state, "groups": split_groups(state["groups"], owns)}
        if state.get("buffer"):
            out["buffer"] = split_groups(state["buffer"], owns)
        return out

    def merge_states(self, states: list) -> dict:
        """Every instance's key groups (disjoint), at the least advanced watermark and frontier,
        so no window fires twice and none is skipped (snapshots of both forms: as panes)."""
        fired = [st["fired_end"] for st in states]
        forms = {st.get("form") for st in states}
        if len(forms) > 1:
            states = [window_store.as_panes(st, self._group_of) for st in states]
        merged = {**states[0], "groups": merge_groups([st["groups"] for st in states]),
                  "watermark": min(st["watermark"] for st in states),
                  "fired_end": None if None in fired else min(fired)}
        if states[0].get("form") == "keys":
            merged["seq"] = max(st["seq"] for st in states)
            merged["starts"] = sorted({p for st in states for p in st["starts"]})
            merged["buffer"] = merge_groups([st.get("buffer") or {} for st in states])
        return merged


def released(pending: list, watermark: int) -> tuple[list, list]:
    """``(ready, rest)``: the held ``(ts, ...)`` items of ``pending`` (in arrival order) that
    ``watermark`` has passed, by ``ts`` (arrival order within a timestamp), and the others.

    Events pushed one at a time leave the hold of a per-event operator (``over_window``,
    ``ep_over``, ``ep_patterns``) holding two items at each watermark: the event it passes and the one
    that moved it. Those two cases take no scan, no sort and no list comprehension (two
    calls in Python 3.11), which were about 6 % of a pattern query's time per event.
    """
    if len(pending) == 2:
        a, b = pending
        if a[0] <= watermark < b[0]:
            return [a], [b]
    elif len(pending) == 1:
        return (pending, []) if pending[0][0] <= watermark else ([], pending)
    elif not pending:
        return [], pending
    ready = [p for p in pending if p[0] <= watermark]
    if not ready:
        return ready, pending
    rest = [p for p in pending if p[0] > watermark]
    ready.sort(key=itemgetter(0))
    return ready, rest


def hold(batch: list, emit: Emitter, ts_field: str, watermark: int, pending: list, key_of: Callable) -> None:
    """Append ``(ts, key, t)`` of each tuple of ``batch`` to ``pending`` (for :func:`released`);
    a tuple with ``ts <= watermark`` goes to the ``late`` side output, one without a ts or key is
    dead-lettered. Shared by every operator that takes tuples in event-time order."""
    for t in batch:
        try:
            ts = t[ts_field]
            if ts <= watermark:
                emit.to("late", t)
            else:
                pending.append((ts, key_of(t), t))
        except Exception as exc:
            emit.dead_letter(t, exc)
