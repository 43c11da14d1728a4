"""Fused execution: the operators of one PE calling each other directly.

A :class:`Chain` holds the operators fused into one processing element and a
routing table from ``(op_id, port)`` to what consumes it: another operator of
the same chain (a direct call, no copy) or an :class:`Output` leaving the PE (a
channel). The same class runs inside a worker's PE and in
``pescheduler.testing``, so a unit test exercises the exact code path of a
deployment.

Hot path: :meth:`Chain._run` runs once per batch per operator; everything
per tuple happens inside the operators' own loops. A linear run of fusable
stateless operators (map, filter, key_by: ``fusable = True`` and ``steps``)
runs as ONE generated loop per batch (:class:`FusedRun`), as Flink's operator
chaining with code generation or Beam's fused stages do, so a tuple costs no
Python call per operator and no intermediate list.

A batch is a list of tuples or a ``pyarrow.RecordBatch``; an operator that
does not declare ``columnar = True`` receives a RecordBatch as a list of dicts.

The cyclic GC is paused while a batch goes through the chain (``emit_from``, ``take_input``).
A fused run builds a list of new tuples that the next operator consumes and
drops; with the GC on, every 700 of them started a collection, and every
tenth of those a older one over the state and whatever else the process
holds (issue 16: the fused chain ran at 0.14 M events/s with the GC on,
0.17-0.23 M with it paused, the hand loop 0.18-0.23 M in the same run).
Tuples are acyclic, so deferring to the batch's end frees as much: whatever
survives is collected by the next ordinary collection (the channel decoder
pauses it the same way, channels.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import partial
from typing import Any, Callable, Iterable, Protocol

from ..errors import DeliveryFailed
from ..operator import MAX_WATERMARK, MIN_WATERMARK, DeadLetter, Emitter, Operator, Parallelism, overrides
from .routing import Router
from .busy import busy_clock
from .gc_pause import gc_paused



_NO_ARG = object()          # Chain._call without an argument (flush)


class CallbackError(RuntimeError):
    """An operator's on_watermark or flush raised: the PE cannot go on without losing results."""


class Output(Protocol):
    """Where a port's batches go when the consumer is outside the chain (a channel).

    Methods are synchronous and only buffer; the PE loop awaits the channel's
    credit afterwards, so backpressure is counted outside operator time.
    """

    def send(self, batch: list) -> None: ...
    def watermark(self, wm: int) -> None: ...
    def end(self) -> None: ...


@dataclass
class OperatorStats:
    """Counters the monitor reads; updated once per batch, never per tuple.

    ``busy_s`` is on :func:`~pescheduler.worker.busy.busy_clock`: the operator's time minus the
    time its thread waited for a CPU, so a rate per busy second is its true processing rate
    (DS2) whatever else shares the core."""

    tuples_in: int = 0
    tuples_out: int = 0
    batches_in: int = 0
    busy_s: float = 0.0
    dead_letters: int = 0
    side: dict = field(default_factory=dict)    # side port -> tuples emitted there


class Node:
    """One operator inside a chain, with its input watermarks and open inputs."""

    __slots__ = ("op_id", "op", "process", "process_input", "stats", "in_wm", "wm", "open_inputs",
                 "has_watermark", "holds", "out_wm", "has_flush", "stateless", "ended", "partial", "columnar", "targets")

    def __init__(self, op_id: str, op: Operator, inputs: Iterable[str]) -> None:
        self.op_id = op_id
        self.op = op
        self.process = op.process
        # an operator that tells its inputs apart: ``process_input(k, batch, emit)`` (a gate swaps it)
        self.process_input = op.process_input if overrides(op, "process_input") else None
        self.stats = OperatorStats()
        self.in_wm = {u: MIN_WATERMARK for u in inputs}
        self.wm = MIN_WATERMARK
        self.open_inputs = set(self.in_wm)
        self.has_watermark = overrides(op, "on_watermark")
        self.holds = overrides(op, "held_watermark")     # its output watermark may lag its input's
        self.out_wm = MIN_WATERMARK                       # what went downstream (when it holds)
        self.has_flush = overrides(op, "flush")
        self.stateless = op.parallelism is Parallelism.STATELESS
        self.ended = False
        self.partial = False        # a MERGEABLE copy: emits partials for its original
        self.columnar = bool(getattr(op, "columnar", False))
        self.targets: list[Callable] = []     # the routes of its "out" port (Chain._build_routes)


