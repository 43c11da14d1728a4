"""A released copy's queued input, handed over with its key groups instead of processed.

A Release retires a copy whose key groups all go back to a running instance
that gates them (``pending_groups.py``). Before, the copy processed everything
its input channels carried up to the reconfiguration's marker and only then
aligned: the pause waited for a credit window of queued tuples (8,000 at the
default credits and batch size) to go through the copy's operator, 359-875 ms
at 10^7 keys on ``disk`` (session 36: "drain state#1<-key_by-2.out").

Now, once asked to align, the copy takes each tuple of a carrying operator
aside, per key group, in arrival order, and lets it through no further
(:class:`CarriedInput`); the marker comes behind them as fast as the channel
delivers it. The tuples travel in the key groups' hand-over parts
(``handover.exported``), and the gaining instance puts them ahead of the
tuples its gate holds for the group (``PendingGroups.carried``), so they go
through its operator right after the group's state, before anything the
router sent it after the switch: per key, the order of one instance, and each
tuple once (the copy counted it in, processed nothing of it).

Which copies carry is the plan's call (``plan.carry``: every operator of the
copy ``plan/state.py``'s ``carries``): not one whose operator fires on
watermarks or holds its output's back, since a tuple on time at the copy could
be late at the original, nor one that tells its inputs apart or takes columns
(never gated). Such a copy drains as before.
"""

from __future__ import annotations

from typing import Any, Callable

from ..wire import key_group
from .routing import key_function


class CarriedInput:
    """The tuples that reach ``keys``' operators in ``chain`` from now on, taken per key group."""

    def __init__(self, chain: Any, keys: dict[str, Callable[[Any], Any]]) -> None:
        self.tuples: dict[str, dict[int, list]] = {op_id: {} for op_id in keys}
        for op_id, key in keys.items():
            chain.nodes[op_id].process = self._taker(self.tuples[op_id], key)

    def _taker(self, groups: dict[int, list], key: Callable[[Any], Any]) -> Callable[[list, Any], None]:
        def take(batch: list, _emit: Any) -> None:
            for t in batch:
                g = key_group(key(t))
                queue = groups.get(g)
                if queue is None:
                    groups[g] = [t]
                else:
                    queue.append(t)
        return take

    def take(self, op_id: str, groups) -> dict[int, list]:
        """Operator ``op_id``'s carried tuples of ``groups`` (removed: they leave with the groups)."""
        mine = self.tuples.get(op_id, {})
        return {g: mine.pop(g) for g in groups if g in mine}

    def left(self) -> int:
        """Tuples taken and not handed over yet (a part that did not take them would lose them)."""
        return sum(len(q) for groups in self.tuples.values() for q in groups.values())


def carrying(chain: Any, spec: Any, pending: dict[str, Any]) -> CarriedInput | None:
    """A :class:`CarriedInput` over every operator of this PE (the plan chose it: ``plan.carry``),
    or None while one of them still waits for key groups of its own (a gate not done: what it
    would carry could not be told from what it waits for), so the PE drains as before."""
    if any(gate is not None and not gate.done for gate in (pending.get(op_id) for op_id in spec.ops)):
        return None
    return CarriedInput(chain, {op_id: key_function(key) for op_id, (_cls, _params, key) in spec.ops.items()})
