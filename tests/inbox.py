"""Taking a PE's inbox in a unit test the way its loop does: turn by turn.

One ``InputScheduler.take`` (worker/flow.py) ends when its time slice is used up, after any
item: a test that took all its items in one call failed on a loaded machine
(load 23), when the process lost the CPU for a slice between two items.
"""

from __future__ import annotations


def take_all(pe, turns: int = 100, leaving: int = 0) -> None:
    """Turns of ``pe``'s inbox until it holds ``leaving`` items (bounded: fails naming what is left)."""
    for _ in range(turns):
        if len(pe.ports.inbox.items) <= leaving:
            return
        pe.inputs.take()
    raise AssertionError(f"the inbox did not come down to {leaving} items in {turns} turns: "
                         f"{[(c.channel_id, kind, len(p) if isinstance(p, list) else p) for c, kind, p in pe.ports.inbox.items]}")
