"""The native provider: queries as a chain of the project's operators, run in-process.

In-process, events go through a :class:`pescheduler.worker.chain.Chain` of the
registered operator plug-ins, fed and watermarked by
:class:`pescheduler.worker.source_driver.SourceDriver` exactly as in a PE: one code
path. :meth:`NativeProcessor.application` builds the same operators, with the
same parameters, into an ``Application``.

Sharing: aggregate queries that read the same stream (no filter in front),
key and window share one window operator and one aggregate plan, so each
distinct aggregate is computed once per window for all of them; queries may
come and go while events flow. A query sees the events pushed after it was created,
as on a database: a window query created after events came in gets a window operator
of its own (``NativeProcessor._shared``), and reports only the windows it saw whole
(``first_whole_start``, docs/operators.md: the one rule for mid-stream queries).

Schemas: ``push_event`` checks the payload and raises :class:`SchemaError`
(naming the field and the type it expects) before anything changes. A
deployed application checks the same way in an ``ep_schema`` operator and
dead-letters what does not fit.

Busy time: the chain measures each operator on ``time.perf_counter`` (wall time, no
system call), not a PE's ``busy_clock``: in-process nothing sizes by it, and with
one event per batch its system calls were a tenth of the time.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from time import perf_counter
from typing import Any, Callable, Mapping

from ..operator import DeadLetter, Emitter, Operator, OperatorContext
from ..operators.ep_pattern import pattern_functions
from ..plan.app import Application, Stream as AppStream
from ..worker.chain import Chain, MIN_WATERMARK
from ..worker.source_driver import SourceDriver, pump
from .api import (Aggregate, Correlate, Definition, EventProcessor, Pattern, Stream, _span,
                  correlation_keys, engine, function)
from .schema import TS_FIELD, Schema


@dataclass
class _Node:
    """One operator of the processor's graph, as ``application()`` rebuilds it."""

    op: Operator
    kind: str
    name: str
    inputs: list[str]
    owners: set = field(default_factory=set)     # query ids using it


@dataclass
class _StreamState:
    schema: Schema
    max_delay: int
    op_id: str
    source: Operator
    driver: SourceDriver
    pushed: int = 0                               # events pushed so far (see NativeProcessor._shared)