def by_input(node: Node, k: int) -> Callable[[list, Emitter], None]:
    """``node``'s input ``k`` as a ``process(batch, emit)``: read through the node at each call, so
    a gate that holds the tuples of pending key groups (``pending_groups.py``) takes over the
    routes already built."""
    def process(batch: list, emit: Emitter) -> None:
        node.process_input(k, batch, emit)
    return process


class FusedRun:
    """Consecutive fusable operators of a chain compiled into one loop (``expr.compile_rows``).

    Per-operator counts stay exact (each step counts what it drops). One
    loop cannot time its parts, so busy time is shared by ``weights``: every
    ``SAMPLE_EVERY``-th batch runs operator by operator (the same results:
    the operators are stateless), each timed on its own, and the shares it
    measures become the weights (smoothed). Shared equally instead, a hot
    operator fused with 30 cheap maps showed a thirtieth of its busy time
    and no policy could find it.
    """

    SAMPLE_EVERY = 32           # 1 batch in 32 pays the per-operator path (about 1 % of the time)
    SMOOTHING = 0.5             # weight of the newest sample

    __slots__ = ("nodes", "fn", "step_node", "columnar", "weights", "batches")

    def __init__(self, nodes: list[Node]) -> None:
        from ..expr import compile_rows

        self.nodes = nodes
        steps = [(node, step) for node in nodes for step in node.op.steps]
        self.step_node = [nodes.index(node) for node, _ in steps]
        self.fn = compile_rows([step for _, step in steps], "->".join(n.op_id for n in nodes))
        self.columnar = all(n.columnar for n in nodes)
        self.weights = [1.0 / len(nodes)] * len(nodes)
        self.batches = 0

    def sample_due(self) -> bool:
        """True for the batches that run operator by operator to re-measure the weights."""
        self.batches += 1
        return len(self.nodes) > 1 and self.batches % self.SAMPLE_EVERY == 1

    def learn(self, spent: list[float]) -> None:
        """Fold one operator-by-operator batch's busy times into the weights."""
        total = sum(spent)
        if total > 0:
            a = self.SMOOTHING
            self.weights = [a * s / total + (1 - a) * w for s, w in zip(spent, self.weights)]


def rows(batch: Any) -> list:
    """A columnar batch as a list of dicts, for an operator that takes rows."""
    return batch.to_pylist()


