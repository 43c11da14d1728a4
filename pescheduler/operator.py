"""The operator contract: what a plug-in implements and what the runtime calls.

Operators are batch-at-a-time. The runtime hands ``process`` a list of tuples and
an :class:`Emitter`; per-tuple framework cost is therefore paid once per batch,
which is what lets a fused chain run close to a hand-written loop.

Tuples are dicts (or any picklable object for map/filter). A tuple, once
emitted, is read-only: fused operators and in-memory channels share the same
objects, so an operator that mutates its input changes what its neighbours see.

Example (a complete plug-in)::

    import pescheduler
    from pescheduler import Operator, Parallelism

    class Threshold(Operator):
        name = "threshold"
        parallelism = Parallelism.STATELESS

        def __init__(self, field, limit):
            self.field, self.limit = field, limit

        def process(self, batch, emit):
            f, limit = self.field, self.limit
            emit.many([t for t in batch if t[f] > limit])

    @pescheduler.hookimpl
    def pescheduler_operators():
        return [Threshold]
"""

from __future__ import annotations

import enum
import inspect
import traceback
from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar

from .eventtime import EventTime
from .redact import redact


MAX_WATERMARK = 2**63 - 1
"""The watermark that closes event time: sent at end of stream so every window fires."""

MIN_WATERMARK = -(2**63)
"""The watermark before any event: nothing is complete yet."""


class Parallelism(enum.Enum):
    """How copies of an operator may share its work.

    STATELESS: any routing, weighted. KEYED: the key space is split into key
    groups that copies own. MERGEABLE: copies hold partial state merged
    downstream by ``combine``. SINGLETON: never copied.
    """

    STATELESS = "stateless"
    KEYED = "keyed"
    MERGEABLE = "mergeable"
    SINGLETON = "singleton"


class per_instance:
    """A ``parallelism`` that differs between instances of one class (the one way to declare it).

    The planner has no instance: it reads the class (``cls.parallelism``), which
    gives ``declared``, what instances may be at most. The runtime reads each
    instance (``op.parallelism``), which gives ``of(op)``, decided by the
    instance's parameters and, after ``open``, its context. For example
    ``pattern`` is KEYED when it has a key, else SINGLETON::

        parallelism = per_instance(Parallelism.KEYED,
                                   lambda op: Parallelism.SINGLETON if op._key is None else Parallelism.KEYED)

    Assigning ``op.parallelism`` is refused: the value is derived, never set.
    """

    def __init__(self, declared: Parallelism, of: Callable[[Any], Parallelism]) -> None:
        self.declared = declared
        self.of = of

    def __get__(self, op: Any, cls: type | None = None) -> Parallelism:
        return self.declared if op is None else self.of(op)

    def __set__(self, op: Any, value: Any) -> None:
        raise AttributeError(f"{type(op).__name__}.parallelism is derived per instance (per_instance); "
                             f"change what it is derived from")


class Emitter(list):
    """The ``emit`` an operator receives: a list the operator appends to.

    ``emit(t)`` appends one tuple, ``emit.many(ts)`` extends. Being a list
    subclass keeps the hot path to one C call per emitted tuple. Side outputs
    (``emit.to(port, t)``: late events, a join's unmatched side, ...) and dead
    letters (``emit.dead_letter(t, exc)``) are rare and kept out of that path.
    """

    # Class-level defaults, no __init__: one Emitter is made per batch per operator and per
    # watermark callback, and a Python __init__ setting three slots doubled its cost (0.75 us
    # against 0.34); the rare side outputs, dead letters and Arrow batches set their attribute
    # on the instance when they first occur.
    sides: dict[str, list] | None = None
    dead: list[DeadLetter] | None = None
    batches: list | None = None

    __call__ = list.append
    many = list.extend

    def columns(self, batch: Any) -> None:
        """Emit a whole ``pyarrow.RecordBatch`` (operators with ``columnar = True``)."""
        if self.batches is None:
            self.batches = []
        if len(batch):
            self.batches.append(batch)

    def to(self, port: str, item: Any) -> None:
        """Emit ``item`` on the named side output ``port`` (declared in ``outputs``)."""
        if self.sides is None:
            self.sides = {}
        self.sides.setdefault(port, []).append(item)

    def dead_letter(self, item: Any, error: BaseException | str | None = None) -> None:
        """Send ``item`` to the dead-letter output with the error that rejected it.

        Use this inside a stateful operator that catches a per-tuple error
        itself, so that only the bad tuple is set aside.
        """
        if self.dead is None:
            self.dead = []
        self.dead.append(DeadLetter.of(item, error))


