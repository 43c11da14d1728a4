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
from that history on each request, in a thread (the scheduler's event loop
goes on answering meanwhile), and refreshed by the browser every few seconds.
Its cost is bounded whatever was ever published: only live deployments are
sampled and drawn (at most ``pescheduler.dashboard.live-drawn``), the newest
``dashboard.ended-listed`` ended ones are one line each, older ones a count.
A live deployment shows: placement of PEs on workers with the channels between them, busy /
backpressure / input rate per PE over time, the consumer lag of broker sources
per partition over time, checkpoints (completed and aborted over time, the
duration and size of each, the last one) and the events and decisions as a timeline.
Everything drawn or exported is read from the published status (docs/status.md).
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import deque

from distributed.http.utils import RequestHandler
from tornado.ioloop import PeriodicCallback

from . import config
from .redact import redact

HISTORY = 300           # samples kept per scheduler (one a second: five minutes)
REFRESH_S = 3           # the page reloads itself this often, once drawn
RELOAD = """<script>
// Reload every few seconds, but only once Bokeh has drawn every plot (its documents are idle): a
// fixed refresh (<meta http-equiv="refresh">) reloaded a loaded machine's browser before it had
// drawn anything, so the page stayed blank.
(function () {
  function reload_when_drawn() {
    const docs = (window.Bokeh && window.Bokeh.documents) || [];
    if (docs.length > 0 && docs.every((doc) => doc.is_idle)) { window.location.reload(); }
    else { window.setTimeout(reload_when_drawn, 500); }
  }
  window.setTimeout(reload_when_drawn, REFRESH_MS);
})();
</script>"""
_history: dict[int, deque] = {}     # id(scheduler) -> (time, {deployment id: status})
_schedulers: dict[int, object] = {}


def published(scheduler) -> dict[str, dict]:
    """Every deployment's last published status on ``scheduler``."""
    from .control.claims import with_lost

    return with_lost(scheduler.get_metadata(["pescheduler", "deployments"], default=None) or {},
                     set(scheduler.clients))


def install(scheduler) -> None:
    """Sample this scheduler's deployments every second and serve their metrics (once per scheduler)."""
    if id(scheduler) in _schedulers:
        return
    _schedulers[id(scheduler)] = scheduler
    samples = _history.setdefault(id(scheduler), deque(maxlen=HISTORY))
    callback = PeriodicCallback(lambda: samples.append((time.time(), live(published(scheduler))[0])), 1000)
    scheduler.periodic_callbacks["pescheduler-dashboard"] = callback
    callback.start()
    _register_collector()


def _live_schedulers() -> list:
    """The schedulers still serving; closed ones are forgotten (a process that deployed on an
    embedded cluster before kept exporting that finished deployment's metrics)."""
    from distributed.core import Status

    live = []
    for key, scheduler in list(_schedulers.items()):
        if getattr(scheduler, "status", None) in (Status.closing, Status.closed, Status.failed):
            _schedulers.pop(key, None)
            _history.pop(key, None)
        else:
            live.append(scheduler)
    return live


def dask_setup(scheduler) -> None:
    """``dask scheduler --preload pescheduler.dashboard``: the page and metrics on that scheduler.

    A preload starts after the scheduler built its web routes from
    ``distributed.scheduler.http.routes``, so the page's route is added to the running web
    application here (without it ``/pescheduler`` was a 404 there, /metrics alone worked)."""
    import dask.config
    from distributed.http.utils import get_handlers

    install(scheduler)
    application = getattr(scheduler, "http_application", None)
    if application is not None and __name__ not in dask.config.get("distributed.scheduler.http.routes"):
        application.add_handlers(r".*$", get_handlers(scheduler, [__name__]))


# -- Prometheus --------------------------------------------------------------------------------

_registered = False


class PeschedulerCollector:
    """``pescheduler_*`` metrics of every deployment on the schedulers this process serves: one
    family per entry of :data:`METRICS`, labelled ``deployment`` and ``app`` and the entry's own."""

    def collect(self):
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        statuses = [(dep_id, str(status.get("app", "")), status) for scheduler in _live_schedulers()
                    for dep_id, status in published(scheduler).items()]
        for kind, name, text, labels, rows in METRICS:
            family = (CounterMetricFamily if kind == "counter" else GaugeMetricFamily)(
                name, text, labels=["deployment", "app", *labels])
            for dep_id, app, status in statuses:
                for values, figure in rows(status):
                    family.add_metric([dep_id, app, *values], float(figure or 0))
            yield family


