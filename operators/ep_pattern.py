"""Every pattern query of a stream (one key, no filters) in one operator, their runs shared.

The JEPC workload runs Count patterns of one shape side by side (``x y u``
with ``y: a - z1 == i``, ``u: a - z2 == i`` for i = 1..Count). As one
``pattern`` operator each, every event is held, sorted and released Count
times, and Count automata start a run that is the same run in each of them.
Here events are held and released once, and queries of one *shape* (the
same pattern, ``do`` and predicates up to one ``expression == literal``
conjunct per symbol) are one automaton whose runs carry the set of queries
they are a run of (per position): a predicate's shared part is evaluated
once, its expression computed once, and the queries whose literal equals
the value are found in a dict (as ``ep_filter`` finds filters), so an event
costs a lookup per run, not Count tests. A query's ``within`` drops it from
the runs that grew older than its own.

For each query the runs are exactly those of its own ``pattern`` operator
(``operators/pattern.py``: the same Glushkov automaton, strict contiguity,
alternatives at one timestamp, one report per distinct sequence of events and
output), restricted to the runs it belongs to; so rows are equal, in the
same order per query. A query with a Python predicate, ``do`` function or
``output`` is an automaton of its own (still released with the others).

``ep_patterns(key=None, queries={query_id: {"pattern", "define", "do",
"within", "output"}})`` (``define``/``do`` as ``ep.Pattern`` takes them:
expressions, constants or functions) emits ``(query_id, row)`` for a tagged
``ep_output``; late events (``ts <= watermark`` on arrival) go to the
``late`` side output as ``(query_id, event)``, once per query. Queries come
and go (``add_query`` / ``remove_query``); a query sees the events that
arrive after it joined.
"""

from __future__ import annotations

import hashlib
import itertools
from bisect import bisect_left
from itertools import groupby
from operator import itemgetter
from typing import Any, Callable, Mapping

from pescheduler.expr import Binary, Expr, Lit, conjuncts, lift
from pescheduler.operator import MIN_WATERMARK, Emitter, Operator, OperatorContext, Parallelism, per_instance
from pescheduler.state import KeyedState, MemoryState, adopt, key_group, pack_group
from pescheduler.state.groups import (add_groups, merge_groups, parted, restore_groups, rewrite, snapshot_groups,
                                      split_groups, take_groups)
from pescheduler.timeutil import parse_duration

from .ep_filter import _indexable
from .window import released
from .pattern import Pattern

EMPTY: frozenset = frozenset()


def _split(pred: Any) -> tuple[Expr | None, Any, Expr | None]:
    """``(expression, literal, rest)``: the first ``expression == literal`` conjunct of ``pred``
    (a query's parameter) and the conjunction of the others (None: nothing else to test)."""
    found, rest = None, None
    for c in conjuncts(lift(pred)):
        if found is None and isinstance(c, Binary) and c.op == "eq":
            x, lit = (c.left, c.right) if isinstance(c.right, Lit) else (c.right, c.left)
            if isinstance(lit, Lit) and not isinstance(x, Lit) and _indexable(lit.value):
                found = (x, lit.value)
                continue
        if isinstance(c, Lit) and c.value is True:
            continue
        rest = c if rest is None else Binary("and", rest, c)
    return (found[0], found[1], rest) if found else (None, None, rest)


def _shape(query_id: Any, spec: Mapping) -> tuple:
    """What queries of one automaton have in common; a query that runs Python is alone."""
    define, do = spec["define"], spec.get("do") or {}
    if spec.get("output") is not None or any(callable(p) and not isinstance(p, Expr) for p in define.values()) \
            or any(not isinstance(m, Mapping) for m in do.values()):
        return ("alone", query_id)
    symbols = []
    for s, p in sorted(define.items()):
        x, _, rest = _split(p)
        symbols.append((s, repr(x) if x is not None else None, repr(rest)))
    dos = tuple((s, tuple((n, repr(lift(e))) for n, e in sorted(m.items()))) for s, m in sorted(do.items()))
    return (spec["pattern"], tuple(symbols), dos)


def _restrict(runs: list, qs: frozenset) -> list:
    """The runs of the queries ``qs``."""
    out = []
    for pq, m, start, ident in runs:
        mine = {p: s & qs for p, s in pq.items() if not s.isdisjoint(qs)}
        if mine:
            out.append((mine, m, start, ident))
    return out


