"""``/pescheduler`` on the Dask dashboard, and ``pescheduler_*`` metrics on its ``/metrics``.

Both live in the scheduler's own web server, through distributed's extension
points, so there is no second server and the page is where Dask users look:

- this module is an entry of ``distributed.scheduler.http.routes`` (its
  ``routes`` list adds the page handler), and
- :func:`install` (called by the embedded cluster; for another cluster, start
  the scheduler with ``--preload pescheduler.dashboard``, which calls
  :func:`dask_setup`) samples what deployments publish on the scheduler
  (``pescheduler/deployments`` metadata) every second into a bounded history
  and registers a prometheus_client collector, as distributed's own
  extensions add theirs (distributed/http/scheduler/prometheus/).

The page is a Bokeh document (the library of distributed's own pages) built
from that history on each request and refreshed by the browser every few
seconds: placement of PEs on workers with the channels between them, busy /
backpressure / input rate per PE over time, and the events and decisions as a timeline.
"""

from __future__ import annotations

import time
from collections import deque

from distributed.http.utils import RequestHandler
from tornado.ioloop import PeriodicCallback

HISTORY = 300           # samples kept per scheduler (one a second: five minutes)
REFRESH_S = 3           # the page reloads itself this often
_history: dict[int, deque] = {}     # id(scheduler) -> (time, {deployment id: status})
_schedulers: dict[int, object] = {}


def published(scheduler) -> dict[str, dict]:
    """Every deployment's last published status on ``scheduler``."""
    return dict(scheduler.get_metadata(["pescheduler", "deployments"], default=None) or {})


def install(scheduler) -> None:
    """Sample this scheduler's deployments every second and serve their metrics (once per scheduler)."""
    if id(scheduler) in _schedulers:
        return
    _schedulers[id(scheduler)] = scheduler
    samples = _history.setdefault(id(scheduler), deque(maxlen=HISTORY))
    callback = PeriodicCallback(lambda: samples.append((time.time(), published(scheduler))), 1000)
    scheduler.periodic_callbacks["pescheduler-dashboard"] = callback
    callback.start()
    _register_collector()


def dask_setup(scheduler) -> None:
    """``dask scheduler --preload pescheduler.dashboard``: the page and metrics on that scheduler."""
    install(scheduler)


# -- Prometheus --------------------------------------------------------------------------------

_registered = False


class PeschedulerCollector:
    """``pescheduler_*`` metrics of every deployment on the schedulers this process serves."""

    def collect(self):
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        pe_labels = ["deployment", "app", "pe", "worker"]
        gauges = {name: GaugeMetricFamily(f"pescheduler_pe_{name}", text, labels=pe_labels) for name, text in (
            ("tuples_in_per_second", "Tuples a PE took in per second, last monitor window"),
            ("tuples_out_per_second", "Tuples a PE emitted per second, last monitor window"),
            ("busy", "Fraction of a core a PE spent in operator code"),
            ("backpressure", "Fraction of time a PE was blocked on downstream credit"),
            ("queue_batches", "Input batches waiting at a PE"))}
        dead = CounterMetricFamily("pescheduler_dead_letters", "Tuples an operator raised on",
                                   labels=["deployment", "app"])
        late = CounterMetricFamily("pescheduler_late_events", "Events later than the allowed delay",
                                   labels=["deployment", "app"])
        running = GaugeMetricFamily("pescheduler_deployment_running", "1 while the deployment runs",
                                    labels=["deployment", "app", "state"])
        decisions = GaugeMetricFamily("pescheduler_decisions", "Policy decisions among the kept events, by "
                                      "outcome", labels=["deployment", "app", "outcome"])
        for scheduler in list(_schedulers.values()):
            for dep_id, status in published(scheduler).items():
                app = str(status.get("app", ""))
                for pe in status.get("pes", ()):
                    labels = [dep_id, app, str(pe.get("pe", "")), str(pe.get("worker", ""))]
                    gauges["tuples_in_per_second"].add_metric(labels, float(pe.get("tuples_in_per_s") or 0))
                    gauges["tuples_out_per_second"].add_metric(labels, float(pe.get("tuples_out_per_s") or 0))
                    gauges["busy"].add_metric(labels, float(pe.get("busy") or 0))
                    gauges["backpressure"].add_metric(labels, float(pe.get("backpressure") or 0))
                    gauges["queue_batches"].add_metric(labels, float(pe.get("queue_batches") or 0))
                dead.add_metric([dep_id, app], float(status.get("dead_letters") or 0))
                late.add_metric([dep_id, app], float(status.get("late_events") or 0))
                state = str(status.get("state", ""))
                running.add_metric([dep_id, app, state], 1.0 if state in ("starting", "running") else 0.0)
                for outcome, n in _decision_counts(status).items():
                    decisions.add_metric([dep_id, app, outcome], float(n))
        yield from (*gauges.values(), dead, late, running, decisions)


