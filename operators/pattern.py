"""Sequential patterns over one event-time stream, evaluated by an NFA.

``pattern(pattern, define, do=None, within=None, output=None, key=None)``::

    Pattern("x y+ u",
            define={"x": lambda e, m: True,
                    "y": lambda e, m: e["a"] - m["z1"] == 1,
                    "u": lambda e, m: e["a"] - m["z2"] == 1},
            do={"x": lambda e, m: {"z1": e["a"], "z2": e["a"]},
                "y": lambda e, m: {"z2": e["a"]}},
            within="10s", output=lambda m: {"from": m["z1"], "to": m["z2"]})

The pattern is a regular expression over symbol names (identifiers):
concatenation by juxtaposition (``x y u``), postfix ``+`` (one or more),
``*`` (zero or more) and ``?`` (optional) on a symbol or a parenthesised
group, alternation ``|`` and parentheses. A pattern that matches the empty
sequence is refused. Every symbol used needs a predicate in ``define``
``fn(event, measures) -> bool``; ``do[symbol]`` ``fn(event, measures) -> dict``
updates the measures when the symbol is taken (a new dict per run: runs never
share measures). ``output(measures) -> dict`` makes the result; by default it
is ``{**measures, "start_ts": first_ts, "ts": last_ts}``.

Semantics (JEPC's strictly sequential, time-instant semantics, exactly):

* Strict contiguity, per key: events are taken in timestamp order (they are
  buffered until the watermark passes them, so matches come out ``max_delay``
  after their last event). A run is a partial match; at each step it must
  take the next event of its key or it dies.
* Every event may start a run, so matches overlap and every match is found:
  for each start event, every contiguous sequence of events that the
  pattern accepts. In SQL's ``MATCH_RECOGNIZE`` terms this is ``ALL MATCHES``
  with ``AFTER MATCH SKIP TO NEXT ROW`` *and* every match per start (SQL
  reports only the preferred one per start row); in Flink CEP terms it is
  ``noSkip()`` with strict contiguity (``next()``), ``oneOrMore()``
  ``consecutive()``. ``AFTER MATCH SKIP PAST LAST ROW`` (non-overlapping) is
  what a consumer gets by dropping matches that start before the previous
  one's ``ts``.
* A match is reported **once per distinct sequence of matched events and
  output value**, when its last event is taken. Runs that took the same
  events and hold equal measures are one run (the NFA's state is the set of
  pattern positions they reached), so ``x (y | y)`` or ``x y* y*`` report
  each match once however many ways the regular expression can parse it;
  the same events read as other symbols are another match only when that
  changes the measures (``do``) and so the output.
* A run in an accepting state that can go on (``y+`` at the end) stays
  alive, so ``x y+`` reports ``x y``, ``x y y``, ... each once.

Equal timestamps are alternatives: the events of one key with the same ``ts``
form one *step*. Each run takes exactly one of them (it forks once per event
and symbol that fit) and never two, and every one of them may start a run.
So ``x y`` over ``x@1, y@2, y'@2`` reports two matches, and over
``x@1, y@1`` none (``x`` and ``y`` are the same step).

``within``: a run dies when its next event is more than ``within`` ms after
its first (``last_ts - first_ts <= within``, inclusive).

Late events (``ts <= watermark`` on arrival: their step is already done) go
to the ``late`` side output.

Parallelism: KEYED when a key is given (``key=`` or a preceding ``key_by``);
with no key the whole stream is one sequence, and the instance reports
SINGLETON.

State: each key's runs live in the deployment's keyed state backend (``pescheduler.state``:
memory or disk, docs/state.md; an unkeyed pattern's under the key ``None``), so a checkpoint
holds whole key groups and a rescale moves key groups. A watermark reads each key it steps
once and writes it once.
"""

from __future__ import annotations

import re
from itertools import groupby
from operator import itemgetter
from typing import Any, Callable

from pescheduler.operator import MAX_WATERMARK, MIN_WATERMARK
from pescheduler.operator import Emitter, Operator, OperatorContext, Parallelism, per_instance
from pescheduler.state import MemoryState, adopt
from pescheduler.state.groups import (add_groups, merge_groups, parted, restore_groups, snapshot_groups, split_groups,
                                     take_groups)
from pescheduler.timeutil import parse_duration


_TOKEN = re.compile(r"\s*(?:([A-Za-z_][A-Za-z0-9_]*)|([()|+*?]))")


# -- the regular expression: parsed, then compiled to a Glushkov NFA -----------------
# A Glushkov (position) automaton has one state per symbol occurrence and no
# epsilon moves: a run's state is "the position it took last", which is all a
# run needs to carry besides its measures.

