"""The /pescheduler page's data: the channels between PEs, from the placement to the Bokeh source
a browser draws (the page served by a real scheduler: tests/integration/test_dashboard.py)."""

from __future__ import annotations

from pescheduler import Application, dashboard
from pescheduler.control.state import DeploymentState
from pescheduler.control.status import channels, short_pe, status_view
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
    crossing = {(short_pe(pl.pe_of(src)), short_pe(dst_pe)) for src, _port, _dst, dst_pe in pl.channels()}
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


# -- consumer lag and checkpoints: drawn and exported from the published status ----------------------

def lagging(behind: dict[str, int], completed: int = 0, recent=(), aborted: int = 0, used: int = 0,
            in_a_row: int = 0) -> dict:
    """A status with a Kafka source at ``behind`` (partition -> records) and, given ``completed``,
    checkpoints whose newest complete ones are ``recent`` (ids)."""
    status = {"app": "lag", "state": "running", "pes": [{"pe": "kafka-1", "worker": WORKERS[0]}],
              "operators": [{"op": "kafka-1", "pe": "kafka-1", "lag": dict(behind)},
                            {"op": "map-2", "pe": "kafka-1"}]}
    if completed:
        each = [{"id": i, "time": 1000.0 + i, "duration_s": i / 100, "bytes": 100 * i, "url": f"/c/chk-{i}"}
                for i in recent]
        status["checkpoints"] = {"storage": "/c", "interval_s": 1.0, "completed": completed, "aborted": aborted,
                                 "last": {**each[-1], "age_s": 0.5}, "last_error": None, "recent": each,
                                 "restart": {"attempts": 3, "backoff_s": 1.0, "used": used, "in_a_row": in_a_row,
                                             "restarts": []}}
    return status


def test_the_lag_is_one_line_per_source_and_partition_over_the_samples_the_current_status_last():
    samples = [(1.0, {"d": lagging({"0": 50, "1": 70})}), (2.0, {"d": lagging({"0": 40, "1": 65})}),
               (3.0, {"other": lagging({"0": 1})})]                 # another deployment's sample
    [source] = dashboard.page({"d": lagging({"0": 30, "1": 60})}, samples).select({"name": "consumer-lag"})
    assert (source.data["source"], source.data["partition"]) == (["kafka-1"] * 2, ["0", "1"])
    assert source.data["ys"] == [[50, 40, 30], [70, 65, 60]]
    assert source.data["xs"][0][:2] == [1000.0, 2000.0] and source.data["label"] == ["kafka-1 0", "kafka-1 1"]


def test_no_source_with_lag_draws_no_lag_plot():
    status = {"app": "gen", "state": "running", "pes": [], "operators": [{"op": "generator-1", "pe": "g"}]}
    assert not list(dashboard.page({"d": status}, [(1.0, {"d": status})]).select({"name": "consumer-lag"}))


def test_checkpoints_over_time_each_one_once_and_the_last_in_words():
    samples = [(1.0, {"d": lagging({}, completed=2, recent=[1, 2])}),
               (2.0, {"d": lagging({}, completed=4, recent=[2, 3, 4], aborted=1)})]
    now = lagging({}, completed=5, recent=[4, 5], aborted=1, used=4, in_a_row=1)
    layout = dashboard.page({"d": now}, samples)
    [counts] = layout.select({"name": "checkpoint-counts"})
    assert counts.data["completed"] == [2, 4, 5] and counts.data["aborted"] == [0, 1, 1]
    [each] = layout.select({"name": "checkpoints"})
    assert each.data["id"] == [1, 2, 3, 4, 5]             # seen in several statuses, drawn once each
    assert each.data["duration_ms"] == [10.0, 20.0, 30.0, 40.0, 50.0]
    assert each.data["bytes"] == [100, 200, 300, 400, 500]
    assert each.data["t"][0] == (1001.0 + 0.01) * 1000     # completion: trigger time + duration
    [last] = layout.select({"name": "checkpoint-last"})
    assert "last checkpoint</b> 5:" in last.text and "aborted 1" in last.text
    assert "restarts 1 of 3 in a row (4 in all)" in last.text      # what counts against the attempts


def test_a_deployment_without_checkpoints_draws_none():
    assert not list(dashboard.page({"d": lagging({"0": 1})}, []).select({"name": "checkpoints"}))


def exported(statuses: dict[str, dict]) -> str:
    """The /metrics text the collector gives for a scheduler publishing ``statuses``."""
    import prometheus_client

    class Scheduler:          # a scheduler's metadata as install() reads it (served for real: test_dashboard.py)
        clients = {"deployer": None}            # the deploying processes connected

        def get_metadata(self, keys, default=None):
            assert keys == ["pescheduler", "deployments"]
            return statuses

    registry = prometheus_client.CollectorRegistry()
    registry.register(dashboard.PeschedulerCollector())
    scheduler = Scheduler()
    dashboard._schedulers[id(scheduler)] = scheduler
    try:
        return prometheus_client.generate_latest(registry).decode()
    finally:
        del dashboard._schedulers[id(scheduler)]


