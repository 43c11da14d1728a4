"""Run operators in-process, without a cluster, through the runtime's own chain.

For plug-in authors and our own unit tests::

    from pescheduler.testing import run_operators
    from pescheduler.operators.basic import Map

    result = run_operators([{"x": 1}, {"x": 2}], Map(lambda t: {"x": t["x"] * 10}))
    assert result.output == [{"x": 10}, {"x": 20}]

The items are fed by the built-in ``iterable`` source in batches of
``batch_size`` with watermarks after each batch, exactly as a deployment
would; operators run through :class:`pescheduler.worker.chain.Chain`.

:func:`run_rescaled` checks a KEYED operator's state handling: the same items
through one instance and through instances checkpointed, restored and
rescaled half-way, as a deployment does to them.
"""

from __future__ import annotations

import pickle
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

from .worker.chain import Chain, rows
from .operator import MAX_WATERMARK, DeadLetter, Emitter, Operator, OperatorContext, Source
from .worker.source_driver import SourceDriver, pump


@dataclass
class RunResult:
    """What a pipeline produced: main output, side outputs by port, dead letters."""

    output: list = field(default_factory=list)
    sides: dict[str, list] = field(default_factory=dict)
    dead_letters: list[DeadLetter] = field(default_factory=list)
    watermarks: list[int] = field(default_factory=list)
    ended: bool = False
    chain: Chain | None = None


class CollectingOutput:
    """An ``Output`` that keeps everything in memory (the last operator's consumer)."""

    def __init__(self, result: RunResult) -> None:
        self.result = result

    def send(self, batch: list) -> None:
        self.result.output.extend(batch if isinstance(batch, list) else rows(batch))

    def watermark(self, wm: int) -> None:
        self.result.watermarks.append(wm)

    def end(self) -> None:
        self.result.ended = True


def run_operators(items: Iterable[Any] | Source, *operators: Operator, batch_size: int = 1000,
                  ts_field: str | None = "ts", max_delay: Any = "1s",
                  key_field: str | None = None) -> RunResult:
    """Feed ``items`` through ``operators`` (a linear chain) and return what came out.

    ``items`` may also be a ``Source`` instance. ``key_field`` is handed to the
    operators' context as a preceding ``key_by`` would.
    """
    from .operators.sources import IterableSource

    source = items if isinstance(items, Source) else IterableSource(
        items=list(items), ts_field=ts_field, max_delay=max_delay)
    ops: dict[str, Operator] = {"source-0": source}
    edges = []
    previous = "source-0"
    for i, op in enumerate(operators, start=1):
        op_id = f"{op.name or type(op).__name__.lower()}-{i}"
        ops[op_id] = op
        edges.append((previous, "out", op_id))
        previous = op_id
    result = RunResult()
    chain = Chain(ops, edges, {(previous, "out"): [CollectingOutput(result)]},
                  on_side=lambda op_id, port, batch: result.sides.setdefault(port, []).extend(batch))
    for op_id, op in ops.items():
        inputs = [src for src, _port, dst in edges if dst == op_id]
        op.open(OperatorContext(op_id=op_id, pe_id="test", key_field=key_field, extra={"inputs": inputs}))
    drive_source(chain, SourceDriver("source-0", source, batch_size))
    chain.close()
    result.dead_letters = chain.dead_letters
    result.chain = chain
    return result


def run_stream(stream: Any, items: Iterable[Any] | None = None, **options: Any) -> RunResult:
    """Run the operators an app wrote from its source to ``stream`` (a linear chain) in-process.

    ``items`` replaces the source's tuples (by default the ``items`` of the
    app's ``iterable`` source); ``options`` are :func:`run_operators`'.
    """
    source, ops, key = chain_operators(stream)
    items = source.params["items"] if items is None else items
    return run_operators(items, *ops, key_field=key, **options)


def run_graph(stream: Any, batch_size: int = 1000) -> RunResult:
    """Run every operator upstream of ``stream`` in-process, whatever the graph's shape (joins, unions),
    through one :class:`Chain`: the sources are read to their ends one after the other, so an
    operator of two inputs waits for both watermarks as in a deployment."""
    from .plugins import active_plugins

    nodes = stream.upstream()
    registry = active_plugins().operators
    ops = {n.op_id: registry[(n.kind, n.name)](**n.params) for n in nodes}
    edges = [(src, port, n.op_id) for n in nodes for src, port in n.inputs]
    result = RunResult()
    chain = Chain(ops, edges, {(stream.op_id, stream.port): [CollectingOutput(result)]},
                  on_side=lambda op_id, port, batch: result.sides.setdefault(port, []).extend(batch))
    for n in nodes:
        ops[n.op_id].open(OperatorContext(op_id=n.op_id, pe_id="test", key_field=n.key_field,
                                          extra={"inputs": [src for src, _port in n.inputs]}))
    for n in nodes:
        if n.kind == "source":
            drive_source(chain, SourceDriver(n.op_id, ops[n.op_id], batch_size))
    chain.close()
    result.dead_letters, result.chain = chain.dead_letters, chain
    return result