def _decision_counts(status: dict) -> dict[str, int]:
    from .liveview import decision_counts

    return decision_counts(status)


def _register_collector() -> None:
    global _registered
    if not _registered:
        import prometheus_client

        prometheus_client.REGISTRY.register(PeschedulerCollector())
        _registered = True


# -- the page ----------------------------------------------------------------------------------

class PeschedulerPage(RequestHandler):
    """``GET /pescheduler``: the Bokeh page of every deployment on this scheduler."""

    def get(self) -> None:
        from bokeh.embed import file_html
        from bokeh.resources import INLINE

        install(self.server)            # a scheduler started without it still gets the page
        samples = list(_history.get(id(self.server), ()))
        now = published(self.server)
        html = file_html(page(now, samples), INLINE, title="pescheduler")
        refresh = f'<meta http-equiv="refresh" content="{REFRESH_S}">'
        self.write(html.replace("<head>", "<head>\n" + refresh, 1))


def page(now: dict[str, dict], samples: list) -> object:
    """The Bokeh layout: per deployment, placement, figures over time, the event timeline."""
    from bokeh.layouts import column
    from bokeh.models import Div

    parts = [Div(text="<h2>pescheduler</h2>" + ("" if now else
                                                  "<p>No deployment has published status on this scheduler.</p>"))]
    for dep_id, status in sorted(now.items()):
        parts.append(Div(text=f"<h3>{_esc(status.get('app', ''))} <small>{_esc(dep_id)} — "
                              f"{_esc(status.get('state', ''))}, {float(status.get('elapsed_s') or 0):.0f} s, "
                              f"dead letters {int(status.get('dead_letters') or 0)}</small></h3>"))
        parts += [placement_plot(status), *series_plots(dep_id, samples), timeline_plot(status)]
    return column(*parts, sizing_mode="stretch_width")


def placement_plot(status: dict):
    """Each PE a box at its worker's row, named, coloured by how busy it is; the channels between
    PEs as lines from box to box (drawn first, so the boxes sit on top)."""
    from bokeh.models import ColumnDataSource, HoverTool, LabelSet
    from bokeh.plotting import figure

    pes = list(status.get("pes", ()))
    workers = sorted({str(pe.get("worker", "")) for pe in pes}) or [""]
    column_of: dict[str, int] = {}
    data = {"x": [], "y": [], "pe": [], "operators": [], "busy": [], "colour": []}
    for pe in pes:
        worker = str(pe.get("worker", ""))
        column_of[worker] = column_of.get(worker, -1) + 1
        busy = float(pe.get("busy") or 0)
        data["x"].append(column_of[worker])
        data["y"].append(worker)
        data["pe"].append(str(pe.get("pe", "")))
        data["operators"].append(", ".join(pe.get("operators", ())))
        data["busy"].append(busy)
        data["colour"].append("#d62728" if busy >= 0.8 else "#ff7f0e" if busy >= 0.3 else "#2ca02c")
    source = ColumnDataSource(data)
    width = max(column_of.values(), default=0) + 1
    plot = figure(title="placement: PEs on workers, channels between them (colour: busy)", y_range=workers,
                  x_range=(-0.5, width - 0.5), height=80 + 60 * len(workers), sizing_mode="stretch_width",
                  tools="", toolbar_location=None, name="placement")
    plot.segment("x0", "y0", "x1", "y1", source=edge_source(status, data), line_color="#555555",
                 line_width=2, line_alpha=0.6)
    plot.rect("x", "y", width=0.9, height=0.6, source=source, fill_color="colour", fill_alpha=0.35,
              line_color="colour")
    plot.add_layout(LabelSet(x="x", y="y", text="pe", source=source, text_align="center",
                             text_baseline="middle", text_font_size="11px", name="pe-labels"))
    plot.add_tools(HoverTool(tooltips=[("PE", "@pe"), ("operators", "@operators"), ("busy", "@busy{0%}")]))
    plot.xaxis.visible = False
    return plot


