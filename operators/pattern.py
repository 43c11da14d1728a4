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

Strict contiguity, per key: events are taken in timestamp order (they are
buffered until the watermark passes them, so matches come out ``max_delay``
after their last event). A run is a partial match; at each step it must take
the next event of its key or it dies. Every event may also start a new run,
so runs overlap and all matches are found (like ``ALL MATCHES`` with
overlapping starts). A completed match is emitted once, when its last event is
taken; a run in an accepting state that can go on (``y+`` at the end) stays
alive, so ``x y+`` reports ``x y``, ``x y y``, ... each once. Distinct ways
to match (other events, or the same events read as other symbols) are
distinct matches.

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
"""

from __future__ import annotations

import re
from itertools import groupby
from operator import itemgetter
from typing import Any, Callable

from pescheduler.operator import MIN_WATERMARK
from pescheduler.operator import Emitter, Operator, OperatorContext, Parallelism, per_instance
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
        self.within = None if within is None else parse_duration(within)
        self.output = output
        self.ts_field = ts_field
        self._ts = itemgetter(ts_field)
        self._set_key(key)
        self._runs: dict[Any, list] = {}     # key -> [(position, measures, start_ts)]
        self._pending: list = []             # events not yet passed by the watermark
        self._wm = MIN_WATERMARK

    def _set_key(self, key: str | Callable | None) -> None:
        self._key = itemgetter(key) if isinstance(key, str) else key

    def open(self, context: OperatorContext) -> None:
        super().open(context)
        if self._key is None and context.key_field is not None:
            self._set_key(context.key_field)

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
            key = self._key
            for ts, step in groupby(ready, ts_of):
                groups: dict[Any, list] = {}
                for e in step:
                    groups.setdefault(key(e) if key is not None else None, []).append(e)
                for k, events in groups.items():
                    self._step(k, ts, events, emit)
        if self.within is not None:
            self._expire(watermark)

    def _step(self, k: Any, ts: int, events: list, emit: Emitter) -> None:
        """Every run of key ``k`` takes one of ``events`` (all at ``ts``) or dies; each may start one."""
        pos, within = self._pos, self.within
        runs = []
        for p, measures, start in self._runs.get(k, ()):
            if within is None or ts - start <= within:
                self._take(pos[p][4], measures, start, ts, events, runs, emit)
        self._take(self._first, {}, ts, ts, events, runs, emit)
        if runs:
            self._runs[k] = runs
        else:
            self._runs.pop(k, None)

    def _take(self, nexts: tuple, measures: dict, start: int, ts: int, events: list,
              runs: list, emit: Emitter) -> None:
        pos = self._pos
        for e in events:
            for q in nexts:
                _sym, pred, do, accepting, follow = pos[q]
                if not pred(e, measures):
                    continue
                m = {**measures, **do(e, measures)} if do is not None else measures
                if accepting:
                    emit(self._result(m, start, ts))
                if follow:
                    runs.append((q, m, start))

    def _result(self, measures: dict, start: int, ts: int) -> Any:
        if self.output is not None:
            return self.output(measures)
        return {**measures, "start_ts": start, "ts": ts}

    def _expire(self, watermark: int) -> None:
        """Drop runs whose window is over: their next event (ts > watermark) is too far."""
        horizon = watermark - self.within        # start <= horizon: watermark + 1 - start > within
        for k in list(self._runs):
            runs = [r for r in self._runs[k] if r[2] > horizon]
            if runs:
                self._runs[k] = runs
            else:
                del self._runs[k]

    # -- state --------------------------------------------------------------------------
    def snapshot(self) -> dict:
        """Runs (measures copied), events waiting for the watermark, and the watermark."""
        return {"symbols": [p[0] for p in self._pos], "watermark": self._wm,
                "pending": list(self._pending),
                "runs": {k: [(p, dict(m), s) for p, m, s in v] for k, v in self._runs.items()}}

    def restore(self, state: dict) -> None:
        symbols = [p[0] for p in self._pos]
        if state["symbols"] != symbols:
            raise ValueError(f"pattern state over symbols {state['symbols']} cannot be restored "
                             f"into a pattern over {symbols}")
        self._wm = state["watermark"]
        self._pending = list(state["pending"])
        self._runs = {k: [(p, dict(m), s) for p, m, s in v] for k, v in state["runs"].items()}
