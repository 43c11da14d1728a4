"""Driving a keyed operator as a chain would, and moving its key groups to a copy and back as a
hand-over does (worker/handover.py): the steps the operators' state tests share."""

from __future__ import annotations

import pickle
from typing import Any, Callable

from pescheduler.operator import Emitter
from pescheduler.state import key_group
from pescheduler.testing import feed

WORKERS = ["tcp://a", "tcp://b"]


def placed_keyed_window() -> tuple[Any, str]:
    """A count window keyed over 50 keys, placed on :data:`WORKERS` (no cluster): the placement a
    rescale's plan starts from, and the window's op id."""
    from pescheduler import Application
    from pescheduler.plan.compiler import compile_app
    from pescheduler.plugins import load_plugins

    app = Application("t")
    (app.source("numbers", count=10**9, keys=50).key_by("key")
        .window(count=10, aggregates={"total": ("sum", "n")}).sink("collect"))
    placement = compile_app(app, load_plugins(["support_ops"]), WORKERS, {w: w for w in WORKERS})
    return placement, next(op for op in placement.plan.ops if op.startswith("count_window"))


def opened_as_a_pe(op: Any, op_id: str, state: dict | None = None, key: str = "id") -> Any:
    """``op`` restored from ``state`` (when given) and opened keyed by ``key`` (its keyed state then
    in the configured backend), as a PE makes it."""
    from pescheduler.operator import OperatorContext

    if state is not None:
        op.restore(state)
    op.open(OperatorContext(op_id=op_id, pe_id="test", key_field=key, extra={}))
    return op


def resume(op, items: list, batch: int, start: int) -> list:
    """The rows ``op`` (opened, holding state) gives for ``items`` after watermark ``start``: it is
    driven as a chain would (``testing.feed``), then its watermark reaches the last item's time."""
    out = feed(op, items, batch, start)
    emit = Emitter()
    op.on_watermark(items[-1]["ts"] if items else start, emit)
    return out + list(emit)


def rows(out: list) -> list:
    """Rows as a multiset (their order across keys is not the operators' promise)."""
    return sorted(map(repr, out))


def round_trip(value: Any) -> Any:
    """``value`` as the receiving worker gets it (pickled on the wire)."""
    return pickle.loads(pickle.dumps(value))


def moved_to_a_copy_and_back(opened: Callable[..., Any], held: Callable[[Any], Any], stream: list, batch: int,
                             copy_of: Callable[[Any], Any], key: str = "id") -> tuple[list, list]:
    """The rows of ``stream`` through one instance whose odd key groups move to a copy after 250
    events (the copy made from their export by ``copy_of``) and back to it after 600; and the rows
    of an uninterrupted run. ``held(op)`` is the operator's keyed state (its groups are checked)."""
    whole = resume(opened(), stream, batch, start=-1)
    head, middle, tail = stream[:300], stream[300:600], stream[600:]
    op = opened()
    out = resume(op, head[:250], batch, start=-1)
    assert len(held(op)) > 5
    moving = frozenset(g for g in held(op).groups() if g % 2)
    out += resume(op, head[250:], batch, start=249)     # turns between the choice and the export
    copy = copy_of(round_trip(op.export_groups(moving)))
    assert moving.isdisjoint(held(op).groups()) and set(held(copy).groups()) <= moving
    mine = [e for e in middle if key_group(e[key]) in moving]
    out += resume(copy, mine, batch, start=299)
    out += resume(op, [e for e in middle if key_group(e[key]) not in moving], batch, start=299)
    op.import_groups(round_trip(copy.export_groups(moving)))   # released: back to op
    out += resume(op, tail, batch, start=599)
    return out, whole
