"""Policy decisions in the live view: each is an event; the totals line counts them by outcome."""

from __future__ import annotations

from rich.console import Console

from pescheduler.actions import Replicate
from pescheduler.control.controller import Decision
from pescheduler.liveview import decision_counts, render, totals


def status_with(*decisions: Decision) -> dict:
    events = [{"t": 1.0, "kind": "policy", "text": "active: rate, copy"},
              {"t": 1.5, "kind": "reconfigure", "text": "Replicate('op2', 2): 1 operators moved"}]
    events += [{"t": 2.0 + i, "kind": "policy", "text": d.text()} for i, d in enumerate(decisions)]
    return {"app": "a", "state": "running", "pes": [], "events": events}


def test_decisions_are_counted_by_outcome_and_quarantine_shows():
    up = Replicate("op2", 2, reason="op2 is offered 4000 t/s")
    status = status_with(Decision(1.0, "rate", "applied", up), Decision(1.0, "copy", "overruled", up, "x"),
                         Decision(2.0, "rate", "suppressed", up, "cooldown: 3.0 s left"),
                         Decision(2.0, "boom", "quarantined", detail="raised ValueError: bad"))
    assert decision_counts(status) == {"applied": 1, "overruled": 1, "suppressed": 1, "quarantined": 1}
    line = totals(status).plain
    assert line.endswith("policy decisions 1 applied, 1 overruled, 1 suppressed, 1 quarantined")
    console = Console(width=200, record=True)
    console.print(render(status))
    text = console.export_text()
    assert "rate applied Replicate('op2', 2): op2 is offered 4000 t/s" in text
    assert "boom quarantined because it raised ValueError: bad" in text


def test_no_decisions_no_count():
    assert decision_counts(status_with()) == {} and "policy decisions" not in totals(status_with()).plain
