"""Running a policy's decision with a deadline, so a slow policy never holds the control loop.

Each call runs in a daemon thread of its own and is awaited for at most the
deadline (``pescheduler.policies.deadline``). A call over it is *late*: the
round goes on without that policy's answer (its thread is left to finish: a
Python thread cannot be killed, and a daemon thread never holds up the
process's exit). While a late call still runs, the policy is skipped;
after ``pescheduler.policies.deadline-strikes`` late or skipped rounds in a
row it is *quarantined* like a policy that raises.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any, Callable


class Deadlines:
    """Per-policy deadline calls and strike counts; see the module docstring."""

    def __init__(self, deadline_s: float, strikes: int) -> None:
        self.deadline_s = deadline_s
        self.strikes = max(1, strikes)
        self.late: dict[str, int] = {}                       # name -> late rounds in a row
        self.running: dict[str, asyncio.Future] = {}         # name -> a late call still running

    async def call(self, name: str, fn: Callable[[], Any]) -> tuple[str, Any]:
        """``("ok", value)``, ``("raised", exc)``, ``("late", why)`` (skipped this round) or
        ``("quarantined", why)`` (late ``strikes`` rounds in a row)."""
        busy = self.running.get(name)
        if busy is not None and not busy.done():
            return self._strike(name, f"is still deciding an earlier round (over {self.deadline_s:g} s)")
        self.running.pop(name, None)
        future = in_thread(fn, f"pescheduler-policy-{name}")
        try:
            value = await asyncio.wait_for(asyncio.shield(future), self.deadline_s)
        except asyncio.TimeoutError:
            self.running[name] = future
            return self._strike(name, f"took longer than its deadline of {self.deadline_s:g} s")
        except Exception as exc:
            return "raised", exc
        self.late.pop(name, None)
        return "ok", value

    def _strike(self, name: str, why: str) -> tuple[str, str]:
        self.late[name] = self.late.get(name, 0) + 1
        if self.late[name] >= self.strikes:
            return "quarantined", f"{why}, {self.late[name]} rounds in a row"
        return "late", f"{why}: skipped this round ({self.late[name]} of {self.strikes} before quarantine)"


def in_thread(fn: Callable[[], Any], name: str) -> asyncio.Future:
    """Run ``fn()`` in a new daemon thread; a future (of the running loop) for its result."""
    loop = asyncio.get_running_loop()
    future = loop.create_future()

    def settle(ok: bool, value: Any) -> None:
        if not future.done():
            (future.set_result if ok else future.set_exception)(value)

    def run() -> None:
        try:
            result = (True, fn())
        except BaseException as exc:          # handed to the awaiting loop, which decides
            result = (False, exc)
        try:
            loop.call_soon_threadsafe(settle, *result)
        except RuntimeError:                  # the loop closed while the policy was deciding
            pass

    threading.Thread(target=run, name=name, daemon=True).start()
    return future