class Chain:
    """The fused operators of one PE and the routes between them.

    ``ops``: op_id -> operator (sources included; they only emit).
    ``edges``: ``(src_op, port, dst_op)`` for every edge whose consumer is in
    this chain (the producer may be outside: its batches arrive by ``inject``).
    ``outputs``: ``(src_op, port)`` -> outputs leaving the chain.
    ``clock``: what operators' ``busy_s`` is measured on. A PE keeps the default,
    :func:`~pescheduler.worker.busy.busy_clock` (a system call each time, taken twice per
    batch per operator: the monitor and the policies size by it); the in-process ep engine
    passes ``time.perf_counter`` (no system call), since nothing there sizes anything by
    busy time and its batches are single events, where two reads per operator were about
    13 % of the JEPC mixed workload.
    """

    def __init__(self, ops: dict[str, Operator], edges: Iterable[tuple[str, str, str]],
                 outputs: dict[tuple[str, str], list[Output]] | None = None,
                 on_side: Callable[[str, str, list], None] | None = None,
                 routing: dict[tuple[str, str, str], tuple] | None = None,
                 copies: dict[str, str] | None = None, clock: Callable[[], float] = busy_clock) -> None:
        self.clock = clock                         # busy time per operator (see the class docstring)
        self.copies = dict(copies or {})           # copy op id -> original (whole plan)
        self.nodes: dict[str, Node] = {}
        for op_id, op in ops.items():
            self.nodes[op_id] = Node(op_id, op, ())
            original = self.copies.get(op_id)
            self.nodes[op_id].partial = (original is not None and
                                         op.parallelism is Parallelism.MERGEABLE)
        self.edges: list[tuple[str, str, str]] = []
        self.outs: list[tuple[str, str, Output]] = []
        for (src, port), outs in (outputs or {}).items():
            for out in outs:
                self.outs.append((src, port, out))
        self.routing = dict(routing or {})          # (src, port, consumer) -> (RouterTargets, key field)
        self.routers: dict[tuple[str, str, str], Router] = {}
        self.dead_letters: list[DeadLetter] = []
        self.on_side = on_side
        self.frozen: dict[str, list] = {}          # op id -> [deferred watermark, deferred end] (freeze)
        self.held_inputs: dict[str, set[str]] = {}  # op id -> its inputs that are no edge (hold_input)
        self.set_edges(list(edges))

    def logical(self, op_id: str) -> str:
        """The operator whose work ``op_id`` does (itself, or the original of a copy)."""
        return self.copies.get(op_id, op_id)

    def set_edges(self, edges: list[tuple[str, str, str]], initial_wm: int | None = None) -> None:
        """Install the edges whose consumer is in this chain (at build, or when copies come and go).

        An input that appears starts at ``initial_wm`` (the consumer's current
        watermark when added live: a new copy must not hold event time back
        further than it already is); an input that disappears no longer
        counts for the watermark.
        """
        self.edges = [e for e in edges if e[2] in self.nodes]
        last_gone = []          # operators whose last open input went while the others had ended
        for node in self.nodes.values():
            ups = list(dict.fromkeys(s for s, _p, d in self.edges if d == node.op_id))
            ups += self.held_inputs.get(node.op_id, ())
            for gone in [u for u in node.in_wm if u not in ups]:
                del node.in_wm[gone]
                if gone in node.open_inputs:
                    node.open_inputs.discard(gone)
                    if not node.open_inputs and node.in_wm and not node.ended:
                        last_gone.append((node, gone))
            for u in ups:
                if u not in node.in_wm:
                    node.in_wm[u] = MIN_WATERMARK if initial_wm is None else max(initial_wm, node.wm)
                    if not node.ended:
                        node.open_inputs.add(u)
        self._wm_targets: dict[str, list[Node]] = {}
        for src, _port, dst in self.edges:
            targets = self._wm_targets.setdefault(src, [])
            if self.nodes[dst] not in targets:
                targets.append(self.nodes[dst])
        self._build_routes()
        if initial_wm is not None:           # live: an input that went may free event time
            for node in self.nodes.values():
                self._reevaluate(node)
        for node, gone in last_gone:
            # A released copy was the only input still open (the source had ended first): the
            # operator ends now, as it would have on that input's END; else it waited forever.
            self._close_input(node, gone)

    def _build_routes(self) -> None:
        """``(src, port)`` -> callables: fused consumers, channels, and routers over instances.

        Consumers that are instances of one copied operator are reached
        through one :class:`Router`; the others each once (a channel serving
        several consumers in its PE is called once).
        """
        by_port: dict[tuple[str, str], list[tuple[str, Callable, Output | None]]] = {}
        index: dict[str, list] = {}
        runs = self._fused_runs()
        for src, port, dst in self.edges:
            node = self.nodes[dst]
            # Positional partials: one called with a keyword argument cost about 730 ns a
            # call against 285 ns, once per batch per operator.
            if dst in runs:
                push = partial(self._push_run, runs[dst])
            elif self.logical(src) == dst:            # a MERGEABLE copy's partials
                push = partial(self._run, node, node.op.absorb)
            else:
                inputs = index.setdefault(dst, [])
                if (self.logical(src), port) not in inputs:
                    inputs.append((self.logical(src), port))
                k = inputs.index((self.logical(src), port))   # the app's input order, copies folded
                process = by_input(node, k) if node.process_input is not None else None
                push = partial(self._run, node, process)
            by_port.setdefault((src, port), []).append((dst, push, None))
        self.outputs: dict[str, list[Output]] = {}
        for src, port, out in self.outs:
            for dst in getattr(out, "dst_ops", None) or (None,):
                by_port.setdefault((src, port), []).append((dst, out.send, out))
            if out not in self.outputs.setdefault(src, []):
                self.outputs[src].append(out)
        # An output whose results carry their own times (``timeless = True``: the in-process ep
        # engine's deliveries) is not called per watermark for nothing.
        self._wm_outputs = {src: [out.watermark for out in outs if not getattr(out, "timeless", False)]
                            for src, outs in self.outputs.items()}
        # what a watermark callback emitted (a window's fire) leaves the PE at once (ChannelOut.urge)
        self._urges = [out.urge for outs in self.outputs.values() for out in outs if hasattr(out, "urge")]
        # the operators whose watermark anything downstream waits for (else it stops there)
        self._wm_down = {op_id for op_id in self.nodes if self._wm_targets.get(op_id) or self._wm_outputs.get(op_id)}
        self.routes = {}
        self.routers = {}
        self.consumer_routes: dict[tuple[str, str, str], list[Callable]] = {}
        self._by_credit: dict[int, list[Router]] = {}     # id(channel) -> routers that route by credit over it
        unrouted: set[int] = set()                        # channels that carry batches no router chose
        for (src, port), targets in by_port.items():
            calls: list[Callable] = []
            grouped: dict[tuple, dict[str, tuple[Callable, Output | None]]] = {}
            for dst, call, out in targets:
                key = (src, port, self.logical(dst)) if dst is not None else None
                if key in self.routing:
                    grouped.setdefault(key, {})[dst] = (call, out)
                    continue
                if out is not None:
                    unrouted.add(id(out))
                if key is not None:
                    self.consumer_routes.setdefault(key, []).append(call)
                if call not in calls:
                    calls.append(call)
            for key, by_instance in grouped.items():
                spec, key_field = self.routing[key]
                instances = [by_instance[i] for i in spec.instances]
                router = Router(spec, [call for call, _out in instances], key_field,
                                channels=[out for _call, out in instances])
                self.routers[key] = router
                self.consumer_routes[key] = [router.send]
                calls.append(router.send)
                if router.channels is not None:
                    for out in router.channels:
                        if out is not None:
                            self._by_credit.setdefault(id(out), []).append(router)
            self.routes[(src, port)] = calls
        for channel in unrouted:
            self._by_credit.pop(channel, None)
        for op_id, node in self.nodes.items():     # no (op_id, "out") key built per batch
            node.targets = self.routes.get((op_id, "out"), [])

    def spared(self, channel: Output, full: Callable[[Output], bool]) -> bool:
        """Is every batch ``channel`` carries routed by credit over instances of which another
        still takes batches? Then ``channel`` being out of credit holds nothing back: its router
        sends elsewhere (worker/flow.py)."""
        routers = self._by_credit.get(id(channel))
        return bool(routers) and all(r.room_besides(channel, full) for r in routers)

    def _fused_runs(self) -> dict[str, FusedRun]:
        """First op id -> :class:`FusedRun` for every linear run of two or more fusable operators.

        ``a`` fuses with ``b`` when ``a``'s only output is ``b`` (no channel, no
        router, no side port) and ``b``'s only input is ``a``.
        """
        def fusable(n: Node) -> bool:
            return (getattr(n.op, "fusable", False) and not n.partial
                    and not overrides(n.op, "process_input"))
        outs: dict[str, list] = {}
        ins: dict[str, int] = {}
        for src, port, dst in self.edges:
            outs.setdefault(src, []).append((port, dst))
            ins[dst] = ins.get(dst, 0) + 1
        leaving = {src for src, _p, _o in self.outs}
        nxt: dict[str, str] = {}
        for op_id, node in self.nodes.items():
            o = outs.get(op_id, [])
            if not fusable(node) or op_id in leaving or len(o) != 1 or o[0][0] != "out":
                continue
            dst = o[0][1]
            if (fusable(self.nodes[dst]) and ins[dst] == 1 and self.logical(op_id) != dst
                    and (op_id, "out", self.logical(dst)) not in self.routing):
                nxt[op_id] = dst
        runs = {}
        for head in set(nxt) - set(nxt.values()):
            ids = [head]
            while ids[-1] in nxt:
                ids.append(nxt[ids[-1]])
            runs[head] = FusedRun([self.nodes[i] for i in ids])
        return runs

    # -- data ----------------------------------------------------------------------
    def emit_from(self, op_id: str, batch: list, port: str = "out") -> None:
        """A batch produced by ``op_id`` (a source here; a channel's batch goes through :meth:`take_input`)."""
        node = self.nodes.get(op_id)
        if node is not None:
            node.stats.tuples_out += len(batch)
        gc_paused(_deliver, self.routes.get((op_id, port), ()), batch)    # a nested emit: still paused

    def take_input(self, op_id: str, batch: list, port: str = "out") -> bool:
        """A batch a channel brought from ``op_id`` in another PE, through the chain; False (and
        nothing done) when no operator here takes it: the caller says so, nothing drops it."""
        targets = self.routes.get((op_id, port))
        if targets is None:
            return False
        gc_paused(_deliver, targets, batch)
        return True

    def _push_run(self, run: FusedRun, batch: Any) -> None:
        # Hot path: one call per batch for the whole run. On any error the batch
        # is replayed operator by operator (they are stateless), so the failing
        # tuples are dead-lettered by the operator that rejects them.
        head = run.nodes[0]
        if not isinstance(batch, list):
            if run.columnar:
                self._run(head, None, batch)
                return
            batch = rows(batch)
        if run.sample_due():
            before = [node.stats.busy_s for node in run.nodes]
            self._run(head, None, batch)
            run.learn([node.stats.busy_s - b for node, b in zip(run.nodes, before)])
            return
        clock = self.clock
        t0 = clock()
        try:
            out, drops = run.fn(batch)
        except Exception:
            self._run(head, None, batch)
            return
        spent = clock() - t0
        dropped = [0] * len(run.nodes)
        for i, d in zip(run.step_node, drops):
            dropped[i] += d
        n = len(batch)
        for node, d, weight in zip(run.nodes, dropped, run.weights):
            stats = node.stats
            stats.busy_s += spent * weight
            stats.tuples_in += n
            stats.batches_in += 1
            n -= d
            stats.tuples_out += n
        if out:
            for target in run.nodes[-1].targets:
                target(out)

    def _run(self, node: Node, process: Callable | None, batch: Any) -> None:
        # Hot path: one call per batch per operator (the routes' partials call it). ``process``
        # is set for operators that tell their inputs apart (process_input).
        if not node.columnar and not isinstance(batch, list):
            batch = rows(batch)
        emit = Emitter()
        clock = self.clock
        t0 = clock()
        try:
            (process or node.process)(batch, emit)
        except Exception as exc:
            emit = self._isolate(node, batch, exc, process or node.process)
        stats = node.stats
        stats.busy_s += clock() - t0
        stats.tuples_in += len(batch)
        stats.batches_in += 1
        if emit.sides is not None or emit.dead is not None:
            self._route_rare(node, emit)
        if emit.batches is not None:
            self._route_columns(node, emit.batches)
        if emit:
            stats.tuples_out += len(emit)
            for target in node.targets:
                target(emit)

    def _isolate(self, node: Node, batch: list, exc: Exception, process: Callable) -> Emitter:
        """An operator raised on a batch: set aside only the tuples that fail.

        A STATELESS operator is re-run tuple by tuple (safe: no state), so only
        the bad tuples are dead-lettered. For a stateful operator a re-run could
        apply part of the batch twice, so the whole batch is dead-lettered with
        the traceback; such operators isolate tuples themselves with
        ``emit.dead_letter`` (the built-in window does). A sink that could not
        deliver (:class:`~pescheduler.errors.DeliveryFailed`) is neither: the
        PE fails, since a re-run would write part of the batch twice and dead
        letters would hide lost output.
        """
        if isinstance(exc, DeliveryFailed):
            raise exc
        emit = Emitter()
        if not isinstance(batch, list):
            batch = rows(batch)
        if not node.stateless:
            for item in batch:
                emit.dead_letter(item, exc)
            return emit
        for item in batch:
            one = Emitter()
            try:
                process([item], one)
            except Exception as one_exc:
                emit.dead_letter(item, one_exc)
                continue
            emit.extend(one)
            if one.sides:
                for port, items in one.sides.items():
                    for it in items:
                        emit.to(port, it)
            if one.dead:
                emit.dead = (emit.dead or []) + one.dead
        return emit

    def _route_columns(self, node: Node, batches: list) -> None:
        """Columnar results go on whole (an operator may emit rows and RecordBatches)."""
        targets = node.targets
        for batch in batches:
            node.stats.tuples_out += len(batch)
            for target in targets:
                target(batch)

    def _route_rare(self, node: Node, emit: Emitter) -> None:
        if emit.dead:
            node.stats.dead_letters += len(emit.dead)
            self.dead_letters.extend(DeadLetter(d.item, d.error, node.op_id) for d in emit.dead)
        for port, items in (emit.sides or {}).items():
            node.stats.side[port] = node.stats.side.get(port, 0) + len(items)
            targets = self.routes.get((node.op_id, port))
            if targets:
                for target in targets:
                    target(items)
            elif self.on_side is not None:
                self.on_side(node.op_id, port, items)

    def take_dead_letters(self) -> list[DeadLetter]:
        """The dead letters since the last call (the monitor ships them to the controller)."""
        taken, self.dead_letters = self.dead_letters, []
        return taken

    def reject(self, op_id: str, dead: list[DeadLetter]) -> None:
        """Dead letters an operator produced outside ``process`` (a source's malformed input)."""
        self.nodes[op_id].stats.dead_letters += len(dead)
        self.dead_letters.extend(DeadLetter(d.item, d.error, op_id) for d in dead)

    # -- watermarks and end of stream -------------------------------------------------
    def watermark_from(self, op_id: str, wm: int) -> None:
        """Event time at ``op_id``'s output reached ``wm``: fire what it completes downstream."""
        if op_id in self.frozen:
            deferred = self.frozen[op_id]
            deferred[0] = wm if deferred[0] is None else max(wm, deferred[0])
            return
        # Hot path, once per batch per operator: _advance and _reevaluate, inline.
        for node in self._wm_targets.get(op_id, ()):
            in_wm = node.in_wm
            if wm > in_wm.get(op_id, MIN_WATERMARK):
                in_wm[op_id] = wm
                new = wm if len(in_wm) == 1 else min(in_wm.values())
                if new > node.wm:
                    self._moved(node, new)
        for call in self._wm_outputs.get(op_id, ()):
            call(wm)

    def _advance(self, node: Node, upstream: str, wm: int) -> None:
        if wm <= node.in_wm.get(upstream, MIN_WATERMARK):
            return
        node.in_wm[upstream] = wm
        self._reevaluate(node)

    def _reevaluate(self, node: Node) -> None:
        """Move ``node``'s watermark to the minimum of its inputs' if that is ahead."""
        if not node.in_wm:
            return
        new = min(node.in_wm.values())
        if new > node.wm:
            self._moved(node, new)

    def _moved(self, node: Node, new: int) -> None:
        """``node``'s watermark moved to ``new``: its callback, then downstream where something
        waits for it (``_wm_down``), or where a reconfiguration holds it back (``freeze``: an
        output rewired in meanwhile gets it at ``thaw``)."""
        node.wm = new
        if node.partial:
            self._call(node, self._partials(node), new)
        elif node.has_watermark:
            self._call(node, node.op.on_watermark, new)
        if node.holds:                  # results it will still emit keep event time back downstream
            held = node.op.held_watermark()
            new = new if held is None or held >= new else held
            if new <= node.out_wm:
                return
            node.out_wm = new
        if node.op_id in self._wm_down or self.frozen:
            self.watermark_from(node.op_id, new)

    def end_from(self, op_id: str) -> None:
        """``op_id`` will produce nothing more: close event time and flush downstream."""
        if op_id in self.frozen:
            self.frozen[op_id][1] = True
            return
        source = self.nodes.get(op_id)
        if source is not None and not source.in_wm:
            source.ended = True
        for node in self._wm_targets.get(op_id, ()):
            self._close_input(node, op_id)
        for out in self.outputs.get(op_id, ()):
            out.end()

    def _close_input(self, node: Node, upstream: str) -> None:
        node.open_inputs.discard(upstream)
        if node.open_inputs or node.ended:
            return
        node.ended = True
        if node.wm < MAX_WATERMARK:
            node.wm = MAX_WATERMARK
            if node.partial:
                self._call(node, self._partials(node), MAX_WATERMARK)
            elif node.has_watermark:
                self._call(node, node.op.on_watermark, MAX_WATERMARK)
            for child in self._wm_targets.get(node.op_id, ()):
                self._advance(child, node.op_id, MAX_WATERMARK)
        if node.has_flush:
            self._call(node, node.op.flush)
        self.end_from(node.op_id)

    def replay(self, node: Node, process: Callable, batch: list) -> None:
        """Tuples ``node`` counted in already (they waited for their key group's state,
        pending_groups.py) through ``process`` now, routed like any batch's results."""
        stats = node.stats
        tuples, batches = stats.tuples_in, stats.batches_in
        self._run(node, process, batch)
        stats.tuples_in, stats.batches_in = tuples, batches

    def hold_input(self, op_id: str, name: str) -> None:
        """Input ``name`` of ``op_id``, which is no edge (key groups still on their way:
        ``pending_groups.py``), holds its event time at the minimum and keeps it open until
        :meth:`release_input`, whatever :meth:`set_edges` installs meanwhile. It was an entry of
        the node's watermarks only: the rewire that removed a Release's copy from the PE
        downstream of it, while the copy's groups were still arriving, dropped it in
        ``set_edges``, which moved the watermark on before the rewirer put the entry back; the
        groups' tuples, held until their state came, were then late (rows of an over window, a
        pattern, ``ep_over`` lost under load)."""
        node = self.nodes[op_id]
        self.held_inputs.setdefault(op_id, set()).add(name)
        node.in_wm[name] = MIN_WATERMARK
        if not node.ended:
            node.open_inputs.add(name)

    def release_input(self, op_id: str, name: str) -> None:
        """Input ``name`` of ``op_id`` (:meth:`hold_input`) goes: the watermark moves to the other
        inputs' now, and the end comes if they all ended."""
        node = self.nodes[op_id]
        held = self.held_inputs.get(op_id, set())
        held.discard(name)
        if not held:
            self.held_inputs.pop(op_id, None)
        node.in_wm.pop(name, None)
        self._reevaluate(node)
        if name in node.open_inputs:
            self._close_input(node, name)

    @staticmethod
    def _partials(node: Node) -> Callable:
        """A MERGEABLE copy's watermark callback: its partials go to the original."""
        def take_partials(watermark, emit):
            emit.extend(node.op.take_partials(watermark))
        take_partials.__name__ = "take_partials"
        return take_partials

    def release_partials(self) -> None:
        """A MERGEABLE copy is being released: every partial it holds goes to its original now."""
        for node in self.nodes.values():
            if node.partial:
                self._call(node, self._partials(node), None)

    def _call(self, node: Node, method: Callable, arg: Any = _NO_ARG) -> None:
        """Run a watermark/flush callback (``method(arg, emit)``, or ``method(emit)`` without
        ``arg``) and route what it emits like a batch result. One optional argument, not
        ``*args``: a call through ``*args`` cost 0.6 us more, once per operator per watermark.

        An error here belongs to no tuple, and the results it would have
        emitted are lost, so it is not dead-lettered: it propagates and fails
        the PE with its traceback (``CallbackError`` names the operator).
        """
        emit = Emitter()
        clock = self.clock
        t0 = clock()
        try:
            if arg is _NO_ARG:
                method(emit)
            else:
                method(arg, emit)
        except Exception as exc:
            raise CallbackError(f"{node.op_id}.{method.__name__} raised {type(exc).__name__}: {exc}") from exc
        node.stats.busy_s += clock() - t0
        if emit.sides is not None or emit.dead is not None:
            self._route_rare(node, emit)
        if emit.batches is not None:
            self._route_columns(node, emit.batches)
        if emit:
            node.stats.tuples_out += len(emit)
            for target in node.targets:
                target(emit)
        if emit or emit.batches is not None:
            for urge in self._urges:        # a fire's results waited for event time already
                urge()

    # -- reconfiguration ----------------------------------------------------------------
    def freeze(self, op_ids: Iterable[str], watermark: int | None = None) -> None:
        """Hold back the watermarks and end of stream ``op_ids`` emit, until :meth:`thaw`.

        While a reconfiguration holds one of an operator's output channels,
        the data it routes there waits, to be re-sent on the new routes; its
        watermark must wait too. Had it gone on along the channels still open,
        an instance behind them (a copy's original) would fire a window ahead
        of the held data, and absorb or count it again when it is re-sent: a
        window emitted twice, or its tuples late (issue 20).

        ``watermark``: one the operator already emitted that must wait as well
        (it was buffered in a channel whose marker overtook it, ChannelOut.hold).
        """
        for op_id in op_ids:
            held = self.frozen.setdefault(op_id, [None, False])
            if watermark is not None and (held[0] is None or held[0] < watermark):
                held[0] = watermark

    def thaw(self) -> None:
        """Emit what :meth:`freeze` held back (after the held data was re-sent)."""
        deferred, self.frozen = self.frozen, {}
        for op_id, (wm, ended) in deferred.items():
            if wm is not None:
                self.watermark_from(op_id, wm)
            if ended:
                self.end_from(op_id)

    def rewire(self, removed: list[Output] = (), added: list[tuple[str, str, Output]] = (),
               routing: dict | None = None, copies: dict[str, str] | None = None) -> None:
        """Outputs leave and join, routers change (copies came or went): routes are rebuilt.

        ``copies`` are merged into what the chain knows: a router still names a
        released copy until its own routing is replaced (copy ids are never
        reused for another operator, so a stale entry misleads no one).
        """
        gone = {id(o) for o in removed}
        self.outs = [(s, p, o) for s, p, o in self.outs if id(o) not in gone] + list(added)
        if routing is not None:
            self.routing = dict(routing)
        if copies:
            self.copies.update(copies)
        self._build_routes()

    def router_counts(self) -> dict[str, dict[str, int]]:
        """Tuples each router sent to each instance: ``{"src.port->X": {instance: n}}``."""
        return {f"{s}.{p}->{x}": dict(zip(r.instances, r.tuples)) for (s, p, x), r in self.routers.items()}

    def progress(self) -> dict[str, tuple]:
        """Per operator: input watermarks, watermark, open inputs, ended (moves with its state)."""
        return {op_id: (dict(n.in_wm), n.wm, set(n.open_inputs), n.ended) for op_id, n in self.nodes.items()}

    def restore_progress(self, progress: dict[str, tuple]) -> None:
        """Continue where a snapshot left off. An input the snapshot did not know (a copy that
        appeared with this reconfiguration) starts open, at the minimum watermark."""
        for op_id, (in_wm, wm, open_inputs, ended) in progress.items():
            node = self.nodes[op_id]
            new_inputs = set(node.in_wm) - set(in_wm)
            node.in_wm.update({u: w for u, w in in_wm.items() if u in node.in_wm})
            node.wm, node.ended = wm, ended and not new_inputs
            node.open_inputs = (set(open_inputs) & set(node.in_wm)) | new_inputs

    def end_sent(self, op_id: str) -> bool:
        """``op_id`` ended and its END went out on its outputs (not held back by :meth:`freeze`,
        whose :meth:`thaw` sends it on every output then there)."""
        node = self.nodes.get(op_id)
        return node is not None and node.ended and not (op_id in self.frozen and self.frozen[op_id][1])

    # -- lifecycle --------------------------------------------------------------------
    @property
    def finished(self) -> bool:
        """Every operator has ended (sources: read to the end; others: every input ended)."""
        return all(n.ended for n in self.nodes.values())

    def close(self) -> None:
        """Close every operator (files, sockets); errors are kept as dead letters."""
        for node in self.nodes.values():
            try:
                node.op.close()
            except Exception as exc:
                self.dead_letters.append(DeadLetter.of({"operator": node.op_id, "callback": "close"},
                                                       exc, node.op_id))


def _deliver(targets: Iterable[Callable[[Any], None]], batch: Any) -> None:
    for target in targets:
        target(batch)