@dataclass(frozen=True)
class DeadLetter:
    """A tuple an operator rejected, with the reason (traceback text)."""

    item: Any
    error: str
    operator: str = ""

    @classmethod
    def of(cls, item: Any, error: BaseException | str | None, operator: str = "") -> "DeadLetter":
        if isinstance(error, BaseException):
            text = "".join(traceback.format_exception(type(error), error, error.__traceback__))
        else:
            text = error or ""
        return cls(item, redact(text), operator)      # dead letters are shown and written out


@dataclass
class OperatorContext:
    """What an operator learns about its place when the runtime opens it."""

    op_id: str
    pe_id: str = ""
    worker: str = ""
    key_field: str | Callable | None = None   # set when a key_by precedes a KEYED operator
    copy_index: int = 0                        # 0 for the original, 1.. for copies
    extra: dict = field(default_factory=dict)


class Operator:
    """Base class of every operator plug-in.

    Subclasses set ``name`` (the registry name) and ``parallelism`` (a class
    attribute; :class:`per_instance` when instances differ), and implement
    ``process``. The rest has safe defaults. Constructor arguments
    are captured automatically, so ``parameters()`` returns what a copy needs
    (``type(op)(**op.parameters())`` behaves like ``op``) unless overridden.
    """

    name: ClassVar[str] = ""
    parallelism: ClassVar[Parallelism] = Parallelism.STATELESS
    outputs: ClassVar[tuple[str, ...]] = ()   # side output ports besides the main one
    kind: ClassVar[str] = "operator"          # "source" | "operator" | "sink"
    columnar: bool = False                    # process() takes pyarrow.RecordBatch whole (else rows)
    # Its calls may wait on an external system (a sink retrying a delivery with backoff, a broker's
    # commit): its PE works in a thread of its own, so the worker's loop keeps answering meanwhile.
    may_block: ClassVar[bool] = False

    def __new__(cls, *args: Any, **kwargs: Any):
        self = super().__new__(cls)
        try:
            bound = inspect.signature(cls.__init__).bind(None, *args, **kwargs)
        except TypeError as exc:
            raise TypeError(f"operator {cls.name or cls.__name__!r}: {exc}") from None
        params = dict(bound.arguments)
        params.pop(next(iter(params)))          # self
        for pname, p in inspect.signature(cls.__init__).parameters.items():
            if p.kind is inspect.Parameter.VAR_KEYWORD and pname in params:
                params.update(params.pop(pname))
        self._parameters = params
        return self

    # -- lifecycle -----------------------------------------------------------------
    def open(self, context: OperatorContext) -> None:
        """Called on the worker before the first batch (open files, build caches)."""
        self.context = context

    def process(self, batch: list, emit: Emitter) -> None:
        """Handle one batch: call ``emit(t)`` / ``emit.many(ts)`` for results."""
        raise NotImplementedError(f"{type(self).__name__}.process")

    def process_input(self, input_index: int, batch: list, emit: Emitter) -> None:
        """A batch from input ``input_index`` of an operator with several inputs (a join).

        The index is the input's position in ``context.extra["inputs"]`` (the
        order the app wrote them). Operators that do not care which input a
        batch came from implement only ``process``; this default forwards to it.
        """
        self.process(batch, emit)

    def on_watermark(self, watermark: int, emit: Emitter) -> None:
        """Event time reached ``watermark`` (ms): fire what is complete. Optional."""

    def held_watermark(self) -> int | None:
        """The output watermark this operator holds back to, or None for no hold. Optional.

        Asked right after each :meth:`on_watermark`: the watermark sent downstream is
        the lesser of the input's and this. An operator that will still emit results
        with times at or before its input watermark (an as-of join's left event that
        waits for a later right one) returns one less than the oldest such time, so a
        window downstream counts those results on time instead of late.
        """
        return None

    def flush(self, emit: Emitter) -> None:
        """End of stream or release: emit partial results downstream."""

    def close(self) -> None:
        """Release resources (files, sockets). Called once, after ``flush``."""

    # -- state and copies ----------------------------------------------------------
    def parameters(self) -> dict:
        """Keyword arguments that make an equivalent fresh instance."""
        return dict(self._parameters)

    def snapshot(self) -> Any:
        """State to move on fuse/split/rescale/checkpoint (picklable)."""
        return None

    def restore(self, state: Any) -> None:
        """Install state produced by ``snapshot`` of an equivalent instance."""

    # -- copies (see pescheduler/routing.py) ---------------------------------------
    def split_state(self, state: Any, owns: Callable[[Any], bool]) -> Any:
        """KEYED only: the part of ``state`` (from ``snapshot``) for the keys where ``owns(key)``.

        When copies are added or released, key groups change owner: the
        runtime snapshots every instance, merges the snapshots with
        :meth:`merge_states`, and restores each new instance with the part
        it owns. A KEYED operator without these two methods is never copied.
        ``owns`` answers alike for every key of a key group (copies own whole key
        groups), so state kept in ``pescheduler.state`` splits by key group.
        """
        raise NotImplementedError(f"{type(self).__name__} cannot split its state by key")

    def merge_states(self, states: list) -> Any:
        """KEYED only: one state holding every key of ``states`` (disjoint key sets)."""
        raise NotImplementedError(f"{type(self).__name__} cannot merge keyed states")

    def take_partials(self, watermark: int | None) -> list:
        """MERGEABLE only, on a copy: partial results complete up to ``watermark``, then forgotten.

        ``None`` takes every partial held (the copy is being released). A copy
        calls this instead of ``on_watermark``; what it returns travels to the
        original, which folds it in with :meth:`absorb` before it fires, so the
        results equal those of a single instance.
        """
        raise NotImplementedError(f"{type(self).__name__} is not MERGEABLE")

    def absorb(self, partials: list, emit: "Emitter") -> None:
        """MERGEABLE only, on the original: fold partials from a copy into this instance's state.

        The runtime calls this with each batch of partials a copy sends. By
        default the partials are merged with :meth:`combine`, the state being
        one more partial: ``restore(combine([snapshot(), *partials]))``. An
        operator whose partials have the shape of its state (a monoid, as
        Flink's ``AggregateFunction.merge``) implements ``take_partials`` and
        ``combine`` only; others override this.
        """
        if getattr(type(self).combine, "__func__", None) is Operator.combine.__func__:
            raise NotImplementedError(f"{type(self).__name__} is not MERGEABLE (implement absorb or combine)")
        self.restore(type(self).combine([self.snapshot(), *partials]))

    @classmethod
    def combine(cls, partials: list) -> Any:
        """MERGEABLE only: one partial merging ``partials`` (the default :meth:`absorb` merges
        a copy's partials into the original's state with it)."""
        raise NotImplementedError(f"{cls.__name__} is not MERGEABLE")

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self._parameters.items())
        return f"{type(self).__name__}({args})"


