"""The status of a deployment as the live view, ``status --json`` and tests see it.

A view over the monitor's latest :class:`~pescheduler.control.monitor.MetricsSnapshot`
plus the deployment's state, PE states and recent events (deploys,
reconfigurations, failures, policy decisions).
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import asdict

from .monitor import Monitor, MetricsSnapshot
from ..plan.placement import Placement

EVENTS_KEPT = 200


class StatusBoard:
    """State, events and the monitor behind one deployment's status dict."""

    def __init__(self, app_name: str) -> None:
        self.app_name = app_name
        self.state = "starting"
        self.error: str | None = None
        self.t0 = time.monotonic()
        self.monitor: Monitor | None = None
        self.pe_state: dict[str, str] = {}
        self.events: deque = deque(maxlen=EVENTS_KEPT)
        self.stopping = False          # a drain was asked for: its end is "stopped", not "finished"
        self.threaded: set[str] = set()
        self.t_end: float | None = None

    def started(self, placement: Placement, history: int) -> None:
        self.monitor = Monitor(placement, history)
        self.state = "running"
        self.pe_state = {pe_id: "running" for pe_id in placement.pes}
        workers = {pe.worker for pe in placement.pes.values()}
        self.event("deploy", f"{len(placement.pes)} PEs on {len(workers)} workers")

    def replaced(self, placement: Placement) -> None:
        """A reconfiguration installed ``placement``: PEs that went are forgotten."""
        self.monitor.replace(placement)
        self.pe_state = {pe_id: self.pe_state.get(pe_id, "running") for pe_id in placement.pes}

    def event(self, kind: str, text: str) -> None:
        self.events.append({"t": round(time.monotonic() - self.t0, 3), "kind": kind, "text": text})

    def pe_states(self, states: dict[str, dict]) -> None:
        for pe_id, s in states.items():
            if pe_id in self.pe_state and self.pe_state[pe_id] != s["state"]:
                self.pe_state[pe_id] = s["state"]
                if s["state"] in ("finished", "failed"):
                    self.event(s["state"], f"PE {pe_id} {s['state']}")

    def all_finished(self) -> bool:
        return bool(self.pe_state) and all(s == "finished" for s in self.pe_state.values())

    def finish(self, state: str, error: str | None = None) -> None:
        if self.state in ("running", "starting"):
            self.state = "stopped" if state == "finished" and self.stopping else state
            self.error = error
            self.t_end = time.monotonic()

    def update(self, answers: list[dict]) -> MetricsSnapshot:
        snapshot = self.monitor.update(answers)
        for pe_id, m in snapshot.pes.items():
            if m.threaded and pe_id not in self.threaded:
                self.threaded.add(pe_id)
                self.event("thread", f"PE {pe_id} works in its own thread: its operators block or run long")
        return snapshot

    def status(self) -> dict:
        snap = self.monitor.latest if self.monitor else MetricsSnapshot(time.monotonic(), 0.0)
        pes = []
        for pe_id, pe in (self.monitor.placement.pes.items() if self.monitor else ()):
            m = snap.pes.get(pe_id)
            row = asdict(m) if m else {"pe": pe_id, "worker": pe.worker, "host": pe.host,
                                       "tuples_in_per_s": 0.0, "tuples_out_per_s": 0.0, "busy": 0.0,
                                       "backpressure": 0.0, "idle": 0.0, "queue_batches": 0,
                                       "max_queue_batches": 0, "backpressure_s": 0.0}
            row["operators"] = list(pe.operators)
            row["state"] = self.pe_state.get(pe_id, row.get("state", "running"))
            pes.append(row)
        return {
            "app": self.app_name, "state": self.state, "error": self.error,
            "elapsed_s": round((self.t_end or time.monotonic()) - self.t0, 3),
            "pes": pes,
            "operators": [{"op": m.op_id, **{k: v for k, v in asdict(m).items() if k != "op_id"}}
                          for m in snap.operators.values()],
            "workers": [asdict(w) for w in snap.workers.values()],
            "hosts": [dict(asdict(h), workers=list(h.workers)) for h in snap.hosts.values()],
            "dead_letters": snap.dead_letters, "late_events": snap.late_events,
            "slots": [{"slot": s, "worker": slot.worker, "host": slot.host, "copies": list(slot.copies)}
                      for s, slot in (self.monitor.placement.slots.items() if self.monitor else ())],
            "events": list(self.events),
        }
