"""Stateless built-ins: ``map``, ``filter``, ``flat_map``, ``key_by``, ``union``.

Each handles a whole batch with one comprehension or C-level call and catches
nothing: when a user function raises, the chain re-runs that batch tuple by
tuple and dead-letters only the tuples that fail (``Chain._isolate``), which
is safe because these operators keep no state.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable

from pescheduler.expr import Expr, compile_rows, run_arrow
from pescheduler.inline import NotProvable
from pescheduler.lift import lift_steps
from pescheduler.operator import Emitter, Operator, Parallelism


def _callable(op: str, fn: Any) -> Callable:
    if not callable(fn):
        raise TypeError(f"{op}: fn must be callable, got {fn!r}")
    return fn


class Fusable(Operator):
    """A stateless operator the chain may fuse into one generated loop with its neighbours.

    ``steps`` says what it does per tuple (see ``pescheduler.expr.compile_rows``);
    ``columnar`` is true when every step is an expression, so a
    ``pyarrow.RecordBatch`` is handled whole.
    """

    parallelism = Parallelism.STATELESS
    fusable = True
    steps: tuple = ()

    def _compile(self, called: tuple = ()) -> None:
        """``called``: the steps calling the user's function when ``steps`` lifted it
        (``pescheduler.lift``): run alone on rows it is called, so a failing tuple's
        traceback shows the user's own line; fused and on Arrow, the lifted steps run."""
        self.columnar = all(kind in ("assign", "project", "where") for kind, _ in self.steps)
        self._run = compile_rows(called or self.steps, self.name, inline_lambdas=False)

    def _lift(self, kind: str, fn: Callable) -> None:
        """``steps`` from the lambda ``fn`` lifted to expressions where provably the same."""
        called = ((kind, fn),)
        try:
            self.steps = lift_steps(kind, fn)
        except NotProvable:
            self.steps = called
        self._compile(called)

    def process(self, batch: Any, emit: Emitter) -> None:
        if isinstance(batch, list):
            emit.many(self._run(batch)[0])
        else:
            emit.columns(run_arrow(self.steps, batch))


class Map(Fusable):
    """A new tuple per tuple, from a function or from expressions.

    ``stream.map(lambda e: {**e, "speed": e["speed"] / 3.6})`` calls the
    function per tuple; ``stream.map(speed=col("speed") / 3.6)`` sets fields
    from expressions (``pescheduler.expr``; ``columns={"id": ...}`` for a field
    whose name is one of ``map``'s own parameters), which the chain compiles into its
    fused loop and which also run on Arrow batches. A lambda made only of what
    expressions have is lifted to one (``pescheduler.lift``) and runs the same;
    any other function is called per tuple, on rows.
    """

    name = "map"

    def __init__(self, fn: Callable[[Any], Any] | None = None, columns: dict | None = None, **more: Any) -> None:
        columns = {**(columns or {}), **more}     # columns=: fields called fn, id, name or columns too
        if (fn is None) == (not columns):
            raise TypeError("map: give a function or field=expression pairs, not both")
        self.fn = None if fn is None else _callable("map", fn)
        if fn is not None:
            self._lift("map", fn)
            return
        self.steps = (("assign", dict(columns)),)
        self._compile()


class Filter(Fusable):
    """Keep the tuples for which ``fn(t)`` is true; ``fn`` may be an expression
    (``stream.filter(col("speed") > 5)``: kept when true, dropped when false or null)."""

    name = "filter"

    def __init__(self, fn: Callable[[Any], Any] | Expr) -> None:
        self.fn = fn if isinstance(fn, Expr) else _callable("filter", fn)
        if not isinstance(fn, Expr):
            self._lift("filter", fn)
            return
        self.steps = (("where", fn),)
        self._compile()


class FlatMap(Operator):
    """Emit every item of ``fn(t)`` (an iterable): ``stream.flat_map(lambda line: line.split())``."""

    name = "flat_map"
    parallelism = Parallelism.STATELESS

    def __init__(self, fn: Callable[[Any], Iterable[Any]]) -> None:
        self.fn = _callable("flat_map", fn)

    def process(self, batch: list, emit: Emitter) -> None:
        fn = self.fn
        emit.many([item for t in batch for item in fn(t)])


class KeyBy(Fusable):
    """Mark the stream as keyed by ``field`` (a field name or a callable of the tuple).

    Tuples pass through unchanged; the compiler hands ``field`` to the KEYED
    operator that follows (``context.key_field``), and routing between copies
    hashes it.
    """

    name = "key_by"
    columnar = True

    def __init__(self, field: str | Callable[[Any], Any]) -> None:
        if not (isinstance(field, str) or callable(field)):
            raise TypeError(f"key_by: field must be a field name or a callable, got {field!r}")
        self.field = field

    def process(self, batch: Any, emit: Emitter) -> None:
        if isinstance(batch, list):
            emit.many(batch)
        else:
            emit.columns(batch)


class Union(Fusable):
    """Every tuple of every input, as it comes (SQL's ``UNION ALL``; ``stream.union(other)``).

    A pass-through with several inputs: the runtime already merges its inputs'
    batches and holds its watermark to the slowest input, as for a join.
    """

    name = "union"
    columnar = True
    process = KeyBy.process