@engine("native")
class NativeProcessor(EventProcessor):
    """The in-process engine: a chain of the project's operators; see the module docstring.

    ``share=False`` gives every aggregate query its own window operator (the
    baseline the sharing benchmark measures against).
    """

    def __init__(self, provider: Any = "native", share: bool = True) -> None:
        super().__init__("native")
        self.share = share
        self._streams: dict[str, _StreamState] = {}
        self._nodes: dict[str, _Node] = {}          # insertion order is topological
        self._groups: dict[tuple, str] = {}         # shared window key -> op id
        self._epochs: dict[str, tuple] = {}         # shared op id -> its inputs' events pushed when made
        self._late: dict[str, list] = {}
        self._chain: Chain | None = None
        self._rebuild()

    # -- streams ------------------------------------------------------------------------------
    def register_stream(self, name: str, schema: Mapping[str, Any], max_delay: Any = 0) -> None:
        """Declare stream ``name`` with ``schema`` ({field: type}); events are checked against it."""
        from pescheduler.operators.ep_io import PushedSource

        self._check_new_stream(name)
        source = PushedSource(max_delay=max_delay)
        op_id = f"stream.{name}"
        self._streams[name] = _StreamState(Schema(name, schema), source.max_delay, op_id, source,
                                           SourceDriver(op_id, source, 10_000))
        self._rebuild()

    def remove_stream(self, name: str) -> None:
        self._check_unread(name)
        del self._streams[name]
        self._rebuild()

    # -- queries ------------------------------------------------------------------------------
    def create_query(self, query_id: Any, definition: Any) -> None:
        definition = self._new_query(query_id, definition)
        self._processors[query_id] = []
        try:
            self._build(query_id, definition)
        except Exception:
            self._drop_owner(query_id)
            del self._processors[query_id]
            raise
        self._queries[query_id] = definition
        newest = self._streams[definition.stream.name].driver.max_ts
        self._note_whole_from(query_id, definition, None if newest == MIN_WATERMARK else newest)
        self._rebuild()

    def remove_query(self, query_id: Any) -> None:
        self._known_query(query_id)
        self._drop_owner(query_id)
        del self._queries[query_id], self._processors[query_id]
        self._whole_from.pop(query_id, None)
        self._rebuild()

    # -- events -------------------------------------------------------------------------------
    def _push(self, stream: str, events: list[dict]) -> None:
        state = self._streams[stream]
        state.pushed += len(events)
        state.source.offer(events)
        self._pump(state)

    def _pump(self, state: _StreamState) -> None:
        """Move what the stream's source holds into the chain, with watermarks, as a PE does
        (until it holds nothing: no empty read after the last batch, one event is one read)."""
        while pump(state.driver, self._chain) and state.source.holding():
            pass

    def _end(self) -> None:
        for state in self._streams.values():
            state.source.end()
            self._pump(state)

    # -- what came out besides results --------------------------------------------------------
    def late(self, query_id: Any) -> list:
        late = []
        for op_id, node in self._nodes.items():
            if query_id in node.owners:
                items = self._late.get(op_id, ())
                tagged = node.name in ("ep_group", "ep_patterns", "ep_correlate")   # (member or query, event)
                late += [e for m, e in items if m == query_id] if tagged else items
        return late

    def dead_letters(self) -> list[DeadLetter]:
        return self._dead + self._chain.dead_letters

    # -- building the graph -------------------------------------------------------------------
    def _build(self, query_id: Any, d: Definition) -> None:
        """Add the operators of ``d``; an aggregate joins a shared window when one fits."""
        prev = self._streams[d.stream.name].op_id
        if d.terminal is None and self.share:
            self._filters(query_id, d, prev)
            return
        t, window = d.terminal, d.stream.window
        if isinstance(t, Aggregate):
            for i, f in enumerate(d.filters, start=1):
                prev = self._add(f"{query_id}.filter{i}", "filter", {"fn": function(f.predicate)}, [prev],
                                 query_id)
            self._aggregate(query_id, d.stream, prev, t)
            return
        if isinstance(t, Correlate):
            within = t.within if t.within is not None else _span(window, "correlate")
            if self._shared_correlation(query_id, d, t, within, prev):
                return
            keys = {name: function(getattr(t, name)) for name in ("on", "left_key", "right_key")
                    if getattr(t, name) is not None}
            derived = correlation_keys(d, t, self._schema)
            if not keys and derived:
                keys = {"left_key": derived[0].function(), "right_key": derived[1].function()}
            op = ("join", {"within": within, "predicate": function(t.predicate), **keys})
            inputs = [prev, self._stream(t.right).op_id]
        else:
            within = t.within if t.within is not None else _span(window, "pattern")
            if self.share and not d.filters:       # one hold, shared runs (operators/ep_pattern.py)
                spec = {"pattern": t.pattern, "define": t.define, "do": t.do, "within": within,
                        "output": t.output}
                self._shared(query_id, (prev, "ep_patterns", d.stream.key), "ep_patterns", [prev],
                             d.stream.name, {"key": d.stream.key, "queries": {query_id: spec}},
                             lambda op: op.add_query(query_id, spec))
                return
            define, do = pattern_functions(t.define, t.do)
            op = ("pattern", {"pattern": t.pattern, "define": define, "do": do, "within": within,
                              "output": t.output, "key": d.stream.key})
            inputs = [prev]
        ops = [("filter", {"fn": function(f.predicate)}) for f in d.filters] + [op]
        both = len(inputs) == 2 and inputs[0] == inputs[1]      # a stream correlated with itself
        if both:
            inputs = inputs[:1]
        if self.share or both:     # one chain operator for every such query over these inputs
            label = "+".join(i.split(".", 1)[1] for i in inputs)
            group = ("ep_group", *inputs) if self.share else ("ep_group", query_id)
            self._shared(query_id, group, "ep_group", inputs, label,
                         {"inputs": len(inputs), "members": {query_id: {"query": query_id, "ops": ops,
                                                                        "both": both}}},
                         lambda group: group.add_member(query_id, query_id, ops, both))
            return
        for i, (name, params) in enumerate(ops[:-1], start=1):
            prev = self._add(f"{query_id}.filter{i}", name, params, [prev], query_id)
        suffix = "correlate" if isinstance(t, Correlate) else "pattern"
        prev = self._add(f"{query_id}.{suffix}", op[0], op[1], [prev, *inputs[1:]], query_id)
        self._add(f"{query_id}.out", "ep_output", {"processors": {query_id: self._processors[query_id]}},
                  [prev], query_id, kind="sink")

    def _shared_correlation(self, query_id: Any, d: Definition, t: Correlate, within: Any, prev: str) -> bool:
        """A correlation of two streams whose predicate keys a hash join up to its literals joins the
        ``ep_correlate`` operator of its shape (operators/ep_correlate.py); False when it cannot."""
        from pescheduler.operators.ep_correlate import split

        if not self.share or d.filters or t.right == d.stream.name or any(
                getattr(t, k) is not None for k in ("on", "left_key", "right_key")):
            return False
        names = {"left": d.stream.name, "right": t.right}
        form = split(t.predicate, lambda side, name: self._schema(names[side]).fields.get(name))
        if form is None:
            return False
        shape, left, right, constant, exact = form
        spec = {"predicate": t.predicate, "within": within}
        inputs = [prev, self._stream(t.right).op_id]
        self._shared(query_id, ("ep_correlate", *inputs, shape), "ep_correlate", inputs,
                     f"{d.stream.name}+{t.right}",
                     {"shape": shape, "left": left, "right": right, "constant": constant, "exact": exact,
                      "queries": {query_id: spec}},
                     lambda op: op.add_query(query_id, spec))
        return True

    def _filters(self, query_id: Any, d: Definition, prev: str) -> None:
        """A filter-only query joins its stream's one ``ep_filter`` operator (operators/ep_filter.py)."""
        predicates = [f.predicate for f in d.filters]
        self._shared(query_id, (prev, "ep_filter"), "ep_filter", [prev], d.stream.name,
                     {"queries": {query_id: predicates}}, lambda op: op.add_query(query_id, predicates))

    def _shared(self, query_id: Any, group: tuple, name: str, inputs: list[str], label: str, params: dict,
                join: Callable[[Operator], None], fresh: bool = False) -> None:
        """The operator of ``group`` (created with ``params`` and a tagged output the first time)
        serves ``query_id`` too (``join(op)`` adds it).

        ``fresh`` (windows): a query sees the events pushed after it was created, as on the SQL
        providers (each query's window tables start empty), so it joins the group's operator
        only while no event has come in since that was made; else it gets a new one, which the
        queries after it join (until events come in). Shared correlations and patterns need no
        new operator: they hold events, not results, and tell a query's events by arrival.
        """
        epoch = tuple(self._pushed(i) for i in inputs)
        op_id = self._groups.get(group)
        if op_id is not None and fresh and self._epochs.get(op_id) != epoch:
            op_id = None
        if op_id is None:
            op_id = f"{name}{len(self._groups) + 1}.{label}"
            while op_id in self._nodes:
                op_id += "'"
            self._add(op_id, name, params, inputs, query_id)
            grouped = getattr(self._nodes[op_id].op, "grouped", False)    # (query_id, rows or partners, template, field) items: ep_io
            self._add(f"{op_id}.out", "ep_output",
                      {"processors": self._processors, "tagged": True, "grouped": grouped},
                      [op_id], query_id, kind="sink")
            self._nodes[f"{op_id}.out"].op.whole_from = self._whole_from    # the live dict
            self._groups[group], self._epochs[op_id] = op_id, epoch
            return
        join(self._nodes[op_id].op)
        for shared in (op_id, f"{op_id}.out"):
            self._nodes[shared].owners.add(query_id)

    def _pushed(self, op_id: str) -> int:
        """Events pushed so far into the stream whose source is ``op_id`` (0 for an operator)."""
        return next((s.pushed for s in self._streams.values() if s.op_id == op_id), 0)

    def _aggregate(self, query_id: Any, stream: Stream, prev: str, t: Aggregate) -> None:
        if stream.window is None:
            raise ValueError(f"query {query_id!r}: an aggregate needs a window on its stream, "
                             f"e.g. ep.Stream({stream.name!r}, window=ep.Tumbling('1s'))")
        name, params = stream.window.operator()
        if name == "over_window" and self.share:      # every size in one operator (operators/ep_over.py)
            size = params["size"]
            self._shared(query_id, (prev, "ep_over", stream.key), "ep_over", [prev], stream.name,
                         {"key": stream.key, "lanes": {size: {query_id: t.aggregates}}},
                         lambda op: op.add_query(query_id, size, t.aggregates), fresh=True)
            return
        group = (prev, name, tuple(sorted(params.items())), stream.key,
                 None if self.share else query_id)
        self._shared(query_id, group, name, [prev], stream.name,
                     {**params, "key": stream.key, "queries": {query_id: t.aggregates}},
                     lambda op: op.add_query(query_id, t.aggregates), fresh=True)

    def _add(self, op_id: str, name: str, params: dict, inputs: list[str], query_id: Any,
             kind: str = "operator") -> str:
        from ..plugins import active_plugins

        if op_id in self._nodes:
            raise ValueError(f"operator id {op_id!r} is taken; choose another query id")
        op = active_plugins().operator(name, kind)(**params)
        op.open(OperatorContext(op_id, pe_id="ep", extra={"inputs": list(inputs)}))
        self._nodes[op_id] = _Node(op, kind, name, list(inputs), {query_id})
        return op_id

    def _drop_owner(self, query_id: Any) -> None:
        """Release what ``query_id`` used: shared windows drop its query, unused operators go."""
        for op_id, node in list(self._nodes.items()):
            if query_id not in node.owners:
                continue
            node.owners.discard(query_id)
            if query_id in getattr(node.op, "query_ids", ()):
                node.op.remove_query(query_id)
            if query_id in getattr(node.op, "members", ()):
                node.op.remove_member(query_id)
            if not node.owners:
                del self._nodes[op_id]
                self._late.pop(op_id, None)
        live = set(self._nodes)
        self._groups = {g: op_id for g, op_id in self._groups.items() if op_id in live}
        self._epochs = {op_id: e for op_id, e in self._epochs.items() if op_id in live}

    def _rebuild(self) -> None:
        """A new chain over the current operators; operator state and watermarks carry over.

        The ``ep_output`` sinks are the chain's outputs (:class:`_Delivery`), not operators in
        it: results reach the processors as directly, without a batch's bookkeeping and a
        watermark step per sink (about 5 % of a filter query's time per event, 2 % of JEPC mixed's).
        """
        ops = {s.op_id: s.source for s in self._streams.values()}
        ops.update((op_id, n.op) for op_id, n in self._nodes.items() if n.kind != "sink")
        edges = [(src, "out", op_id) for op_id, n in self._nodes.items() if n.kind != "sink"
                 for src in n.inputs]
        outputs: dict[tuple[str, str], list] = {}
        for op_id, n in self._nodes.items():
            if n.kind == "sink":
                for src in n.inputs:
                    outputs.setdefault((src, "out"), []).append(_Delivery(op_id, n.op, self))
        old, self._chain = self._chain, Chain(ops, edges, outputs=outputs, on_side=self._side,
                                              clock=perf_counter)
        if old is not None:
            self._dead.extend(old.dead_letters)
            self._chain.restore_progress({k: v for k, v in old.progress().items() if k in ops})
        for state in self._streams.values():
            if state.driver.emitted_wm > MIN_WATERMARK:     # bring new operators up to event time
                self._chain.watermark_from(state.op_id, state.driver.emitted_wm)

    def _side(self, op_id: str, port: str, items: list) -> None:
        self._late.setdefault(op_id, []).extend(items)

    # -- compiling to an application ------------------------------------------------------------
    def application(self, name: str, sources: Mapping[str, Any]) -> Application:
        """The queries as an :class:`Application` for ``pescheduler.deploy``.

        ``sources[stream]`` says where each stream's events come from in the
        deployment: ``(registry_name, params)`` of a source (its tuples carry
        ``ts``), or a list of ``(payload, ts)`` pairs (an ``iterable`` source).
        Every event passes an ``ep_schema`` check; then come the very
        operators this processor runs, with their current parameters
        (``Operator.parameters()``: shared windows carry all their queries).
        """
        app = Application(name)
        handles: dict[str, AppStream] = {}
        used = set().union(*(d.streams() for d in self._queries.values())) if self._queries else set()
        for stream in sorted(used):
            state = self._stream(stream)
            if stream not in sources:
                raise ValueError(f"application: no source for stream {stream!r}; pass "
                                 f"sources={{{stream!r}: ('jsonl', {{'path': ...}})}} or a list of events")
            src_name, params = _source_spec(sources[stream])
            params.setdefault("max_delay", state.max_delay)
            raw = app.source(src_name, id=f"{state.op_id}.source", **params)
            handles[state.op_id] = raw.apply("ep_schema", id=state.op_id, schema=state.schema)
        for op_id, node in self._nodes.items():
            ins = [handles[src] for src in node.inputs]
            params = node.op.parameters()
            if node.kind == "sink":
                handles[op_id] = ins[0].sink(node.name, id=op_id, **params)
            elif len(ins) == 2:                       # a join, or the group of the correlations
                node_ = app._add("operator", node.name, params, [(h.op_id, h.port) for h in ins], op_id, None)
                handles[op_id] = AppStream(app, node_.op_id)
            else:
                handles[op_id] = ins[0].apply(node.name, id=op_id, **params)
        return app