def _per_pe(field: str):
    return lambda status: [((str(pe.get("pe", "")), str(pe.get("worker", ""))), pe.get(field))
                           for pe in status.get("pes", ())]


def _state(status: dict) -> list:
    state = str(status.get("state", ""))
    return [((state,), 1.0 if state in ("starting", "running") else 0.0)]


def _checkpoint(name: str):
    return lambda status: [((), figure) for key, figure in checkpoint_figures(status).items() if key == name]


METRICS = (     # (kind, name (a counter's gets _total), help, labels beyond deployment and app, rows of a status)
    ("gauge", "pescheduler_pe_tuples_in_per_second", "Tuples a PE took in per second, last monitor window",
     ["pe", "worker"], _per_pe("tuples_in_per_s")),
    ("gauge", "pescheduler_pe_tuples_out_per_second", "Tuples a PE emitted per second, last monitor window",
     ["pe", "worker"], _per_pe("tuples_out_per_s")),
    ("gauge", "pescheduler_pe_busy", "Fraction of a core a PE spent in operator code", ["pe", "worker"],
     _per_pe("busy")),
    ("gauge", "pescheduler_pe_backpressure", "Fraction of time a PE was blocked on downstream credit",
     ["pe", "worker"], _per_pe("backpressure")),
    ("gauge", "pescheduler_pe_queue_batches", "Input batches waiting at a PE", ["pe", "worker"],
     _per_pe("queue_batches")),
    ("gauge", "pescheduler_pe_state_bytes", "State a PE referenced at the last complete checkpoint (PEs without "
     "one are left out)", ["pe", "worker"],
     lambda status: [row for row in _per_pe("state_bytes")(status) if row[1] is not None]),
    ("counter", "pescheduler_dead_letters", "Tuples an operator raised on", [],
     lambda status: [((), status.get("dead_letters"))]),
    ("counter", "pescheduler_late_events", "Events later than the allowed delay", [],
     lambda status: [((), status.get("late_events"))]),
    ("gauge", "pescheduler_deployment_running", "1 while the deployment runs", ["state"], _state),
    ("gauge", "pescheduler_decisions", "Policy decisions among the kept events, by outcome", ["outcome"],
     lambda status: [((outcome,), n) for outcome, n in _decision_counts(status).items()]),
    ("gauge", "pescheduler_consumer_lag", "Records (Kafka) or entries (Redis) a broker source is behind, "
     "per partition", ["source", "partition"],
     lambda status: [((source, partition), behind) for source, partition, behind in lag_rows(status)]),
    ("counter", "pescheduler_restarts", "Restores from a checkpoint after a lost worker", [],
     lambda status: [((), ((status.get("checkpoints") or {}).get("restart") or {}).get("used"))]),
    ("counter", "pescheduler_checkpoints_completed", "Checkpoints completed", [],
     _checkpoint("checkpoints_completed")),
    ("counter", "pescheduler_checkpoints_aborted", "Checkpoints aborted", [], _checkpoint("checkpoints_aborted")),
    ("gauge", "pescheduler_checkpoint_last_duration_seconds", "The last complete checkpoint: trigger to commit",
     [], _checkpoint("checkpoint_last_duration_seconds")),
    ("gauge", "pescheduler_checkpoint_last_bytes", "The last complete checkpoint: bytes it wrote", [],
     _checkpoint("checkpoint_last_bytes")),
    ("gauge", "pescheduler_checkpoint_last_state_bytes", "The last complete checkpoint: the state it references "
     "(earlier checkpoints' files too)", [], _checkpoint("checkpoint_last_state_bytes")),
    ("gauge", "pescheduler_checkpoint_last_timestamp_seconds", "The last complete checkpoint: when it completed "
     "(unix time)", [], _checkpoint("checkpoint_last_timestamp_seconds")),
)


def lag_rows(status: dict) -> list[tuple[str, str, int]]:
    """``(source, partition, behind)`` of every broker source in ``status`` (operators with ``lag``:
    Kafka partitions, Redis streams), sorted."""
    return sorted((str(op.get("op", "")), str(partition), int(behind or 0))
                  for op in status.get("operators", ()) for partition, behind in (op.get("lag") or {}).items())