def _tokens(text: str) -> list[str]:
    out, i = [], 0
    text = text.rstrip()
    while i < len(text):
        m = _TOKEN.match(text, i)
        if not m:
            raise ValueError(f"pattern {text!r}: unexpected {text[i:].strip()[:10]!r} at {i}")
        out.append(m.group(1) or m.group(2))
        i = m.end()
    return out


class _Parser:
    """Recursive descent: alt := seq ('|' seq)*; seq := item+; item := atom [+*?]*."""

    def __init__(self, text: str) -> None:
        self.text, self.toks, self.i, self.symbols = text, _tokens(text), 0, []

    def parse(self) -> tuple:
        node = self.alt()
        if self.i != len(self.toks):
            raise ValueError(f"pattern {self.text!r}: unexpected {self.toks[self.i]!r}")
        return node

    def peek(self) -> str | None:
        return self.toks[self.i] if self.i < len(self.toks) else None

    def alt(self) -> tuple:
        node = self.seq()
        while self.peek() == "|":
            self.i += 1
            node = ("|", node, self.seq())
        return node

    def seq(self) -> tuple:
        items = []
        while self.peek() not in (None, "|", ")"):
            items.append(self.item())
        if not items:
            raise ValueError(f"pattern {self.text!r}: empty alternative or group")
        node = items[0]
        for it in items[1:]:
            node = (".", node, it)
        return node

    def item(self) -> tuple:
        tok = self.peek()
        self.i += 1
        if tok == "(":
            node = self.alt()
            if self.peek() != ")":
                raise ValueError(f"pattern {self.text!r}: missing ')'")
            self.i += 1
        elif tok in ("+", "*", "?", ")"):
            raise ValueError(f"pattern {self.text!r}: {tok!r} has nothing to apply to")
        else:
            node = ("sym", len(self.symbols))
            self.symbols.append(tok)
        while self.peek() in ("+", "*", "?"):
            node = (self.peek(), node)
            self.i += 1
        return node


def _glushkov(node: tuple, follow: dict[int, set]) -> tuple[bool, set, set]:
    """``(nullable, first, last)`` of ``node``; fills ``follow`` (position -> next positions)."""
    op = node[0]
    if op == "sym":
        follow.setdefault(node[1], set())
        return False, {node[1]}, {node[1]}
    if op in ("+", "*", "?"):
        nullable, first, last = _glushkov(node[1], follow)
        if op != "?":
            for p in last:
                follow[p] |= first
        return nullable or op != "+", first, last
    n1, f1, l1 = _glushkov(node[1], follow)
    n2, f2, l2 = _glushkov(node[2], follow)
    if op == "|":
        return n1 or n2, f1 | f2, l1 | l2
    for p in l1:                                   # concatenation
        follow[p] |= f2
    return n1 and n2, f1 | f2 if n1 else f1, l1 | l2 if n2 else l2