class _Delivery:
    """An ``ep_output`` as one of the chain's outputs (``Chain(outputs=...)``): each result
    batch goes to its ``process`` as it leaves the operator; what a processor rejects joins
    the chain's dead letters under the sink's id, as when it ran in the chain. ``timeless``:
    results carry their own times, so the chain does not call :meth:`watermark` (once per
    operator per pushed event, for nothing)."""

    timeless = True

    def __init__(self, op_id: str, op: Operator, proc: NativeProcessor) -> None:
        self.op_id, self.op, self.proc = op_id, op, proc

    def send(self, batch: list) -> None:
        emit = Emitter()
        self.op.process(batch, emit)
        if emit.dead:
            self.proc._chain.dead_letters.extend(DeadLetter(d.item, d.error, self.op_id) for d in emit.dead)

    def watermark(self, wm: int) -> None:
        """Results carry their own times: nothing waits for event time here."""

    def end(self) -> None:
        """Nothing is held: every result was handed over when it came."""


def _source_spec(spec: Any) -> tuple[str, dict]:
    if isinstance(spec, tuple) and len(spec) == 2 and isinstance(spec[0], str):
        return spec[0], dict(spec[1])
    if isinstance(spec, list):
        return "iterable", {"items": [{**payload, TS_FIELD: ts} for payload, ts in spec]}
    raise TypeError(f"a stream's source is (registry_name, params) or a list of (payload, ts), "
                    f"got {spec!r}")
