"""Connected cars, columnar: the same app as ``connected_cars.py`` on Arrow record batches.

Run it on the embedded default (a LocalCluster with one worker per core)::

    python -m pescheduler deploy examples/connected_cars_columnar.py

The generator yields ``pyarrow.RecordBatch`` es (``columnar=True``: the very
events of the per-tuple app, bit for bit); the map and the filter are ``col``
expressions, which run as ``pyarrow.compute`` kernels on whole batches; the
window aggregates each batch with numpy. Nothing is turned into Python dicts
until the sink writes ``out/avg_speed_columnar.jsonl``, which holds exactly the
lines of ``connected_cars.py``'s output (the tests compare them).
"""

from pescheduler import Application, col

EVENTS = 2_000_000
GENERATOR = dict(events=EVENTS, keys=10_000, seed=7)
OUTPUT = "out/avg_speed_columnar.jsonl"


def build(events: int = EVENTS, output: str = OUTPUT) -> Application:
    app = Application("connected-cars-columnar")
    (app.source("generator", columnar=True, **{**GENERATOR, "events": events})
        .map(speed=col("speed") / 3.6)
        .filter(col("speed") > 5)
        .key_by("car")
        .window(size="60s", aggregates={"avg_speed": ("avg", "speed")})
        .sink("jsonl", path=output))
    return app
