"""The status of a deployment as the live view, ``status --json`` and tests see it.

PE hosts report cumulative counters; the board keeps the previous report per
PE and turns differences into per-second rates and busy/backpressure
fractions of wall time, so a report that is late or lost costs precision,
never correctness.
"""

from __future__ import annotations

import time
from collections import deque

from .placement import Placement

EVENTS_KEPT = 200


class StatusBoard:
    """Holds the latest figures of every PE and operator, plus recent events."""

    def __init__(self, app_name: str) -> None:
        self.app_name = app_name
        self.state = "starting"
        self.error: str | None = None
        self.t0 = time.monotonic()
        self.placement: Placement | None = None
        self.hosts: dict[str, str] = {}
        self.pe_state: dict[str, str] = {}
        self.pe_rows: dict[str, dict] = {}
        self.op_rows: dict[str, dict] = {}
        self.dead_letters = 0
        self.late_events = 0
        self.events: deque = deque(maxlen=EVENTS_KEPT)
        self._last: dict[str, tuple[float, dict]] = {}     # pe -> (time, cumulative stats)

    def started(self, placement: Placement, worker_info: dict[str, dict]) -> None:
        self.placement = placement
        self.state = "running"
        self.pe_state = {pe_id: "running" for pe_id in placement.pes}
        for pe_id, pe in placement.pes.items():
            self.pe_rows[pe_id] = _pe_row(pe_id, pe.operators, pe.worker, pe.host)
            for op in pe.operators:
                self.op_rows[op] = _op_row(op, pe_id)
        self.event("deploy", f"{len(placement.pes)} PEs on {len(set(p.worker for p in placement.pes.values()))} workers")

    def event(self, kind: str, text: str) -> None:
        self.events.append({"t": round(time.monotonic() - self.t0, 3), "kind": kind, "text": text})

    def pe_states(self, states: dict[str, dict]) -> None:
        for pe_id, s in states.items():
            if pe_id in self.pe_state and self.pe_state[pe_id] != s["state"]:
                self.pe_state[pe_id] = s["state"]
                self.pe_rows[pe_id]["state"] = s["state"]
                if s["state"] in ("finished", "failed"):
                    self.event(s["state"], f"PE {pe_id} {s['state']}")

    def all_finished(self) -> bool:
        return bool(self.pe_state) and all(s == "finished" for s in self.pe_state.values())

    def finish(self, state: str, error: str | None = None) -> None:
        if self.state in ("running", "starting"):
            self.state = state
            self.error = error

    def update(self, answers: list[dict]) -> None:
        """Fold one round of ``pe_stats`` answers into rates and totals."""
        now = time.monotonic()
        dead = late = 0
        for answer in answers:
            for pe_id, stats in answer["pes"].items():
                if pe_id not in self.pe_rows:
                    continue
                self._update_pe(pe_id, stats, now)
                dead += sum(o["dead_letters"] for o in stats["operators"].values())
                late += sum(n for k, n in stats["side"].items() if k.endswith(".late"))
        self.dead_letters, self.late_events = dead, late

    def _update_pe(self, pe_id: str, stats: dict, now: float) -> None:
        t_prev, prev = self._last.get(pe_id, (now - max(stats["elapsed_s"], 1e-9), None))
        dt = max(now - t_prev, 1e-9)
        ops_prev = prev["operators"] if prev else {}
        busy = 0.0
        for op_id, o in stats["operators"].items():
            p = ops_prev.get(op_id, {"tuples_in": 0, "tuples_out": 0, "busy_s": 0.0})
            row = self.op_rows[op_id]
            row.update(tuples_in=o["tuples_in"], tuples_out=o["tuples_out"], dead_letters=o["dead_letters"],
                       late=o["side"].get("late", 0),
                       tuples_in_per_s=(o["tuples_in"] - p["tuples_in"]) / dt,
                       tuples_out_per_s=(o["tuples_out"] - p["tuples_out"]) / dt,
                       busy=min(1.0, (o["busy_s"] - p["busy_s"]) / dt))
            busy += row["busy"]
        first, last = self.placement.pes[pe_id].operators[0], self.placement.pes[pe_id].operators[-1]
        bp_prev = prev["backpressure_s"] if prev else 0.0
        self.pe_rows[pe_id].update(
            state=stats["state"],
            tuples_in_per_s=self.op_rows[first]["tuples_in_per_s"] or self.op_rows[first]["tuples_out_per_s"],
            tuples_out_per_s=self.op_rows[last]["tuples_out_per_s"],
            busy=min(1.0, busy), backpressure=min(1.0, (stats["backpressure_s"] - bp_prev) / dt),
            backpressure_s=stats["backpressure_s"], queue_batches=stats["queue_batches"],
            max_queue_batches=stats["max_queue_batches"])
        self._last[pe_id] = (now, stats)

    def status(self) -> dict:
        return {
            "app": self.app_name, "state": self.state, "error": self.error,
            "elapsed_s": round(time.monotonic() - self.t0, 3),
            "pes": [dict(r) for r in self.pe_rows.values()],
            "operators": [dict(r) for r in self.op_rows.values()],
            "dead_letters": self.dead_letters, "late_events": self.late_events,
            "events": list(self.events),
        }


def _pe_row(pe_id: str, operators: tuple[str, ...], worker: str, host: str) -> dict:
    return {"pe": pe_id, "operators": list(operators), "worker": worker, "host": host,
            "tuples_in_per_s": 0.0, "tuples_out_per_s": 0.0, "busy": 0.0, "backpressure": 0.0,
            "backpressure_s": 0.0, "queue_batches": 0, "max_queue_batches": 0, "state": "running"}


def _op_row(op_id: str, pe_id: str) -> dict:
    return {"op": op_id, "pe": pe_id, "tuples_in": 0, "tuples_out": 0, "tuples_in_per_s": 0.0,
            "tuples_out_per_s": 0.0, "busy": 0.0, "dead_letters": 0, "late": 0}