def pattern_functions(define: Mapping, do: Mapping | None) -> tuple[dict, dict | None]:
    """``define`` and ``do`` (as ``ep.Pattern`` takes them) as the NFA calls them: ``fn(event, measures)``.

    A symbol's predicate may be an expression (``ep.col("a") - ep.measure("z") == 1``)
    or a constant (``True``: every event); ``do[symbol]`` may be ``{measure:
    expression}``. Plain functions pass through unchanged.
    """
    calls = {s: p.function() if isinstance(p, Expr) else p if callable(p) else lift(p).function()
             for s, p in define.items()}
    if do is None:
        return calls, None
    steps = {}
    for s, fn in do.items():
        if isinstance(fn, Mapping):
            exprs = {name: lift(e).function() for name, e in fn.items()}
            if len(exprs) == 1:                 # the usual case: one measure, no loop per event
                ((name, x),) = exprs.items()
                fn = (lambda name, x: lambda e, m: {name: x(e, m)})(name, x)
            else:
                fn = (lambda exprs: lambda e, m: {name: x(e, m) for name, x in exprs.items()})(exprs)
        steps[s] = fn
    return calls, steps


class _Family:
    """Queries of one shape: one automaton whose runs carry, per position, the queries they serve."""

    def __init__(self, shape: tuple, nfa: Pattern, spec: Mapping) -> None:
        self.shape = shape
        self.queries: dict[Any, tuple] = {}          # query id -> (within, born, {symbol: literal})
        self.all: frozenset = EMPTY
        # position -> (symbol, accepting, follow)
        self.pos = [(s, acc, follow) for s, _pred, _do, acc, follow in nfa._pos]
        self.first = nfa._first
        self._starts: list = []
        self.output = spec.get("output")
        self.do = {p[0]: p[2] for p in nfa._pos}
        self.index: dict[str, dict] = {}              # symbol -> {literal: frozenset of queries}
        preds = {p[0]: p[1] for p in nfa._pos}
        alone = shape[0] == "alone"
        self.match = {s: self._matcher(s, spec["define"][s], preds[s], alone) for s in preds}
        # its runs are the operator's, per key in the keyed state: {fid: [({position: queries},
        # measures, start, id)]}; fid names the family the same way in every instance and process
        self.fid = family_id(shape)
        self._alive: dict[int, frozenset] = {}       # age -> queries whose within reaches it
        self.min_within: float = float("inf")
        self.max_within: float | None = None
        self.latest_born = 0

    def _matcher(self, symbol: str, pred: Any, fn: Callable, alone: bool) -> Callable:
        """``match(event, measures, queries) -> the queries whose predicate holds``."""
        if alone:
            return lambda e, m, qs: qs if fn(e, m) else EMPTY
        x, _, rest = _split(pred)
        test = rest.function() if rest is not None else None
        if x is None:
            if test is None:
                return lambda e, m, qs: qs
            return lambda e, m, qs: qs if test(e, m) else EMPTY
        value, index = x.function(), self.index.setdefault(symbol, {})

        def match(e: Any, m: Any, qs: frozenset) -> frozenset:
            if test is not None and not test(e, m):
                return EMPTY
            hit = index.get(value(e, m))
            return EMPTY if hit is None else hit & qs
        return match

    def add(self, query_id: Any, spec: Mapping, born: int) -> None:
        literals = {}
        if self.shape[0] != "alone":
            for s, p in spec["define"].items():
                x, lit, _ = _split(p)
                if x is not None:
                    literals[s] = lit
                    index = self.index[s]
                    index[lit] = index.get(lit, EMPTY) | {query_id}
        within = spec.get("within")
        self.queries[query_id] = (None if within is None else parse_duration(within), born, literals)
        self._changed()

    def remove(self, query_id: Any) -> None:
        _, _, literals = self.queries.pop(query_id)
        for s, lit in literals.items():
            index = self.index[s]
            index[lit] = index[lit] - {query_id}
            if not index[lit]:
                del index[lit]
        self._changed()

    @staticmethod
    def without(runs: list, query_id: Any) -> list:
        """``runs`` with ``query_id`` taken out of them (a run serving no query any more goes)."""
        out = []
        for pq, m, start, ident in runs:
            pq = {p: qs - {query_id} for p, qs in pq.items() if qs - {query_id}}
            if pq:
                out.append((pq, m, start, ident))
        return out

    def _changed(self) -> None:
        self.all = frozenset(self.queries)
        self._starts = [(n, self.all) for n in self.first]     # where every query's new runs start
        self._alive = {}
        withins = [w for w, _, _ in self.queries.values()]
        self.min_within = min((w for w in withins if w is not None), default=float("inf"))
        self.max_within = None if None in withins or not withins else max(withins)
        self.latest_born = max((b for _, b, _ in self.queries.values()), default=0)
        self._expire_due = MIN_WATERMARK

    def alive(self, age: int) -> frozenset:
        got = self._alive.get(age)
        if got is None:
            if len(self._alive) > 4096:
                self._alive = {}
            got = self._alive[age] = frozenset(q for q, (w, _, _) in self.queries.items() if w is None or w >= age)
        return got

    # -- one step: the events of one key at one timestamp ------------------------------------
    def step(self, runs: list, ts: int, events: list, seqs: list, ids: Any, out: list) -> list:
        """As ``Pattern._step``, for every query of the family at once (see the module docstring):
        the runs of one key kept after ``events`` (``runs`` is not changed).

        A query that joined while some of these events were waiting sees only those that came
        after it (as its own operator would have): such queries step apart, on their events."""
        if self.latest_born <= seqs[0]:
            return self._step(ts, events, runs, self.all, ids, out)
        parts: dict[int, frozenset] = {}
        for q, (_, born, _) in self.queries.items():
            j = bisect_left(seqs, born)
            parts[j] = parts.get(j, EMPTY) | {q}
        kept: list = []
        for j, qs in sorted(parts.items()):
            mine = _restrict(runs, qs)
            kept += mine if j == len(events) else self._step(ts, events[j:], mine, qs, ids, out)
        return kept

    def _step(self, ts: int, events: list, runs: list, every: frozenset, ids: Any, out: list) -> list:
        pos = self.pos
        made: dict = {}                             # (parent id, event index) -> new id
        new: dict = {}                              # new id -> [[{position: queries}, measures, start, accepting]]
        for pq, measures, start, ident in runs:
            age = ts - start
            if age > self.min_within:
                ok = self.alive(age)
                pq = {p: qs & ok for p, qs in pq.items() if not qs.isdisjoint(ok)}
                if not pq:
                    continue
            nexts: dict = {}
            for p, qs in pq.items():
                for n in pos[p][2]:
                    had = nexts.get(n)
                    nexts[n] = qs if had is None or had is qs else had | qs
            self._take(sorted(nexts.items()), measures, start, ident, events, ids, made, new)
        starts = self._starts if every is self.all else [(n, every) for n in self.first]
        self._take(starts, {}, ts, None, events, ids, made, new)
        kept = []
        output = self.output
        for ident, entries in new.items():
            done: dict = {}
            for pq, m, start, accepting in entries:
                for q in accepting:
                    result = output(m) if output is not None else {**m, "start_ts": start, "ts": ts}
                    seen = done.setdefault(q, [])
                    if result not in seen:
                        seen.append(result)
                        out.append((q, result))
                if len(pq) == 1:                # the usual case; a run's dict is not changed once kept
                    alive = pq if pos[next(iter(pq))][2] else None
                else:
                    alive = {p: qs for p, qs in pq.items() if pos[p][2]}
                if alive:
                    kept.append((alive, m, start, ident))
        return kept

    def _take(self, nexts: list, measures: dict, start: int, ident: Any, events: list,
              ids: Any, made: dict, new: dict) -> None:
        pos, match, do = self.pos, self.match, self.do
        for i, e in enumerate(events):
            for n, qs in nexts:
                sym, accepting, _ = pos[n]
                got = match[sym](e, measures, qs)
                if not got:
                    continue
                fn = do.get(sym)
                m = {**measures, **fn(e, measures)} if fn is not None else measures
                eid = made.get((ident, i))
                if eid is None:
                    eid = made[ident, i] = next(ids)
                entries = new.setdefault(eid, [])
                for entry in entries:
                    if entry[1] is m or entry[1] == m:
                        had = entry[0].get(n)
                        entry[0][n] = got if had is None else had | got
                        if accepting:
                            entry[3] = entry[3] | got
                        break
                else:
                    entries.append([{n: got}, m, start, got if accepting else EMPTY])

    def horizon(self, watermark: int) -> int | None:
        """The start at or before which no query's ``within`` reaches a run any more, when a sweep
        is due (None: not yet, or no bound).

        Memory only, so in sweeps half a ``within`` apart, not per watermark: a step drops
        the runs of its key that no query's ``within`` reaches (``alive``) anyway; a sweep
        frees those of keys no event came to."""
        if self.max_within is None or watermark < self._expire_due:
            return None
        self._expire_due = watermark + max(1, self.max_within // 2)
        return watermark - self.max_within


def family_id(shape: tuple) -> str:
    """A short name of a family's shape, the same in every process (a key's runs are stored under
    it, and a copy made from the same queries reads them)."""
    return hashlib.blake2b(repr(shape).encode(), digest_size=8).hexdigest()


class SharedPatterns(Operator):
    """Pattern queries of one stream and key sharing a hold and their runs; see the module docstring.

    State: each key's runs, ``{family id: runs}``, live in the deployment's keyed state backend
    (``pescheduler.state``: memory or disk, docs/state.md): a snapshot holds whole key groups and
    a rescale moves key groups with their keys' waiting events. A release reads a key once and
    writes it back once (a key put since the snapshot is changed in place: ``writable``).
    """

    name = "ep_patterns"
    parallelism = per_instance(Parallelism.KEYED,
                               lambda op: Parallelism.SINGLETON if op.key is None else Parallelism.KEYED)
    outputs = ("late",)

    def __init__(self, key: str | None = None, queries: dict | None = None, ts_field: str = "ts") -> None:
        self.key, self.ts_field = key, ts_field
        self._key = itemgetter(key) if isinstance(key, str) else key
        self._specs: dict[Any, dict] = {}
        self._families: list[_Family] = []
        self._of: dict[Any, _Family] = {}
        self._pending: list = []                    # (ts, arrival seq, event) not yet passed by the watermark
        self._seq = 0
        self._ids = itertools.count()
        self._wm = MIN_WATERMARK
        # key -> {family id: runs}; in memory until open() moves it to the deployment's backend
        # (restore comes before open)
        self._runs: KeyedState = MemoryState()
        for query_id, spec in (queries or {}).items():
            self.add_query(query_id, spec)

    def open(self, context: OperatorContext) -> None:
        super().open(context)
        self._runs = adopt(context, self._runs)

    @property
    def query_ids(self) -> list:
        return list(self._specs)

    def add_query(self, query_id: Any, spec: Mapping) -> None:
        """Query ``query_id``: ``{"pattern", "define", "do", "within", "output"}`` as ``ep.Pattern``
        (``within`` resolved); it joins the automaton of its shape, or starts one."""
        if query_id in self._specs:
            raise ValueError(f"ep_patterns: query {query_id!r} exists already")
        spec = dict(spec)
        define, do = pattern_functions(spec["define"], spec.get("do"))
        nfa = Pattern(spec["pattern"], define, do=do, within=spec.get("within"), output=spec.get("output"))
        shape = _shape(query_id, spec)
        family = next((f for f in self._families if f.shape == shape), None)
        if family is None:
            family = _Family(shape, nfa, spec)
            self._families.append(family)
        family.add(query_id, spec, self._seq + 1)
        self._specs[query_id] = spec
        self._of[query_id] = family

    def remove_query(self, query_id: Any) -> None:
        family = self._of.pop(query_id)
        del self._specs[query_id]
        family.remove(query_id)
        fid = family.fid
        if not family.queries:
            self._families.remove(family)
            self._rewrite(lambda value: {f: r for f, r in value.items() if f != fid})
        else:
            self._rewrite(lambda value: _replaced(value, fid, _Family.without(value.get(fid, ()), query_id)))

    def _rewrite(self, change: Callable[[dict], dict]) -> None:
        rewrite(self._runs, change)

    def parameters(self) -> dict:
        return {"key": self.key, "ts_field": self.ts_field, "queries": {q: dict(s) for q, s in self._specs.items()}}

    # -- data ------------------------------------------------------------------------------
    def process(self, batch: list, emit: Emitter) -> None:
        wm, ts_f, pending = self._wm, self.ts_field, self._pending
        for e in batch:
            ts = e[ts_f]
            if ts <= wm:
                for q in self._specs:
                    emit.to("late", (q, e))
            else:
                self._seq += 1
                pending.append((ts, self._seq, e))

    def on_watermark(self, watermark: int, emit: Emitter) -> None:
        """Hot loop: each key's runs are read from the backend once per release (a key put since the
        snapshot: a dict lookup, changed in place) and written back once, at its end."""
        self._wm = watermark
        ready, self._pending = released(self._pending, watermark)   # by ts, arrival order within
        if len(ready) == 1:                         # one event released (pushed one at a time)
            self._one(*ready[0], emit)
        elif ready:
            state, key, families, ids, out = self._runs, self._key, self._families, self._ids, []
            hot = state.writable() or {}            # None on disk (copies): every key is put back
            read: dict = {}                         # key -> its runs read from the backend this release
            absent, emptied = set(), set()          # keys read that held no runs; hot keys left without
            for ts, step in groupby(ready, itemgetter(0)):
                groups: dict[Any, tuple[list, list]] = {}
                for _, seq, e in step:
                    k = key(e) if key is not None else None
                    g = groups.get(k)
                    if g is None:
                        groups[k] = ([e], [seq])
                    else:
                        g[0].append(e)
                        g[1].append(seq)
                for k, (events, seqs) in groups.items():
                    value = hot.get(k)
                    if value is None:
                        value = read.get(k)
                        if value is None:
                            value = read[k] = state.get(k)
                            if value is None:
                                value = read[k] = {}
                                absent.add(k)
                    for family in families:
                        fid = family.fid
                        kept = family.step(value.get(fid, ()), ts, events, seqs, ids, out)
                        if kept:
                            value[fid] = kept
                        elif fid in value:
                            del value[fid]
                    if not value and k in hot:
                        emptied.add(k)
            if out:
                emit.many(out)
            state.write_many([(k, v) for k, v in read.items() if v],
                             [k for k, v in read.items() if not v and k not in absent] +
                             [k for k in emptied if not hot[k]])    # (a later event may start runs again)
        self._expire(watermark)

    def _one(self, ts: int, seq: int, e: Any, emit: Emitter) -> None:
        """One event released: its key's runs read (or found put since the snapshot), stepped by
        every family, written back (deleted when none is left)."""
        k = self._key(e) if self._key is not None else None
        state, out = self._runs, []
        hot = state.writable()
        value = None if hot is None else hot.get(k)
        fresh = value is None
        if fresh:
            value = state.get(k)
            held = value is not None
            if not held:
                value = {}
        events, seqs, ids = [e], [seq], self._ids
        for family in self._families:
            fid = family.fid
            kept = family.step(value.get(fid, ()), ts, events, seqs, ids, out)
            if kept:
                value[fid] = kept
            elif fid in value:
                del value[fid]
        if value:
            if fresh:
                state.put(k, value)
        elif not fresh or held:
            state.delete(k)
        if out:
            emit.many(out)

    def _expire(self, watermark: int) -> None:
        """Drop the runs no query's ``within`` reaches any more, in the families whose sweep is due."""
        due = {}
        for family in self._families:
            horizon = family.horizon(watermark)
            if horizon is not None:
                due[family.fid] = horizon
        if due:
            self._rewrite(lambda value: _expired(value, due))

    # -- state ---------------------------------------------------------------------------------
    def snapshot(self) -> dict:
        """Waiting events, the counters, each family's shape and queries' births, and the key groups
        of the keyed state (every key's runs; packed when read: a copy)."""
        return {**self._header(), "pending": list(self._pending), "groups": snapshot_groups(self._runs)}

    def _header(self) -> dict:
        """The watermark, the counters, each family's shape and its queries' births."""
        return {"watermark": self._wm, "seq": self._seq, "ids": next(self._ids),
                "families": [(f.shape, {q: b for q, (_, b, _) in f.queries.items()}) for f in self._families]}

    def restore(self, state: dict) -> None:
        shapes = [f.shape for f in self._families]
        if [f[0] for f in state["families"]] != shapes:
            raise ValueError(f"ep_patterns state of shapes {[f[0] for f in state['families']]} cannot be "
                             f"restored into {shapes}")
        self._wm, self._pending, self._seq = state["watermark"], list(state["pending"]), state["seq"]
        self._ids = itertools.count(state["ids"])
        for f, saved in zip(self._families, state["families"]):
            for q, b in saved[-1].items():
                if q in f.queries:
                    w, _, lits = f.queries[q]
                    f.queries[q] = (w, b, lits)
            f._changed()
        restore_groups(self._runs, self._groups(state))

    def _groups(self, state: dict) -> dict:
        """A snapshot's key groups; one a checkpoint took while each family held its runs in a dict
        of its own (``families``: ``(shape, {key: runs}, births)``) is grouped here, so it still
        restores."""
        if "groups" in state:
            return state["groups"]
        self._keyed()
        values: dict = {}
        for shape, runs, _born in state["families"]:
            fid = family_id(shape)
            for k, mine in runs.items():
                values.setdefault(k, {})[fid] = list(mine)
        by_group: dict[int, list] = {}
        for k, value in values.items():
            by_group.setdefault(key_group(k), []).append((k, value))
        return {g: (items[0][0], pack_group(items)) for g, items in by_group.items()}

    def _keyed(self) -> None:
        if self._key is None:
            raise ValueError("an unkeyed pattern is one sequence: it cannot be split into copies")

    # -- copies: key groups move with their runs and waiting events -------------------------------
    def export_groups(self, groups: frozenset[int]) -> dict:
        """A rescale takes key groups ``groups`` away (pescheduler/worker/handover.py): their keys'
        runs and waiting events in :meth:`snapshot`'s form (a new instance is restored from it),
        removed here; the groups that stay are not read, the moving ones packed only when the part
        is pickled."""
        key = self._key
        leaving, self._pending = parted(self._pending, [key(p[2]) for p in self._pending], groups)
        return {**self._header(), "pending": leaving, "groups": take_groups(self._runs, groups)}

    def import_groups(self, state: dict) -> None:
        """Key groups another instance exported join this running one; its own watermark stays (the
        events handed over wait for the next). Arrival numbers go on past both instances' (a
        query's birth compares with them), and so do the runs' ids."""
        add_groups(self._runs, state["groups"])
        self._pending = sorted(self._pending + list(state["pending"]), key=itemgetter(0, 1))
        self._seq = max(self._seq, state["seq"])
        self._ids = itertools.count(max(next(self._ids), state["ids"]))

    def split_state(self, state: dict, owns: Callable[[Any], bool]) -> dict:
        """The key groups where ``owns(key)`` and their keys' waiting events (of a snapshot, or of
        an export that a hand-over sends in slices)."""
        self._keyed()
        key = self._key
        return {**state, "pending": [p for p in state["pending"] if owns(key(p[2]))],
                "families": [(f[0], f[-1]) for f in state["families"]],
                "groups": split_groups(self._groups(state), owns)}

    def merge_states(self, states: list) -> dict:
        """Every instance's key groups and waiting events (disjoint keys), at the least advanced watermark."""
        return {**states[0], "watermark": min(st["watermark"] for st in states),
                "pending": sorted((p for st in states for p in st["pending"]), key=itemgetter(0, 1)),
                "seq": max(st["seq"] for st in states), "ids": max(st["ids"] for st in states),
                "families": [(f[0], f[-1]) for f in states[0]["families"]],
                "groups": merge_groups([self._groups(st) for st in states])}


def _replaced(value: dict, fid: str, runs: list) -> dict:
    """``value`` (a key's runs by family) with family ``fid``'s runs ``runs`` (none: it goes)."""
    out = {f: r for f, r in value.items() if f != fid}
    if runs:
        out[fid] = runs
    return out


def _expired(value: dict, due: dict) -> dict:
    """``value`` without the runs that started at or before their family's horizon in ``due``
    (``value`` itself when none did: nothing to write)."""
    for fid, horizon in due.items():            # (the usual case: a look at each run, no copy)
        for run in value.get(fid, ()):
            if run[2] <= horizon:
                break
        else:
            continue
        break
    else:
        return value
    out, changed = {}, False
    for fid, runs in value.items():
        horizon = due.get(fid)
        if horizon is not None:
            kept = [r for r in runs if r[2] > horizon]
            if len(kept) != len(runs):
                changed = True
                if kept:
                    out[fid] = kept
                continue
        out[fid] = runs
    return out if changed else value
