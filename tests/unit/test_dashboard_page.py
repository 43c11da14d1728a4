"""The /pescheduler page's data: the channels between PEs, from the placement to the Bokeh source
a browser draws (the page served by a real scheduler: tests/integration/test_dashboard.py)."""

from __future__ import annotations

from pescheduler import Application, dashboard
from pescheduler.control.state import DeploymentState
from pescheduler.control.status import channels, status_view
from pescheduler.plan.compiler import compile_app
from pescheduler.plugins import load_plugins

WORKERS = ("tcp://127.0.0.1:1001", "tcp://127.0.0.1:1002", "tcp://127.0.0.1:1003")


def placement():
    app = Application("edges")
    (app.source("iterable", items=[{"car": 1, "ts": 1}])
        .map(lambda e: e)
        .key_by("car")
        .window(size="1s", aggregates={"n": ("count", "car")})
        .sink("print"))
    return compile_app(app, load_plugins(), list(WORKERS), {w: "h0" for w in WORKERS})


def test_the_status_lists_one_channel_per_pe_pair_that_exchanges_tuples():
    pl = placement()
    crossing = {(pl.pe_of(src), dst_pe) for src, _port, _dst, dst_pe in pl.channels()}
    listed = channels(pl)
    assert len(pl.pes) >= 2 and crossing
    assert {(c["from"], c["to"]) for c in listed} == crossing
    assert all(c["edges"] and all("->" in e for e in c["edges"]) for c in listed)
    assert status_view("edges", DeploymentState(), None, pl, 0)["channels"] == listed


def test_the_page_draws_a_segment_from_box_to_box_for_every_channel():
    status = {"app": "edges", "state": "running", "pes": [
        {"pe": "a", "worker": WORKERS[0], "operators": ["a"]},
        {"pe": "b", "worker": WORKERS[0], "operators": ["b"]},
        {"pe": "c", "worker": WORKERS[1], "operators": ["c"]}],
        "channels": [{"from": "a", "to": "c", "edges": ["a->c"]}, {"from": "b", "to": "c", "edges": ["b->c"]},
                     {"from": "gone", "to": "c", "edges": ["gone->c"]}]}      # a PE no longer placed
    [source] = dashboard.page({"dep-1": status}, []).select({"name": "pe-edges"})
    assert source.data["from"] == ["a", "b"] and source.data["to"] == ["c", "c"]
    assert list(zip(source.data["x0"], source.data["y0"])) == [(0, WORKERS[0]), (1, WORKERS[0])]
    assert list(zip(source.data["x1"], source.data["y1"])) == [(0, WORKERS[1])] * 2
    assert source.data["edges"] == ["a->c", "b->c"]


def test_a_status_without_channels_draws_none():
    status = {"app": "old", "state": "running", "pes": [{"pe": "a", "worker": WORKERS[0]}]}
    [source] = dashboard.page({"dep-1": status}, []).select({"name": "pe-edges"})
    assert source.data["from"] == []
