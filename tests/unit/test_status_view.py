"""``status`` stays small as apps grow (issue 36): a PE is named by its first operator in every row,
its full id (every operator joined by ``->``) once, as its ``name``."""

from __future__ import annotations

import json

from pescheduler import Application
from pescheduler.metrics import MetricsSnapshot, OperatorMetrics
from pescheduler.control.state import DeploymentState
from pescheduler.control.status import status_view
from pescheduler.plan.compiler import compile_app
from pescheduler.plugins import load_plugins

WORKERS = ("tcp://127.0.0.1:1001", "tcp://127.0.0.1:1002")


def status_of(maps: int) -> dict:
    app = Application("long")
    stream = app.source("iterable", items=[1])
    for _ in range(maps):
        stream = stream.map(lambda t: t)
    stream.sink("print")
    placement = compile_app(app, load_plugins(), list(WORKERS), {w: "h0" for w in WORKERS})
    snap = MetricsSnapshot(0.0, 1.0, operators={op: OperatorMetrics(op, placement.pe_of(op))
                                                 for op in app.nodes})
    return status_view("long", DeploymentState(), snap, placement, 0)


def test_the_status_grows_linearly_with_the_operators():
    small, large = (len(json.dumps(status_of(n))) for n in (10, 200))
    assert large / small < 200 / 10 * 1.2, (small, large)      # was 300 KB at 200: the square


def test_a_pe_is_named_once_and_referred_to_by_its_first_operator():
    status = status_of(3)
    fused = next(pe for pe in status["pes"] if len(pe["operators"]) > 1)
    assert fused["pe"] == fused["operators"][0] and fused["name"] == "->".join(fused["operators"])
    assert {op["pe"] for op in status["operators"]} == {pe["pe"] for pe in status["pes"]}
    assert all(c["from"] in {pe["pe"] for pe in status["pes"]} for c in status["channels"])


TRACEBACK = '''Traceback (most recent call last):
  File "{pkg}/worker/chain.py", line 443, in _isolate
    process([item], one)
  File "<pescheduler.aggregates expr map 77f7a1a2>", line 6, in run
    t = f0(t)
  File "<dynamic-code>", line 5, in speed_kmh
ZeroDivisionError: division by zero
'''


def test_a_dead_letter_is_read_at_the_apps_own_line():
    import os

    import pescheduler
    from pescheduler.control.failures import readable

    error = TRACEBACK.format(pkg=os.path.dirname(pescheduler.__file__))
    seen = readable({"op": "map-2", "item": {"car": "car-25"}, "error": error}, "/home/me/cars.py")
    assert seen == {"op": "map-2", "type": "ZeroDivisionError", "message": "division by zero",
                    "where": "/home/me/cars.py:5", "sample": "{'car': 'car-25'}"}
    assert readable({"op": "jsonl-1", "item": b"x", "error": "not JSON"})["message"] == "not JSON"


def test_the_dashboard_shows_each_operators_first_error():
    from pescheduler import dashboard

    status = {"app": "cars", "state": "running", "pes": [], "channels": [],
              "errors": [{"op": "map-2", "type": "ZeroDivisionError", "message": "division by zero",
                          "where": "/home/me/cars.py:5", "sample": "{'car': 'car-25'}", "count": 7}]}
    [div] = dashboard.page({"dep-1": status}, []).select({"name": "errors"})
    assert "map-2" in div.text and "ZeroDivisionError: division by zero at /home/me/cars.py:5" in div.text
    assert "×7" in div.text and "car-25" in div.text