def checkpoint_figures(status: dict) -> dict[str, float]:
    """The checkpoint metrics of ``status`` by metric name (without ``pescheduler_``); empty when the
    deployment takes no checkpoints, the ``last`` ones only once one is complete."""
    ckpt = status.get("checkpoints")
    if not ckpt:
        return {}
    figures = {"checkpoints_completed": float(ckpt.get("completed") or 0),
               "checkpoints_aborted": float(ckpt.get("aborted") or 0)}
    last = ckpt.get("last")
    if last:
        figures.update(checkpoint_last_duration_seconds=float(last["duration_s"]),
                       checkpoint_last_bytes=float(last["bytes"]),
                       checkpoint_last_state_bytes=float(last.get("state_bytes") or 0),
                       checkpoint_last_timestamp_seconds=float(last["time"]) + float(last["duration_s"]))
    return figures


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

    async def get(self) -> None:
        install(self.server)            # a scheduler started without it still gets the page
        samples = list(_history.get(id(self.server), ()))
        now = published(self.server)
        html = await asyncio.to_thread(render, now, samples)     # off the scheduler's event loop
        self.write(html.replace("<head>", "<head>\n" + RELOAD.replace("REFRESH_MS", str(REFRESH_S * 1000)), 1))


# Held while a thread imports bokeh or renders with it: bokeh imported from two threads at once
# (this page and the embedded cluster attaching Dask's pages, control/cluster.py) breaks its models.
BOKEH_LOCK = threading.Lock()


def render(now: dict[str, dict], samples: list) -> str:
    """The page's HTML (Bokeh inline)."""
    with BOKEH_LOCK:
        from bokeh.embed import file_html
        from bokeh.resources import INLINE

        return file_html(page(now, samples), INLINE, title="pescheduler")


ENDED = ("stopped", "finished", "failed", "lost")


def live(now: dict[str, dict]) -> tuple[dict[str, dict], list[tuple[str, dict]]]:
    """``(live deployments, ended ones oldest first)`` of what was published (in publishing order)."""
    running = {dep_id: s for dep_id, s in now.items() if s.get("state") not in ENDED}
    return running, [(dep_id, s) for dep_id, s in now.items() if s.get("state") in ENDED]


def page(now: dict[str, dict], samples: list) -> object:
    """The Bokeh layout: per live deployment, placement, figures over time, the event timeline;
    the newest ended ones a line each (see the module docstring for the bounds)."""
    from bokeh.layouts import column
    from bokeh.models import Div

    running, ended = live(now)
    drawn = dict(sorted(running.items())[:int(config.get("dashboard.live-drawn"))])
    parts = [Div(text="<h2>pescheduler</h2>" + ("" if now else
                                                  "<p>No deployment has published status on this scheduler.</p>"))]
    parts += _not_drawn(running, drawn, ended, int(config.get("dashboard.ended-listed")))
    for dep_id, status in drawn.items():
        parts.append(Div(text=f"<h3>{_esc(status.get('app', ''))} <small>{_esc(dep_id)} — "
                              f"{_esc(status.get('state', ''))}, {float(status.get('elapsed_s') or 0):.0f} s, "
                              f"dead letters {int(status.get('dead_letters') or 0)}</small></h3>"))
        parts += [*errors_div(status), placement_plot(status), *series_plots(dep_id, samples), *lag_plots(dep_id, samples, status),
                  *checkpoint_plots(dep_id, samples, status), timeline_plot(status)]
    return column(*parts, sizing_mode="stretch_width")


def errors_div(status: dict) -> list:
    """The first exception of each operator that dead-lettered (none: nothing drawn)."""
    from bokeh.models import Div

    rows = "".join(f"<li><b>{_esc(e.get('op', ''))}</b> ×{int(e.get('count') or 0)}: "
                   f"{_esc(e.get('type', ''))}: {_esc(e.get('message', ''))} at {_esc(e.get('where', ''))}"
                   f"<br><code>{_esc(e.get('sample', ''))}</code></li>" for e in status.get("errors") or ())
    return [Div(text=f"<p>First error per operator:</p><ul>{rows}</ul>", name="errors")] if rows else []


