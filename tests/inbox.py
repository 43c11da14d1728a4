"""Taking a PE's inbox in a unit test the way its loop does: turn by turn.

One ``InputScheduler.take`` (worker/flow.py) ends when its time slice is used up, after any
item: a test that took all its items in one call failed on a loaded machine
(load 23), when the process lost the CPU for a slice between two items.
"""

from __future__ import annotations


def take_all(pe, turns: int = 100) -> None:
    """Turns of ``pe``'s inbox until it is empty (bounded: fails naming what is left)."""
    for _ in range(turns):
        if not pe.ports.inbox.items:
            return
        pe.inputs.take()
    raise AssertionError(f"the inbox did not empty in {turns} turns: {list(pe.ports.inbox.items)}")