def overrides(op: Operator, method: str) -> bool:
    """True when ``op``'s class overrides ``method`` of :class:`Operator`.

    The runtime skips calling hooks an operator does not implement (on_watermark,
    flush) so a fused chain pays nothing for them.
    """
    return getattr(type(op), method) is not getattr(Operator, method)


class Source(Operator):
    """Base class of sources: ``read(n)`` returns the next tuples.

    Every source takes ``rate`` (tuples per second, ``None`` = as fast as
    possible), ``ts_field`` (the event-time field, default ``ts``, or a callable
    ``tuple -> time``; ``None`` for no event time), ``ts_unit`` (``"ms"``, the
    default, ``"s"``, ``"us"`` or ``"ns"`` for numbers; ``datetime`` values and
    ISO-8601 strings are accepted as they are) and ``max_delay`` (bounded
    out-of-orderness for watermarks, default 1 s). A time read from another
    field or a callable, or not already milliseconds, is written into ``ts`` as
    milliseconds (where windows, joins and patterns look); an event without a
    valid time is a dead letter with the reason (:mod:`pescheduler.eventtime`).
    The runtime drives the source: it paces it
    to ``rate``, asks for batches of the configured size, and emits a watermark
    after each batch of ``max(ts seen) - max_delay - 1``, as Flink's
    bounded-out-of-orderness generator does, so an event at most ``max_delay``
    late is never late.
    """

    kind = "source"
    parallelism = Parallelism.SINGLETON

    def __init__(self, *, rate: float | None = None, ts_field: str | Callable | None = "ts",
                 ts_unit: str = "ms", max_delay: Any = "1s") -> None:
        from .timeutil import parse_duration

        if rate is not None and rate <= 0:
            raise ValueError(f"rate must be positive, got {rate!r}")
        self.rate = rate
        self.ts_field, self.ts_unit = ts_field, ts_unit
        EventTime(ts_field, ts_unit)                  # a bad field or unit fails here, at app build
        self.max_delay = parse_duration(max_delay)

    @property
    def event_time(self) -> EventTime:
        """How this source's event time is read (:class:`~pescheduler.eventtime.EventTime`), built
        from ``ts_field``/``ts_unit`` as they are now (a subclass may set them itself)."""
        field, unit = getattr(self, "ts_field", "ts"), getattr(self, "ts_unit", "ms")
        cached = self.__dict__.get("_event_time")
        if cached is None or cached.field is not field or cached.unit != unit:
            cached = self.__dict__["_event_time"] = EventTime(field, unit)
        return cached

    def read(self, n: int) -> list | None:
        """Return up to ``n`` tuples; ``[]`` when nothing is ready now; ``None`` at the end."""
        raise NotImplementedError(f"{type(self).__name__}.read")

    def reject(self, item: Any, error: BaseException | str) -> None:
        """Set aside input that cannot become a tuple (a malformed line): it is dead-lettered
        with ``error`` and the stream goes on."""
        rejected = self.__dict__.setdefault("_rejected", [])
        rejected.append(DeadLetter.of(item, error))

    def take_rejected(self) -> list["DeadLetter"]:
        """What ``reject`` set aside since the last call (the runtime drains it per batch)."""
        return self.__dict__.pop("_rejected", [])

    def process(self, batch: list, emit: Emitter) -> None:  # sources have no input
        raise TypeError("a source has no input")

    # -- durable positions (checkpoints, restore) ----------------------------------
    #: True for a source that reads numbered partitions (Kafka partitions, Redis streams) and lets
    #: pescheduler, not the broker, decide which instance reads which: replicating it spreads the
    #: partitions over its copies, releasing gathers them (see :class:`Share`).
    partitioned: ClassVar[bool] = False

    #: Seconds the runtime waits before asking again after ``read`` returned ``[]`` (``None``: its
    #: default, 50 ms). A broker source whose reads never block sets it lower so an empty local
    #: queue does not leave records fetched meanwhile waiting.
    poll_interval: ClassVar[float | None] = None

    def position(self) -> Any:
        """Where this source stands in its durable input: the checkpoint's record of it.

        A fresh instance with the same parameters that is given this value by
        :meth:`seek` reads on exactly after the last tuple ``read`` returned:
        nothing skipped, nothing again. It is small and survives JSON and
        msgpack unchanged (a dict with ``str`` keys): ``generator``
        ``{"index": n}``, ``iterable`` ``{"offset": n}``, ``jsonl``
        ``{"file", "offset", "line", "done"}``, Kafka ``{"partition": next
        offset}``, Redis Streams ``{stream: last entry id}``. A partitioned
        source reports the partitions its :class:`Share` reads, so the
        positions of its instances are disjoint and their union (``dict``
        merge) is the whole source's. Checkpoints take it at the barrier,
        beside ``snapshot()``.

        The default: ``None`` for a source that overrides ``restore`` (its
        snapshot carries its place and ``restore`` rewinds it); otherwise it
        raises :class:`~pescheduler.errors.NotReplayable`, since a source that
        cannot rewind cannot take part in a checkpoint.
        """
        from .errors import NotReplayable

        if overrides(self, "restore"):
            return None
        raise NotReplayable(f"source {self.name or type(self).__name__!r} ({type(self).__name__}) cannot "
                            f"rewind: it has neither position()/seek() nor restore(), so a checkpoint could not "
                            f"replay what it read after the barrier; implement position() and seek(), or read "
                            f"from a "
                            f"replayable source (generator, jsonl, iterable over a list, kafka, redis)")

    def seek(self, position: Any) -> None:
        """Go on from ``position`` (a value :meth:`position` returned, also after a JSON round
        trip); before or after ``open``, on a fresh instance or one ``restore`` d from the same
        checkpoint. A partitioned source takes the union of its instances' positions and
        reads its own share of it."""
        raise NotImplementedError(f"{type(self).__name__} has no durable position to seek to")

    def watermark(self) -> int | None:
        """Event time this source has completed, if it tracks it itself (per partition), else ``None``.

        The default (not overridden) lets the runtime derive the watermark
        from the largest ``ts_field`` seen. A partitioned source overrides it
        to return the least of its partitions' watermarks, skipping partitions
        idle for longer than its ``idle_timeout``; ``None`` means no progress now.
        """
        return None

    def lag(self) -> dict[str, int] | None:
        """Records behind per partition (the broker's end offset minus ``position``), for the
        monitor; ``None`` when the source cannot tell."""
        return None