def _not_drawn(running: dict, drawn: dict, ended: list, listed: int) -> list:
    """One line per ended deployment (the newest ``listed``), a count of the rest and of live
    deployments beyond those drawn."""
    from bokeh.models import Div

    lines = [f"<li>{_esc(s.get('app', ''))} <small>{_esc(dep_id)} — {_esc(s.get('state', ''))}, "
             f"{float(s.get('elapsed_s') or 0):.0f} s, dead letters {int(s.get('dead_letters') or 0)}"
             f"{': ' + _esc(str(s.get('error') or '').splitlines()[0]) if s.get('error') else ''}</small></li>"
             for dep_id, s in reversed(ended[-listed:] if listed else [])]
    more = [f"{len(ended) - len(lines)} older ended deployments not shown"] * (len(ended) > len(lines)) + \
        [f"{len(running) - len(drawn)} more live deployments not drawn"] * (len(running) > len(drawn))
    text = (f"<h3>ended</h3><ul>{''.join(lines)}</ul>" if lines else "") + "".join(f"<p>{m}</p>" for m in more)
    return [Div(text=text, name="ended")] if text else []


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


def lag_series(dep_id: str, samples: list, status: dict) -> dict[tuple[str, str], tuple[list, list]]:
    """``(source, partition) -> (times in ms, records behind)`` over the samples, the current status last."""
    series: dict[tuple[str, str], tuple[list, list]] = {}
    for t, one in [*((t, s.get(dep_id, {})) for t, s in samples), (time.time(), status)]:
        for source, partition, behind in lag_rows(one):
            ts, ys = series.setdefault((source, partition), ([], []))
            ts.append(t * 1000)
            ys.append(behind)
    return series


def lag_plots(dep_id: str, samples: list, status: dict) -> list:
    """Consumer lag per source and partition over time (one line each, in a ColumnDataSource named
    ``consumer-lag``); none when no source reports lag."""
    from bokeh.models import ColumnDataSource
    from bokeh.palettes import Category10_10
    from bokeh.plotting import figure

    series = lag_series(dep_id, samples, status)
    if not series:
        return []
    keys = sorted(series)
    source = ColumnDataSource({"source": [s for s, _ in keys], "partition": [p for _, p in keys],
                               "label": [f"{s} {p}" for s, p in keys], "xs": [series[k][0] for k in keys],
                               "ys": [series[k][1] for k in keys],
                               "colour": [Category10_10[i % 10] for i in range(len(keys))]}, name="consumer-lag")
    plot = figure(title="consumer lag (records or entries behind, per source and partition)",
                  x_axis_type="datetime", height=220, sizing_mode="stretch_width", tools="pan,wheel_zoom,reset",
                  name="series-lag")
    plot.multi_line("xs", "ys", source=source, line_color="colour", line_width=2, legend_field="label")
    plot.legend.location, plot.legend.label_text_font_size = "top_left", "9px"
    return [plot]


def checkpoint_history(dep_id: str, samples: list, status: dict) -> tuple[dict, dict]:
    """Checkpoints over the samples: ``counts`` (``t`` in ms, ``completed``, ``aborted`` at each
    sample, the current status last) and ``each`` (one entry per complete checkpoint seen in a
    status's ``recent`` or ``last``, by id: ``id``, ``t`` completion in ms, ``duration_ms``, ``bytes``)."""
    counts: dict[str, list] = {"t": [], "completed": [], "aborted": []}
    seen: dict[int, dict] = {}
    for t, ckpt in [*((t, s.get(dep_id, {}).get("checkpoints")) for t, s in samples),
                    (time.time(), status.get("checkpoints"))]:
        if not ckpt:
            continue
        counts["t"].append(t * 1000)
        counts["completed"].append(int(ckpt.get("completed") or 0))
        counts["aborted"].append(int(ckpt.get("aborted") or 0))
        for c in [*(ckpt.get("recent") or ()), *([ckpt["last"]] if ckpt.get("last") else [])]:
            seen[int(c["id"])] = c
    each: dict[str, list] = {"id": [], "t": [], "duration_ms": [], "bytes": []}
    for checkpoint_id, c in sorted(seen.items()):
        each["id"].append(checkpoint_id)
        each["t"].append((float(c["time"]) + float(c["duration_s"])) * 1000)
        each["duration_ms"].append(float(c["duration_s"]) * 1000)
        each["bytes"].append(int(c["bytes"]))
    return counts, each


