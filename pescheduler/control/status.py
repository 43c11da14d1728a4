"""The status of a deployment as the live view, ``status --json`` and tests see it.

PEs are named by :func:`short_pe` in every row; the PE's full id is its row's ``name``.
A pure view: :func:`status_view` reads the :class:`~pescheduler.control.state.DeploymentState`
(state, PE states, events), the monitor's latest
:class:`~pescheduler.metrics.MetricsSnapshot` and the placement, and
builds the dict; it holds and changes nothing.
"""

from __future__ import annotations

import time
from dataclasses import asdict

from ..metrics import MetricsSnapshot
from ..resources import ResourceView
from ..plan.placement import Placement
from .state import DeploymentState

_NO_FIGURES = {"tuples_in_per_s": 0.0, "tuples_out_per_s": 0.0, "busy": 0.0, "backpressure": 0.0, "idle": 0.0,
               "queue_batches": 0, "max_queue_batches": 0, "backpressure_s": 0.0, "state_bytes": None}


def status_view(app_name: str, state: DeploymentState, snap: MetricsSnapshot | None,
                placement: Placement | None, dead_letters: int, resources: ResourceView | None = None) -> dict:
    """The status dict; ``dead_letters`` is the count received (every one, kept or not);
    ``resources``: what the resource manager holds and lends, and the budget bounding it."""
    snap = snap or MetricsSnapshot(time.monotonic(), 0.0)
    pes = []
    for pe_id, pe in (placement.pes.items() if placement else ()):
        m = snap.pes.get(pe_id)
        row = asdict(m) if m else {"worker": pe.worker, "host": pe.host, **_NO_FIGURES}
        row["pe"], row["name"], row["operators"] = short_pe(pe_id), pe_id, list(pe.operators)
        row["state"] = state.pe_state.get(pe_id, row.get("state", "running"))
        pes.append(row)
    return {
        "app": app_name, "state": state.state, "error": state.error,
        "elapsed_s": round((state.t_end or time.monotonic()) - state.t0, 3),
        "pes": pes,
        "operators": [{"op": m.op_id, **{k: v for k, v in asdict(m).items() if k != "op_id"}, "pe": short_pe(m.pe)}
                      for m in snap.operators.values()],
        "workers": [asdict(w) for w in snap.workers.values()],
        "hosts": [dict(asdict(h), workers=list(h.workers)) for h in snap.hosts.values()],
        "dead_letters": dead_letters, "late_events": snap.late_events,
        "channels": channels(placement) if placement else [],
        "slots": [{"slot": s, "worker": slot.worker, "host": slot.host, "copies": list(slot.copies)}
                  for s, slot in (placement.slots.items() if placement else ())],
        "resources": asdict(resources or ResourceView()),
        "events": list(state.events),
    }


def channels(placement: Placement) -> list[dict]:
    """The channels between PEs, one per pair that exchanges tuples: ``{"from", "to", "edges"}``,
    ``edges`` naming the operator edges it carries (``"window-4[late]->print-6"`` for a side output)."""
    pairs: dict[tuple[str, str], list[str]] = {}
    for src, port, dst, dst_pe in placement.channels():
        edge = f"{src}{'' if port == 'out' else f'[{port}]'}->{dst}"
        pairs.setdefault((placement.pe_of(src), dst_pe), []).append(edge)
    return [{"from": short_pe(a), "to": short_pe(b), "edges": edges} for (a, b), edges in sorted(pairs.items())]


def short_pe(pe_id: str) -> str:
    """A PE's id in status: its first operator's (unique: an operator runs in one PE). The full id
    lists every operator (``map-2->map-3->...``); repeated in every operator's row it made the
    status grow with the square of the operator count, so it appears once, as the PE's ``name``."""
    return pe_id.split("->", 1)[0]