def edge_source(status: dict, boxes: dict):
    """The channels of ``status`` as segments between the PE boxes at ``boxes`` (``pe``, ``x``, ``y``),
    a ColumnDataSource named ``pe-edges`` (``from``, ``to``, ``edges``: what a browser draws)."""
    from bokeh.models import ColumnDataSource

    at = {pe: (x, y) for pe, x, y in zip(boxes["pe"], boxes["x"], boxes["y"])}
    data: dict[str, list] = {"from": [], "to": [], "edges": [], "x0": [], "y0": [], "x1": [], "y1": []}
    for channel in status.get("channels", ()):
        a, b = str(channel.get("from", "")), str(channel.get("to", ""))
        if a in at and b in at:
            for name, value in (("from", a), ("to", b), ("edges", ", ".join(channel.get("edges", ()))),
                                ("x0", at[a][0]), ("y0", at[a][1]), ("x1", at[b][0]), ("y1", at[b][1])):
                data[name].append(value)
    return ColumnDataSource(data, name="pe-edges")


def series_plots(dep_id: str, samples: list) -> list:
    """Busy, backpressure and input rate per PE over the sampled history."""
    from bokeh.palettes import Category10_10
    from bokeh.plotting import figure

    series: dict[str, dict[str, list]] = {}
    for t, statuses in samples:
        for pe in statuses.get(dep_id, {}).get("pes", ()):
            s = series.setdefault(str(pe.get("pe", "")), {"t": [], "busy": [], "backpressure": [], "in": []})
            s["t"].append(t * 1000)
            s["busy"].append(float(pe.get("busy") or 0))
            s["backpressure"].append(float(pe.get("backpressure") or 0))
            s["in"].append(float(pe.get("tuples_in_per_s") or 0))
    plots = []
    for field, title in (("busy", "busy (fraction of a core)"), ("backpressure", "backpressure"),
                         ("in", "tuples in per second")):
        plot = figure(title=title, x_axis_type="datetime", height=220, sizing_mode="stretch_width",
                      tools="pan,wheel_zoom,reset", name=f"series-{field}")
        for i, (pe, s) in enumerate(sorted(series.items())):
            plot.line(s["t"], s[field], legend_label=pe, color=Category10_10[i % 10], line_width=2)
        if series:
            plot.legend.location, plot.legend.label_text_font_size = "top_left", "9px"
        plots.append(plot)
    return plots


def timeline_plot(status: dict):
    """Events (deploy, reconfigure, policy decisions, failures) at their time, text on hover."""
    from bokeh.models import ColumnDataSource, HoverTool
    from bokeh.plotting import figure

    events = list(status.get("events", ()))
    kinds = sorted({str(e.get("kind", "")) for e in events}) or [""]
    source = ColumnDataSource({"t": [float(e.get("t") or 0) for e in events],
                               "kind": [str(e.get("kind", "")) for e in events],
                               "text": [str(e.get("text", "")) for e in events]})
    plot = figure(title="events and decisions (seconds since the start)", y_range=kinds,
                  height=60 + 40 * len(kinds), sizing_mode="stretch_width", tools="pan,wheel_zoom,reset",
                  name="timeline")
    plot.scatter("t", "kind", source=source, size=10, marker="diamond")
    plot.add_tools(HoverTool(tooltips=[("t", "@t{0.0} s"), ("", "@text")]))
    return plot


def _esc(text) -> str:
    import html

    return html.escape(str(text))


routes = [("/pescheduler", PeschedulerPage, {})]
