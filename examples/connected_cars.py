"""Connected cars: the average speed of every car per minute of event time.

Run it on the embedded default (a LocalCluster with one worker per core)::

    python -m pescheduler deploy examples/connected_cars.py

Results go to ``out/avg_speed.jsonl``: one line per car and minute with
``car``, ``window_start``, ``window_end`` (ms, end exclusive) and ``avg_speed``
(m/s). ``reference()`` computes the same in plain Python; the tests compare
the two: the same rows, each average to the last bits the order of its
additions allows (a copy of an upstream operator may interleave a car's events).
"""

from pescheduler import Application

EVENTS = 2_000_000
GENERATOR = dict(events=EVENTS, keys=10_000, seed=7)
OUTPUT = "out/avg_speed.jsonl"


def to_metres_per_second(event):
    return {**event, "speed": event["speed"] / 3.6}


def moving(event):
    return event["speed"] > 5


def build(events: int = EVENTS, output: str = OUTPUT) -> Application:
    app = Application("connected-cars")
    (app.source("generator", **{**GENERATOR, "events": events})
        .map(to_metres_per_second)
        .filter(moving)
        .key_by("car")
        .window(size="60s", aggregates={"avg_speed": ("avg", "speed")})
        .sink("jsonl", path=output))
    return app


def reference(events: int = EVENTS) -> list[dict]:
    """The same computation as a plain Python loop over the same events."""
    from pescheduler.operators.sources import GeneratorSource

    source = GeneratorSource(**{**GENERATOR, "events": events})
    sums: dict = {}
    while (batch := source.read(10_000)) is not None:
        for e in batch:
            speed = e["speed"] / 3.6
            if speed > 5:
                start = e["ts"] - e["ts"] % 60_000
                acc = sums.setdefault((start, e["car"]), [0.0, 0])
                acc[0] += speed
                acc[1] += 1
    return [{"car": car, "window_start": start, "window_end": start + 60_000, "avg_speed": s / n}
            for (start, car), (s, n) in sums.items()]
