"""The ``pescheduler.ep`` queries that read the same inputs, run as one operator.

Count queries side by side (the JEPC workload) are Count operators and
Count output sinks in a chain: every event and every watermark crosses each
of them, and that per-operator cost (routing, watermark bookkeeping, busy
clocks) was most of an event's cost. ``ep_group`` holds those operators as
*members* and calls them directly: an event crosses one chain operator.
Members keep their own state and semantics (each is the very operator the
query would otherwise be), so results are the same; queries of one shape
share work inside their member where the operator does (shared windows, the
hash keys of a correlation).

``ep_group(inputs=1 | 2, members={member_id: {"query": query_id | None,
"ops": [(name, params), ...]}})``: a member is a small pipeline, filters
then one operator; with two inputs (a correlation), input 0 goes through
the filters, input 1 straight to the last operator's ``process_input``.
Results leave as ``(query_id, row)`` for a tagged ``ep_output``; a member
with ``"query": None`` is an operator that tags its rows itself (a window
shared by several queries). Side outputs (late events) leave as
``(member_id, item)``. A stream correlated with itself is a one-input group
whose member has ``"both": True``: each batch goes in as the left side
(through the filters), then whole as the right side, so that every ordered
pair within reach is reported once, an event with itself included (the
chain folds two edges from one operator into one input, so a two-input
join over the same stream would see only its left side).
"""

from __future__ import annotations

from typing import Any

from pescheduler.operator import Emitter, Operator, OperatorContext, Parallelism, overrides


class _Member:
    __slots__ = ("query", "names", "ops", "two", "both")

    def __init__(self, query: Any, names: list, ops: list, two: bool, both: bool) -> None:
        self.query, self.names, self.ops, self.two, self.both = query, names, ops, two, both


class QueryGroup(Operator):
    """Members sharing one chain operator; see the module docstring."""

    name = "ep_group"
    parallelism = Parallelism.SINGLETON
    outputs = ("late",)

    def __init__(self, inputs: int = 1, members: dict | None = None) -> None:
        if inputs not in (1, 2):
            raise ValueError(f"ep_group: inputs is 1 or 2, got {inputs!r}")
        self.inputs = inputs
        self.members: dict[Any, _Member] = {}
        self._context: OperatorContext | None = None
        for member_id, spec in (members or {}).items():
            self.add_member(member_id, spec["query"], spec["ops"], spec.get("both", False))

    def open(self, context: OperatorContext) -> None:
        super().open(context)
        self._context = context
        for m in self.members.values():
            self._open(m)

    def _open(self, m: _Member) -> None:
        if self._context is None:
            return
        c = self._context
        for op in m.ops:
            op.open(OperatorContext(c.op_id, pe_id=c.pe_id, extra=dict(c.extra)))

    def add_member(self, member_id: Any, query: Any, ops: list, both: bool = False) -> None:
        """``ops``: ``[(name, params) or an operator, ...]`` (filters, then the query's operator);
        ``both``: the one input is both inputs of the last operator (a stream correlated with itself)."""
        from pescheduler.plugins import active_plugins

        if member_id in self.members:
            raise ValueError(f"ep_group: member {member_id!r} exists already")
        built, names = [], []
        for op in ops:
            if not isinstance(op, Operator):
                name, params = op
                op = active_plugins().operator(name, "operator")(**params)
            built.append(op)
            names.append(op.name)
        m = _Member(query, names, built, self.inputs == 2 or both, both)
        self._open(m)
        self.members[member_id] = m

    def remove_member(self, member_id: Any) -> None:
        del self.members[member_id]

    def member(self, member_id: Any) -> Operator:
        """The last operator of ``member_id`` (the query's own: a join, a pattern, a window)."""
        return self.members[member_id].ops[-1]

    def parameters(self) -> dict:
        return {"inputs": self.inputs, "members": {
            mid: {"query": m.query, "ops": [(n, op.parameters()) for n, op in zip(m.names, m.ops)],
                  "both": m.both}
            for mid, m in self.members.items()}}

    # -- data ------------------------------------------------------------------------------
    def process(self, batch: list, emit: Emitter) -> None:
        self.process_input(0, batch, emit)

    def process_input(self, input_index: int, batch: list, emit: Emitter) -> None:
        for mid, m in self.members.items():
            b = batch
            ops = m.ops
            if input_index == 0:
                for f in ops[:-1]:
                    sub = Emitter()
                    f.process(b, sub)
                    self._rare(mid, sub, emit)
                    b = list(sub)
                    if not b:
                        break
                else:
                    self._run(mid, m, input_index, b, emit)
                if m.both:                     # then the whole batch as the right side
                    self._run(mid, m, 1, batch, emit)
            else:
                self._run(mid, m, input_index, b, emit)

    def _run(self, mid: Any, m: _Member, input_index: int, batch: list, emit: Emitter) -> None:
        sub = Emitter()
        if m.two:
            m.ops[-1].process_input(input_index, batch, sub)
        else:
            m.ops[-1].process(batch, sub)
        self._out(mid, m, sub, emit)

    def on_watermark(self, watermark: int, emit: Emitter) -> None:
        for mid, m in self.members.items():
            sub = Emitter()
            m.ops[-1].on_watermark(watermark, sub)
            self._out(mid, m, sub, emit)

    def flush(self, emit: Emitter) -> None:
        for mid, m in self.members.items():
            if overrides(m.ops[-1], "flush"):
                sub = Emitter()
                m.ops[-1].flush(sub)
                self._out(mid, m, sub, emit)

    def _out(self, mid: Any, m: _Member, sub: Emitter, emit: Emitter) -> None:
        if sub:
            if m.query is None:
                emit.many(sub)
            else:
                q = m.query
                emit.many([(q, row) for row in sub])
        self._rare(mid, sub, emit)

    @staticmethod
    def _rare(mid: Any, sub: Emitter, emit: Emitter) -> None:
        if sub.sides is not None:
            for port, items in sub.sides.items():
                for item in items:
                    emit.to(port, (mid, item))
        if sub.dead is not None:
            if emit.dead is None:
                emit.dead = []
            emit.dead.extend(sub.dead)

    # -- state: each member's operators -----------------------------------------------------
    def snapshot(self) -> dict:
        return {mid: [op.snapshot() for op in m.ops] for mid, m in self.members.items()}

    def restore(self, state: dict) -> None:
        for mid, states in state.items():
            for op, s in zip(self.members[mid].ops, states):
                if s is not None:
                    op.restore(s)