def test_metrics_export_the_lag_per_partition_the_restarts_and_the_checkpoint_figures():
    text = exported({"lag-1": lagging({"0": 30, "1": 60}, completed=7, recent=[6, 7], aborted=2, used=1)})
    assert 'pescheduler_consumer_lag{app="lag",deployment="lag-1",partition="1",source="kafka-1"} 60.0' in text
    assert 'pescheduler_restarts_total{app="lag",deployment="lag-1"} 1.0' in text
    assert 'pescheduler_checkpoints_completed_total{app="lag",deployment="lag-1"} 7.0' in text
    assert 'pescheduler_checkpoints_aborted_total{app="lag",deployment="lag-1"} 2.0' in text
    assert 'pescheduler_checkpoint_last_duration_seconds{app="lag",deployment="lag-1"} 0.07' in text
    assert 'pescheduler_checkpoint_last_bytes{app="lag",deployment="lag-1"} 700.0' in text
    assert 'pescheduler_checkpoint_last_timestamp_seconds{app="lag",deployment="lag-1"} 1007.07' in text


def test_without_checkpoints_restarts_are_zero_and_no_checkpoint_figure_is_exported():
    text = exported({"gen-1": {"app": "gen", "state": "running", "pes": [], "operators": []}})
    assert 'pescheduler_restarts_total{app="gen",deployment="gen-1"} 0.0' in text
    assert "pescheduler_checkpoint_last_bytes{" not in text and "pescheduler_consumer_lag{" not in text
    assert "pescheduler_checkpoints_completed_total{" not in text


def test_the_timeline_spans_the_run_when_every_event_came_at_the_start():
    """Issue 36: events all in the first milliseconds squashed the axis to a few ms."""
    status = {"app": "edges", "state": "running", "elapsed_s": 120.0, "pes": [], "channels": [],
              "events": [{"t": 0.001, "kind": "deploy", "text": "2 PEs"}, {"t": 0.004, "kind": "policy", "text": "x"}]}
    [plot] = dashboard.page({"dep-1": status}, []).select({"name": "timeline"})
    assert (plot.x_range.start, plot.x_range.end) == (0, 120.0 * 1.02)


def test_a_running_status_whose_deploying_client_left_is_lost_and_ended():
    """A SIGKILLed deploying process never publishes its end: its status read `running` for good on
    the page, in `list --cluster` and to the claims. Its client has left the scheduler: it is lost."""
    from pescheduler.control.claims import running_published, with_lost

    published = {"a": {"state": "running", "client": "gone", "name": "a"},
                 "b": {"state": "running", "client": "here", "name": "b"},
                 "c": {"state": "running", "name": "c"},              # published before statuses named their client
                 "d": {"state": "finished", "client": "gone", "name": "d"}}
    marked = with_lost(published, {"here"})
    assert {k: s["state"] for k, s in marked.items()} == {"a": "lost", "b": "running", "c": "running", "d": "finished"}
    assert "has left the scheduler" in marked["a"]["error"]
    assert [s["name"] for s in running_published(marked)] == ["b", "c"]
    running, ended = dashboard.live(marked)
    assert sorted(running) == ["b", "c"] and [k for k, _ in ended] == ["a", "d"]


def test_metrics_export_each_pe_s_state_and_the_state_the_last_checkpoint_references():
    """A PE without a figure (none of its checkpoints complete yet) is left out, not exported as 0."""
    status = lagging({}, completed=2, recent=[1, 2])
    status["checkpoints"]["last"]["state_bytes"] = 5_000
    status["pes"] = [{"pe": "kafka-1", "worker": WORKERS[0], "state_bytes": 4_000},
                     {"pe": "map-2", "worker": WORKERS[0], "state_bytes": None}]
    text = exported({"lag-1": status})
    assert 'pescheduler_checkpoint_last_state_bytes{app="lag",deployment="lag-1"} 5000.0' in text
    assert f'pescheduler_pe_state_bytes{{app="lag",deployment="lag-1",pe="kafka-1",worker="{WORKERS[0]}"}} 4000.0' in text
    assert 'pe="map-2"' not in text.split("pescheduler_pe_state_bytes", 1)[1].split("# HELP", 1)[0]
    [last] = dashboard.page({"d": status}, []).select({"name": "checkpoint-last"})
    assert "wrote 200 B of 4.88 kiB of state" in last.text