class Pattern(Operator):
    """NFA pattern matching over an event-time stream; see the module docstring."""

    name = "pattern"
    # planned as KEYED; an instance is SINGLETON until it has a key (key= or, at open, a key_by's)
    parallelism = per_instance(Parallelism.KEYED,
                               lambda op: Parallelism.SINGLETON if op._key is None else Parallelism.KEYED)
    outputs = ("late",)

    def __init__(self, pattern: str, define: dict[str, Callable], do: dict[str, Callable] | None = None,
                 within: Any = None, output: Callable[[dict], dict] | None = None,
                 key: str | Callable | None = None, ts_field: str = "ts") -> None:
        parser = _Parser(pattern)
        tree = parser.parse()
        follow: dict[int, set] = {}
        nullable, first, last = _glushkov(tree, follow)
        if nullable:
            raise ValueError(f"pattern {pattern!r} matches the empty sequence; make one symbol mandatory")
        missing = sorted(set(parser.symbols) - set(define))
        if missing:
            raise ValueError(f"pattern {pattern!r}: no predicate in define= for {missing}")
        unknown = sorted(set(do or {}) - set(parser.symbols))
        if unknown:
            raise ValueError(f"pattern {pattern!r}: do= names symbols not in the pattern: {unknown}")
        do = do or {}
        # position -> (symbol, predicate, do, accepting, next positions)
        self._pos = [(s, define[s], do.get(s), p in last, tuple(sorted(follow[p])))
                     for p, s in enumerate(parser.symbols)]
        self._first = tuple(sorted(first))
        self._ids = 0                         # run identities: one per distinct sequence of events
        self.within = None if within is None else parse_duration(within)
        self.output = output
        self.ts_field = ts_field
        self._ts = itemgetter(ts_field)
        self._set_key(key)
        # key -> [(positions, measures, start_ts, events id)]; in memory until open() moves it to
        # the deployment's backend (restore comes before open)
        self._runs = MemoryState()
        self._earliest = MAX_WATERMARK       # no run starts before this (within: nothing to expire)
        self._pending: list = []             # events not yet passed by the watermark
        self._wm = MIN_WATERMARK

    def _set_key(self, key: str | Callable | None) -> None:
        self._key = itemgetter(key) if isinstance(key, str) else key
        self._key_field = key if isinstance(key, str) else None

    def open(self, context: OperatorContext) -> None:
        super().open(context)
        if self._key is None and context.key_field is not None:
            self._set_key(context.key_field)
        self._runs = adopt(context, self._runs)

    # -- data -------------------------------------------------------------------------
    def process(self, batch: list, emit: Emitter) -> None:
        wm, ts_of, pending = self._wm, self._ts, self._pending
        for e in batch:
            if ts_of(e) <= wm:
                emit.to("late", e)
            else:
                pending.append(e)

    def on_watermark(self, watermark: int, emit: Emitter) -> None:
        self._wm = watermark
        ts_of = self._ts
        ready = [e for e in self._pending if ts_of(e) <= watermark]
        if ready:
            self._pending = [e for e in self._pending if ts_of(e) > watermark]
            ready.sort(key=ts_of)                 # stable: arrival order within a timestamp
            key, state, read = self._key, self._runs, {}
            for ts, step in groupby(ready, ts_of):
                groups: dict[Any, list] = {}
                for e in step:
                    groups.setdefault(key(e) if key is not None else None, []).append(e)
                for k, events in groups.items():
                    read[k] = self._step(read[k] if k in read else state.get(k, ()), ts, events, emit)
            state.write_many(((k, runs) for k, runs in read.items() if runs),
                              [k for k, runs in read.items() if not runs])
        if self.within is not None:
            self._expire(watermark)

    def _step(self, before: Any, ts: int, events: list, emit: Emitter) -> list:
        """Every run of a key (``before``) takes one of ``events`` (all at ``ts``) or dies; each
        may start one; returns the key's runs after the step.

        Runs that took the same events (the same run identity and event) and
        reach equal measures merge into one: their position sets unite. So a
        match is emitted once per distinct event sequence and output.
        """
        pos, within = self._pos, self.within
        ids: dict = {}                             # (parent id, event index) -> new id
        new: dict = {}                             # new id -> [[positions, measures, start, accepting]]
        for positions, measures, start, ident in before:
            if within is None or ts - start <= within:
                nexts = {q for p in positions for q in pos[p][4]}
                self._take(sorted(nexts), measures, start, ident, events, ids, new)
        self._take(self._first, {}, ts, None, events, ids, new)
        runs = []
        for ident, entries in new.items():
            done: list = []
            for positions, m, start, accepting in entries:
                if accepting:
                    result = self._result(m, start, ts)
                    if result not in done:
                        done.append(result)
                        emit(result)
                alive = tuple(sorted(q for q in positions if pos[q][4]))
                if alive:
                    runs.append((alive, m, start, ident))
                    if start < self._earliest:
                        self._earliest = start
        return runs

    def _take(self, nexts: Any, measures: dict, start: int, ident: Any, events: list,
              ids: dict, new: dict) -> None:
        pos = self._pos
        for i, e in enumerate(events):
            for q in nexts:
                _sym, pred, do, accepting, _follow = pos[q]
                if not pred(e, measures):
                    continue
                m = {**measures, **do(e, measures)} if do is not None else measures
                eid = ids.get((ident, i))
                if eid is None:
                    eid = ids[ident, i] = self._ids
                    self._ids += 1
                entries = new.setdefault(eid, [])
                for entry in entries:
                    if entry[1] is m or entry[1] == m:
                        entry[0].add(q)
                        entry[3] = entry[3] or accepting
                        break
                else:
                    entries.append([{q}, m, start, accepting])

    def _result(self, measures: dict, start: int, ts: int) -> Any:
        if self.output is not None:
            return self.output(measures)
        return {**measures, "start_ts": start, "ts": ts}

    def _expire(self, watermark: int) -> None:
        """Drop runs whose window is over: their next event (ts > watermark) is too far (a pass
        over the keys only when some run started that long ago)."""
        horizon = watermark - self.within        # start <= horizon: watermark + 1 - start > within
        if self._earliest > horizon:
            return
        state, puts, gone, earliest = self._runs, [], [], MAX_WATERMARK
        for g in state.groups():
            for k, held in state.items(g):
                runs = [r for r in held if r[2] > horizon]
                if not runs:
                    gone.append(k)
                    continue
                if len(runs) != len(held):
                    puts.append((k, runs))
                earliest = min(earliest, *(r[2] for r in runs))
        state.write_many(puts, gone)
        self._earliest = earliest

    def runs(self) -> dict:
        """``{key: runs}`` (a copy: for tests and inspection, not the hot path)."""
        return {k: list(v) for k, v in self._runs.entries()}

    # -- state: runs by key, in whole key groups ------------------------------------------
    def snapshot(self) -> dict:
        """The key groups of the runs (packed when read: a copy), events waiting for the
        watermark, and the watermark."""
        return {"symbols": [p[0] for p in self._pos], "watermark": self._wm,
                "pending": list(self._pending), "ids": self._ids, "key": self._key_field,
                "groups": snapshot_groups(self._runs)}

    def _check_symbols(self, state: dict) -> None:
        symbols = [p[0] for p in self._pos]
        if state["symbols"] != symbols:
            raise ValueError(f"pattern state over symbols {state['symbols']} cannot be restored "
                             f"into a pattern over {symbols}")

    def restore(self, state: dict) -> None:
        self._check_symbols(state)
        self._wm = state["watermark"]
        self._pending = list(state["pending"])
        self._ids = state["ids"]
        if "groups" in state:
            restore_groups(self._runs, state["groups"])
        else:                                   # a checkpoint from before the keyed state backend
            self._runs.drop_groups(self._runs.groups())
            self._runs.write_many(((k, [(p, dict(m), s, i) for p, m, s, i in v]) for k, v in state["runs"].items()))
        self._earliest = MIN_WATERMARK          # the next expiry looks at every run once

    # -- copies: key groups move with their runs and waiting events ------------------------
    def _keyed(self, state: dict | None = None) -> Callable:
        """The key of the events; an instance not opened (the deployer's, splitting a snapshot)
        takes the key field the snapshot names (a preceding ``key_by``'s)."""
        if self._key is None and state is not None and state.get("key") is not None:
            return itemgetter(state["key"])
        if self._key is None:
            raise ValueError("an unkeyed pattern is one sequence: it cannot be split into copies")
        return self._key

    def export_groups(self, groups: frozenset[int]) -> dict:
        """A rescale takes key groups ``groups`` away (pescheduler/worker/handover.py): their runs
        and waiting events, removed here, the runs packed only when the part is pickled. Run
        identities stay unique: the ids counter goes with them (the importer takes the larger)."""
        key = self._keyed()
        leaving, self._pending = parted(self._pending, map(key, self._pending), groups)
        return {"symbols": [p[0] for p in self._pos], "watermark": self._wm, "pending": leaving,
                "ids": self._ids, "key": self._key_field, "groups": take_groups(self._runs, groups)}

    def import_groups(self, state: dict) -> None:
        """Key groups another instance exported join this running one; its own watermark stays
        (the events handed over wait for the next one, in their timestamp order)."""
        self._check_symbols(state)
        add_groups(self._runs, state["groups"])
        self._pending = self._pending + list(state["pending"])
        self._ids = max(self._ids, state["ids"])
        self._earliest = MIN_WATERMARK          # the next expiry looks at every run once

    def split_state(self, state: dict, owns: Callable[[Any], bool]) -> dict:
        """The runs and waiting events of the key groups where ``owns(key)``; the watermark as it
        was (a checkpoint of the old per-key form: its keys)."""
        key = self._keyed(state)
        mine = {**state, "pending": [e for e in state["pending"] if owns(key(e))]}
        if "groups" in state:
            mine["groups"] = split_groups(state["groups"], owns)
        else:
            mine["runs"] = {k: v for k, v in state["runs"].items() if owns(k)}
        return mine

    def merge_states(self, states: list) -> dict:
        """Every instance's runs and waiting events (disjoint keys), at the least advanced
        watermark, so no step is taken twice or skipped."""
        merged = {**states[0], "pending": [e for st in states for e in st["pending"]],
                  "watermark": min(st["watermark"] for st in states), "ids": max(st["ids"] for st in states)}
        if all("groups" in st for st in states):
            merged["groups"] = merge_groups([st["groups"] for st in states])
        elif any("groups" in st for st in states):
            raise ValueError("pattern: cannot merge a per-key checkpoint with a key-group one")
        else:
            merged["runs"] = {k: v for st in states for k, v in st["runs"].items()}
        return merged
