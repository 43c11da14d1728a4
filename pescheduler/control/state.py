"""The state machine of one deployment, and of each of its PEs.

    starting ──> running ──> stopping ──> stopped     (a drain asked for: stop, Ctrl-C, SIGTERM)
        │           │            └──────> failed
        │           ├──> finished                     (finite sources: every PE finished)
        └───────────┴──> failed                       (an error, a lost worker or scheduler)

``stopped``, ``finished`` and ``failed`` are final: the first ending wins and
later ones are ignored (a watcher may report a lost worker after a stop began
closing the cluster). Each PE is ``running``, ``finished``, ``failed`` or
``stopped`` as its worker last said. Events (deploys, reconfigurations,
failures, policy decisions) are kept here too, bounded, so that the status
board (``status.py``) is a pure view of this object, the monitor and the
placement.
"""

from __future__ import annotations

import time
from collections import deque
from typing import Iterable

from ..redact import redact

EVENTS_KEPT = 200
FINAL = ("stopped", "finished", "failed")
TRANSITIONS = {"starting": ("running", "failed", "stopped"),
               "running": ("stopping", "finished", "failed", "stopped", "stalled"),
               "stalled": ("running", "stopping", "finished", "failed", "stopped"),   # stall.py
               "stopping": ("stopped", "failed")}


class DeploymentState:
    """Where a deployment and its PEs are; see the module docstring."""

    def __init__(self) -> None:
        self.state = "starting"
        self.error: str | None = None
        self.t0 = time.monotonic()
        self.t_end: float | None = None
        self.pe_state: dict[str, str] = {}
        self.events: deque = deque(maxlen=EVENTS_KEPT)
        self.threaded: set[str] = set()          # PEs seen working in their own thread

    # -- the deployment --------------------------------------------------------------------
    @property
    def live(self) -> bool:
        """Running and not stopping: actions may still change the layout."""
        return self.state == "running"

    @property
    def ended(self) -> bool:
        return self.state in FINAL

    def to(self, state: str, error: str | None = None) -> bool:
        """Go to ``state`` if allowed from here; False (nothing changes) otherwise."""
        if state not in TRANSITIONS.get(self.state, ()):
            return False
        self.state = state
        if state in FINAL:
            self.error = None if error is None else redact(error)   # status, metadata, CLI, dashboard
            self.t_end = time.monotonic()
        return True

    def end(self, error: str | None = None) -> None:
        """All PEs finished (or a drain completed): ``finished``, or ``stopped`` after a drain."""
        self.to("stopped" if self.state == "stopping" else "finished", error)

    def fail(self, reason: str) -> bool:
        """``failed`` with ``reason``; False when the deployment had ended already."""
        if not self.to("failed", reason):
            return False
        self.event("failed", reason.strip().splitlines()[0])
        return True

    def event(self, kind: str, text: str) -> None:
        self.events.append({"t": round(time.monotonic() - self.t0, 3), "kind": kind, "text": redact(text)})

    # -- its PEs ----------------------------------------------------------------------------
    def running(self, pes: Iterable[str]) -> None:
        """Deployed: every PE running."""
        self.pe_state = {pe_id: "running" for pe_id in pes}
        self.to("running")

    def pes_replaced(self, pes: Iterable[str]) -> None:
        """A reconfiguration installed a new set of PEs: those that went are forgotten."""
        self.pe_state = {pe_id: self.pe_state.get(pe_id, "running") for pe_id in pes}

    def pes_reported(self, states: dict[str, dict]) -> None:
        """A worker's long-poll answer: ``pe_id -> {"state": ...}``."""
        for pe_id, s in states.items():
            if pe_id in self.pe_state and self.pe_state[pe_id] != s["state"]:
                self.pe_state[pe_id] = s["state"]
                if s["state"] in ("finished", "failed"):
                    self.event(s["state"], f"PE {pe_id} {s['state']}")

    def all_finished(self) -> bool:
        return bool(self.pe_state) and all(s == "finished" for s in self.pe_state.values())

    def done_pes(self, pes: Iterable[str]) -> list[str]:
        """Those of ``pes`` that have nothing left to move (finished, failed or stopped)."""
        return [p for p in pes if self.pe_state.get(p) in ("finished", "failed", "stopped")]