def chain_operators(stream: Any) -> tuple[Any, list[Operator], Any]:
    """``(source node, operators, key)`` of the linear chain from an app's source to ``stream``.

    The operators are made from the app's nodes as a deployment makes them
    (registry name and parameters), so what runs is what a deployment would run.
    """
    from .plugins import active_plugins

    nodes = stream.app.nodes
    chain = [nodes[stream.op_id]]
    while chain[-1].inputs:
        if len(chain[-1].inputs) != 1:
            raise ValueError(f"a linear chain was expected; {chain[-1].op_id} has several inputs")
        chain.append(nodes[chain[-1].inputs[0][0]])
    source, *operators = reversed(chain)
    registry = active_plugins().operators
    keys = [n.key_field for n in operators if n.key_field is not None]
    if len({repr(k) for k in keys}) > 1:
        raise ValueError(f"one key is handed to every operator; this chain has {keys}")
    return source, [registry[(n.kind, n.name)](**n.params) for n in operators], keys[0] if keys else None


def drive_source(chain: Chain, driver: SourceDriver) -> None:
    """Read ``driver``'s source to the end into ``chain`` (no pacing: tests run flat out)."""
    while pump(driver, chain) is not None:
        pass


def feed(op: Operator, items: list, batch_size: int, start: int) -> list:
    """The rows an opened operator gives for ``items`` (dicts with an event time ``ts``, in order)
    driven as a chain drives it: the watermark ``start`` first, then each batch of ``batch_size``
    followed by a watermark one below its last ``ts``."""
    emit = Emitter()
    op.on_watermark(start, emit)
    for i in range(0, len(items), batch_size):
        batch = items[i:i + batch_size]
        op.process(batch, emit)
        op.on_watermark(batch[-1]["ts"] - 1, emit)
    return list(emit)


@dataclass
class Rescaled:
    """What :func:`run_rescaled` saw: compare ``output`` with ``whole`` (as multisets: across keys
    the order may differ, as in a deployment)."""

    output: list        # rows through the instances checkpointed, restored and rescaled
    whole: list         # rows of one instance that saw every item, uninterrupted
    moved: frozenset    # the key groups that moved to a copy and back

    @property
    def same(self) -> bool:
        """Did the rescaled run give every row of the uninterrupted one, each as often?"""
        return sorted(map(repr, self.output)) == sorted(map(repr, self.whole))


def run_rescaled(items: Iterable[dict], make: Callable[[], Operator], *, key: str,
                 batch_size: int = 100) -> Rescaled:
    """``items`` through a KEYED operator made by ``make()``, twice: one instance, uninterrupted;
    and instances that a deployment's checkpoint and rescale go through. A quarter in, a
    checkpoint is taken (``snapshot``, pickled) and a fresh instance restored from it goes on; at
    two fifths the odd key groups move to a copy as a Replicate moves them (``export_groups`` and
    ``import_groups`` where the operator has them, else its ``snapshot``, ``split_state``,
    ``merge_states`` and ``restore``: ``worker/handover.py``'s own calls), the copy handles their
    items, and at seven tenths they move back as a Release moves them. State the operator keeps
    outside what those calls carry (a dict beside a ``KeyedOperator``'s keyed states) is lost on
    the way: ``same`` is then False.

    ``items`` are dicts with the key field ``key`` and an event time ``ts`` (ms), in time order;
    after each batch of ``batch_size`` the watermark is one below its last ``ts``, and the end
    of the items is the end of the stream. Each instance is opened keyed by ``key`` in the
    configured ``pescheduler.state.backend``."""
    from .worker import handover
    from .wire import key_group

    items = list(items)
    if not items:
        raise ValueError("run_rescaled: no items")

    def opened(state: Any = None) -> Operator:
        op = make()
        if state is not None:
            op.restore(state)
        op.open(OperatorContext(op_id=f"{op.name or type(op).__name__.lower()}-1", pe_id="test", key_field=key))
        return op

    def after(i: int) -> int:
        """The watermark once the first ``i`` items are in: one below the last one's time."""
        return items[max(i - 1, 0)]["ts"] - 1

    def ended(op: Operator) -> list:
        emit = Emitter()
        op.on_watermark(MAX_WATERMARK, emit)
        op.flush(emit)
        return list(emit)

    def moved(op: Operator, groups: frozenset) -> Any:
        return pickle.loads(pickle.dumps(handover.export_groups(op, groups)))   # as it crosses the wire

    n = len(items)
    first, second, third = n // 4, 2 * n // 5, 7 * n // 10
    whole_op = opened()
    whole = feed(whole_op, items, batch_size, after(0)) + ended(whole_op)

    op = opened()
    out = feed(op, items[:first], batch_size, after(0))
    if first:
        op = opened(pickle.loads(pickle.dumps(op.snapshot())))    # a checkpoint, restored
    out += feed(op, items[first:second], batch_size, after(first))
    moving = frozenset(g for g in {key_group(e[key]) for e in items} if g % 2)
    copy = opened()
    handover.import_groups(copy, moved(op, moving))                 # a Replicate's move
    middle = items[second:third]
    out += feed(copy, [e for e in middle if key_group(e[key]) in moving], batch_size, after(second))
    out += feed(op, [e for e in middle if key_group(e[key]) not in moving], batch_size, after(second))
    handover.import_groups(op, moved(copy, moving))                 # a Release's move back
    out += feed(op, items[third:], batch_size, after(third)) + ended(op)
    return Rescaled(out, whole, moving)