@dataclass(frozen=True)
class Share:
    """Which partitions one instance of a partitioned source reads: partition number ``p`` is its
    when ``p % count == index``. Passed as ``owns`` to ``split_state`` when copies come or go, and
    callable like the key-group test a KEYED operator receives."""

    index: int = 0
    count: int = 1

    def __call__(self, partition: int) -> bool:
        return partition % self.count == self.index


class CommitHooks:
    """Two-phase commit hooks a sink implements to take part in checkpoints (exactly-once output).

    What the checkpoint coordinator calls (worker/barriers.py), and in which order:

    1. At the barrier of checkpoint ``id``, on the sink's PE: ``pre_commit(id)``,
       then ``snapshot()``. Everything the sink received before the barrier is
       staged (durable, not visible) under ``id``; the snapshot names what is
       staged, so restoring it knows what belongs to the checkpoint.
    2. Once checkpoint ``id`` is complete (every acknowledgement in, manifest
       written): ``commit(id)`` makes visible what was staged under ``id`` *and
       every earlier id* not yet visible, in order. Idempotent, and it forgets
       nothing it has not published: what is staged stays in the sink's
       bookkeeping (and its snapshots) until the external system confirmed it,
       so a ``commit`` that raised may be called again and finishes the job. A
       ``commit`` that raises fails the sink's PE: the run restores (step 4)
       and commits again, or fails loudly; a sink that cannot deliver raises
       :class:`~pescheduler.errors.DeliveryFailed` from ``process`` too.
    3. A checkpoint that fails while the job goes on gets no call: its input
       is not read again, so what it staged goes out with the next ``commit``
       (as Flink's two-phase-commit sinks do).
    4. Recovery from checkpoint ``n``: a fresh instance gets ``restore(state)``,
       ``open``, ``commit(n)`` (the crash may have come between the manifest and
       the commit), then ``abort(n + 1)``: discard everything staged after
       ``n``, because the sources replay it. The built-in file sinks already cut
       their files back to the snapshot in ``restore`` (a torn commit included),
       so a coordinator that lost track of later ids recovers them the same way.

    A sink that never sees ``pre_commit`` writes straight through, as without
    checkpoints. A source may implement them too (``pre_commit`` at its barrier,
    ``commit`` once the checkpoint is complete): ``postgres_cdc`` advances its
    replication slot only then. The end of a finite stream (``flush``) makes everything
    visible: it is the stream's last checkpoint.
    """

    def pre_commit(self, checkpoint_id: int) -> None:
        """The barrier of ``checkpoint_id`` passed: output before it is durable, not yet visible."""

    def commit(self, checkpoint_id: int) -> None:
        """Checkpoint ``checkpoint_id`` completed: make output staged up to it visible
        (idempotent; also on an instance restored from that checkpoint)."""

    def abort(self, checkpoint_id: int) -> None:
        """Restored from ``checkpoint_id - 1``: discard output staged for ``checkpoint_id`` and
        later, and what came since the last barrier (the stream replays it)."""


class Sink(Operator, CommitHooks):
    """Base class of sinks: ``process`` writes, ``flush`` makes it durable.

    A sink that can hold output back until a checkpoint completes overrides
    the :class:`CommitHooks` (``pre_commit`` / ``commit`` / ``abort``): its
    output is exactly-once through failures. The defaults do nothing, which
    is at-least-once (a restored stream writes again what came after the
    checkpoint).
    """

    kind = "sink"
    parallelism = Parallelism.SINGLETON
