"""Heartbeat alerts: an alert for every device that sent no heartbeat for 30 s of event time.

    python -m pescheduler deploy examples/heartbeat_alerts.py

Each of 200 devices beats every 10 s for 20 minutes of event time; now and
then one falls silent for a while. A keyed process function keeps, per
device, the time of its last beat and one event-time timer 30 s after it: a
new beat cancels the timer and sets the next, a timer that fires means 30 s
passed with no beat and emits an alert. Alerts go to
``out/heartbeat_alerts.jsonl``, one line per silence::

    {"device": "dev-017", "silent_since": 330000, "alert_at": 360000}

The last beat of every device also ends in an alert (the stream ends, the
devices fall silent). ``reference()`` computes the same alerts in plain
Python; the tests compare the two.
"""

import random

from pescheduler import Application

DEVICES, MINUTES, SILENCE_MS = 200, 20, 30_000
OUTPUT = "out/heartbeat_alerts.jsonl"


class HeartbeatMonitor:
    """Per device: a timer ``silence_ms`` after the last beat; it fires only if no beat came since."""

    def __init__(self, silence_ms: int = SILENCE_MS) -> None:
        self.silence_ms = silence_ms

    def on_event(self, beat, ctx):
        if "due" in ctx.state:
            ctx.timers.cancel(ctx.state["due"])
        ctx.state["last"] = beat["ts"]
        ctx.state["due"] = beat["ts"] + self.silence_ms
        ctx.timers.at(ctx.state["due"])

    def on_timer(self, ts, device, ctx):
        ctx.emit({"device": device, "silent_since": ctx.state["last"], "alert_at": ts})
        ctx.state.clear()           # a silent device holds no memory until it beats again


def heartbeats() -> list[dict]:
    """Beats of every device every 10 s (a little jitter); a device skips a run of beats now and then."""
    rng = random.Random(33)
    beats = []
    for d in range(DEVICES):
        skip_until = -1
        for slot in range(MINUTES * 6):
            if slot <= skip_until:
                continue
            if rng.random() < 0.03:
                skip_until = slot + rng.randint(1, 6)     # 10 to 60 s of silence
            beats.append({"device": f"dev-{d:03d}", "ts": slot * 10_000 + rng.randint(0, 500)})
    return sorted(beats, key=lambda b: b["ts"])


def build(output: str = OUTPUT) -> Application:
    app = Application("heartbeat-alerts")
    (app.source("iterable", items=heartbeats())
        .key_by("device")
        .process(HeartbeatMonitor, silence_ms=SILENCE_MS)
        .sink("jsonl", path=output))
    return app


def reference() -> list[dict]:
    """The same alerts by a plain loop: a gap of more than ``SILENCE_MS`` after a beat, and the last beat."""
    last: dict = {}
    alerts = []
    for beat in heartbeats():
        prev = last.get(beat["device"])
        if prev is not None and beat["ts"] - prev > SILENCE_MS:
            alerts.append({"device": beat["device"], "silent_since": prev, "alert_at": prev + SILENCE_MS})
        last[beat["device"]] = beat["ts"]
    alerts += [{"device": d, "silent_since": ts, "alert_at": ts + SILENCE_MS} for d, ts in last.items()]
    return sorted(alerts, key=lambda a: (a["device"], a["alert_at"]))