def checkpoint_plots(dep_id: str, samples: list, status: dict) -> list:
    """The last checkpoint in words; completed and aborted over time (source ``checkpoint-counts``);
    the duration and size of each checkpoint (source ``checkpoints``). None without checkpoints."""
    from bokeh.models import ColumnDataSource, Div, HoverTool
    from bokeh.plotting import figure

    ckpt = status.get("checkpoints")
    if not ckpt:
        return []
    counts, each = checkpoint_history(dep_id, samples, status)
    counts_source = ColumnDataSource(counts, name="checkpoint-counts")
    each_source = ColumnDataSource(each, name="checkpoints")
    tally = figure(title="checkpoints completed and aborted", x_axis_type="datetime", height=200,
                   sizing_mode="stretch_width", tools="pan,wheel_zoom,reset", name="checkpoint-tally")
    tally.step("t", "completed", source=counts_source, line_width=2, color="#2ca02c", legend_label="completed",
               mode="after")
    tally.step("t", "aborted", source=counts_source, line_width=2, color="#d62728", legend_label="aborted",
               mode="after")
    tally.legend.location, tally.legend.label_text_font_size = "top_left", "9px"
    plots = [Div(text=checkpoint_summary(ckpt), name="checkpoint-last"), tally]
    for field, title in (("duration_ms", "checkpoint duration (ms, trigger to commit)"),
                         ("bytes", "checkpoint size (bytes of state stored)")):
        plot = figure(title=title, x_axis_type="datetime", height=200, sizing_mode="stretch_width",
                      tools="pan,wheel_zoom,reset", name=f"checkpoint-{field}")
        plot.scatter("t", field, source=each_source, size=7)
        plot.add_tools(HoverTool(tooltips=[("checkpoint", "@id"), ("took", "@duration_ms{0.0} ms"),
                                           ("size", "@bytes bytes")]))
        plots.append(plot)
    return plots


def checkpoint_summary(ckpt: dict) -> str:
    """The checkpoint part of a status in one HTML line: the last complete one, aborted, restarts."""
    from dask.utils import format_bytes

    from .liveview import restoring_text

    last = ckpt.get("last")
    text = (f"<b>last checkpoint</b> {int(last['id'])}: {float(last.get('age_s') or 0):.0f} s ago, took "
            f"{float(last['duration_s']) * 1000:.0f} ms, wrote {format_bytes(int(last['bytes']))} of "
            f"{format_bytes(int(last.get('state_bytes') or 0))} of state, at {_esc(last['url'])}"
            if last else "<b>no checkpoint complete yet</b>")
    restart = ckpt.get("restart") or {}
    text += (f" — completed {int(ckpt.get('completed') or 0)}, aborted {int(ckpt.get('aborted') or 0)}, "
             f"restarts {int(restart.get('in_a_row') or 0)} of {int(restart.get('attempts') or 0)} in a row "
             f"({int(restart.get('used') or 0)} in all), "
             f"every {float(ckpt.get('interval_s') or 0):g} s to {_esc(ckpt.get('storage', ''))}")
    if ckpt.get("restoring"):
        text += f"<br>restoring {_esc(restoring_text(ckpt['restoring']))} (rescales of them wait until they are in)"
    if ckpt.get("last_error"):
        text += f"<br><small>last error: {_esc(ckpt['last_error'])}</small>"
    return f"<p>{text}</p>"


def timeline_plot(status: dict):
    """Events (deploy, reconfigure, policy decisions, failures) at their time, text on hover."""
    from bokeh.models import ColumnDataSource, HoverTool
    from bokeh.plotting import figure

    events = list(status.get("events", ()))
    kinds = sorted({str(e.get("kind", "")) for e in events}) or [""]
    source = ColumnDataSource({"t": [float(e.get("t") or 0) for e in events],
                               "kind": [str(e.get("kind", "")) for e in events],
                               "text": [redact(str(e.get("text", ""))) for e in events]})
    # the axis spans the whole run: events that all came at the start stay there, not spread over ms
    span = max([float(status.get("elapsed_s") or 0), *source.data["t"], 1.0])
    plot = figure(title="events and decisions (seconds since the start)", y_range=kinds,
                  x_range=(0, span * 1.02), height=60 + 40 * len(kinds), sizing_mode="stretch_width",
                  tools="pan,wheel_zoom,reset", name="timeline")
    plot.scatter("t", "kind", source=source, size=10, marker="diamond")
    plot.add_tools(HoverTool(tooltips=[("t", "@t{0.0} s"), ("", "@text")]))
    return plot


def _esc(text) -> str:
    """``text`` for the page's HTML: secrets redacted (whatever published it), markup escaped."""
    import html

    return html.escape(redact(str(text)))


routes = [("/pescheduler", PeschedulerPage, {})]
