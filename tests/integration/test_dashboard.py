"""The /pescheduler page and the pescheduler_* metrics, on the embedded cluster's Dask dashboard.

One deployment serves every test: a Redis stream with a backlog (real redis-server, tests/brokers.py)
read at a bounded rate, so a consumer lag shows, with checkpoints every 0.2 s; the last test kills a
worker to see the restart counted (it runs last: it changes the placement).
"""

from __future__ import annotations

import asyncio
import base64
import html
import json
import os
import re
import time
import urllib.request
from pathlib import Path

import dask
import pytest

import pescheduler
from pescheduler import Application
from pescheduler.control.status import short_pe
from waiting import until

pytestmark = [pytest.mark.integration, pytest.mark.broker]

BACKLOG = 100_000       # entries in the stream at the start
RATE = 500              # read per second: the backlog lasts minutes, so the lag stays above 0
RETAIN = 1              # checkpoints kept: the coordinator's history holds 10 × this
WAIT = 120


def get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=30) as r:
        assert r.status == 200
        return r.read().decode()


@pytest.fixture(scope="module")
def running(tmp_path_factory):
    import redis

    from brokers import start_redis

    with start_redis() as broker:
        url = f"redis://{broker.address}/0"
        client = redis.Redis.from_url(url)
        pipe = client.pipeline(transaction=False)
        for i in range(BACKLOG):
            pipe.xadd("dash-in", {"data": json.dumps({"n": i, "speed": i % 130})})
        pipe.execute()
        client.close()
        app = Application("dash")
        (app.source("redis", stream="dash-in", url=url, event_time=None, rate=RATE)
            .map(lambda e: {**e, "kmh": e["speed"]})
            .sink("discard"))
        with dask.config.set({"pescheduler.checkpoint.retain": RETAIN}):
            with pescheduler.deploy(app, workers=2, policies=[], checkpoint=str(tmp_path_factory.mktemp("ckpt")),
                                    checkpoint_interval="0.2s") as dep:
                until(lambda: dep.status()["state"] == "running", WAIT, "the deployment to run")
                base = dep.cluster.dashboard_link.rsplit("/status", 1)[0]
                yield dep, base


def test_the_dashboard_listens_on_the_loopback_only(running):
    _dep, base = running
    assert base.startswith("http://127.0.0.1:")


def test_the_pescheduler_page_draws_every_pe_with_bokeh(running):
    dep, base = running
    pes = [short_pe(pe) for pe in dep.placement().pes]         # status names a PE by its first operator
    until(lambda: all(pe in get(base + "/pescheduler") for pe in pes), 60, "the page to list every PE")
    page = get(base + "/pescheduler")
    assert "Bokeh" in page and "placement" in page and "pe-labels" in page and "timeline" in page
    assert "series-busy" in page and "series-backpressure" in page


def drawn_source(page: str, name: str) -> dict:
    """The data of the Bokeh ColumnDataSource called ``name`` in a served page's document JSON."""
    found = []

    def walk(node):
        if isinstance(node, dict):
            attributes = node.get("attributes") or {}
            if node.get("name") == "ColumnDataSource" and attributes.get("name") == name:
                found.append(dict(attributes["data"]["entries"]))
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)
    for doc in re.findall(r'<script type="application/json"[^>]*>(.*?)</script>', page, re.S):
        walk(json.loads(html.unescape(doc)))
    assert len(found) == 1, f"{len(found)} sources called {name}"
    return found[0]


def test_the_page_draws_the_channels_between_the_pes(running):
    dep, base = running
    pl = dep.placement()
    crossing = {(short_pe(pl.pe_of(src)), short_pe(dst_pe)) for src, _port, _dst, dst_pe in pl.channels()}
    assert crossing, "the app crosses PEs on two workers"

    def edges():
        data = drawn_source(get(base + "/pescheduler"), "pe-edges")
        return set(zip(data["from"], data["to"]))
    until(lambda: edges() == crossing, 60, "the page to draw every channel between PEs")


def test_metrics_with_the_pescheduler_prefix_are_on_the_dashboards_metrics(running):
    dep, base = running
    pe = short_pe(next(iter(dep.placement().pes)))       # status and metrics name a PE by its first operator

    def busy_line():
        text = get(base + "/metrics")
        return re.search(r'^pescheduler_pe_busy\{[^}]*pe="%s"[^}]*\} [0-9.e+-]+$' % re.escape(pe), text, re.M)
    until(busy_line, 60, "pescheduler_pe_busy for the first PE on /metrics")
    text = get(base + "/metrics")
    assert re.search(r'^pescheduler_deployment_running\{.*app="dash".*\} 1\.0$', text, re.M)
    assert "pescheduler_pe_tuples_in_per_second" in text and "dask_scheduler_workers" in text


def metric(text: str, name: str, **labels) -> float | None:
    """The value of the sample ``name`` whose labels include ``labels`` in a /metrics text."""
    for line in text.splitlines():
        found = re.match(r"^%s\{(.*)\} (\S+)$" % re.escape(name), line)
        if found and all(f'{k}="{v}"' in found.group(1) for k, v in labels.items()):
            return float(found.group(2))
    return None


def test_the_consumer_lag_per_source_and_partition_is_on_metrics(running):
    dep, base = running
    until(lambda: (metric(get(base + "/metrics"), "pescheduler_consumer_lag", source="redis-1",
                          partition="dash-in") or 0) > 0, WAIT, "a lag above 0 for redis-1's stream")
    text = get(base + "/metrics")
    lag = metric(text, "pescheduler_consumer_lag", source="redis-1", partition="dash-in", app="dash")
    assert 0 < lag < BACKLOG
    row = next(o for o in dep.status()["operators"] if o["op"] == "redis-1")
    assert set(row["lag"]) == {"dash-in"}, "the one stream is the one partition"
    assert metric(text, "pescheduler_restarts_total", app="dash") == 0.0


def test_checkpoint_counters_count_past_the_history_the_status_keeps(running):
    """The coordinator keeps the newest 10 × retain checkpoints; the counter goes on past them."""
    dep, base = running
    kept = 10 * RETAIN

    def completed():
        return metric(get(base + "/metrics"), "pescheduler_checkpoints_completed_total", app="dash") or 0
    until(lambda: completed() > kept + 2, WAIT, f"more than {kept + 2} checkpoints counted")
    assert len(dep.checkpoints()) == kept < dep.status()["checkpoints"]["completed"]
    text = get(base + "/metrics")
    assert metric(text, "pescheduler_checkpoints_aborted_total", app="dash") is not None
    assert metric(text, "pescheduler_checkpoint_last_bytes", app="dash") > 0
    assert 0 < metric(text, "pescheduler_checkpoint_last_duration_seconds", app="dash") < 30
    assert abs(metric(text, "pescheduler_checkpoint_last_timestamp_seconds", app="dash") - time.time()) < 60


def test_the_page_draws_the_lag_and_the_checkpoints(running):
    dep, base = running
    until(lambda: dep.status()["checkpoints"]["completed"] >= 3, WAIT, "three checkpoints")
    page = get(base + "/pescheduler")
    lag = drawn_source(page, "consumer-lag")
    assert (lag["source"], lag["partition"]) == (["redis-1"], ["dash-in"])
    assert lag["ys"][0] and all(0 <= n <= BACKLOG for n in lag["ys"][0]) and max(lag["ys"][0]) > 0
    each = drawn_source(page, "checkpoints")
    assert len(each["id"]) >= 3 and each["id"] == sorted(set(each["id"]))
    assert all(d > 0 for d in each["duration_ms"]) and all(b > 0 for b in each["bytes"])
    counts = drawn_source(page, "checkpoint-counts")
    assert counts["completed"] == sorted(counts["completed"]) and counts["completed"][-1] >= 3
    assert "last checkpoint" in page and "checkpoint-duration_ms" in page and "series-lag" in page


# -- as a person sees it: headless Chromium draws the page ---------------------------------------------

RECORD_DRAWN_TEXT = """
window.__drawn = [];
const fillText = CanvasRenderingContext2D.prototype.fillText;
CanvasRenderingContext2D.prototype.fillText = function (text, ...rest) {
    window.__drawn.push(String(text));
    return fillText.call(this, text, ...rest);
};
"""
SHOWN_TEXT = """
(function () {
    // What a person sees: the texts drawn on canvases (PE names, titles, axes) and the laid-out
    // text of the page's elements, inside Bokeh's shadow roots too (legends and Divs are DOM).
    const shown = [...(window.__drawn || [])];
    function walk(node) {
        if (node.shadowRoot) walk(node.shadowRoot);
        for (const child of node.childNodes) {
            const parent = child.parentElement;
            if (child.nodeType !== Node.TEXT_NODE) walk(child);
            else if (child.textContent.trim() && parent && !["STYLE", "SCRIPT"].includes(parent.tagName)
                     && parent.getClientRects().length > 0) shown.push(child.textContent.trim());
        }
    }
    if (document.body) walk(document.body);
    return JSON.stringify(shown);
})()
"""
SCREENSHOT = Path(__file__).parents[2] / "docs" / "dashboard.png"


def test_chromium_draws_the_pe_names_the_lag_and_the_checkpoints(running, tmp_path):
    """The PE names, the lag line's and the checkpoint counts' legends and the last checkpoint are
    shown. Every canvas text Bokeh draws is recorded in the page (a wrapped fillText), the text of
    its laid-out elements is read from the DOM, both over the DevTools protocol. The screenshot goes to the test's folder; with PESCHEDULER_UPDATE_SCREENSHOT=1
    it replaces docs/dashboard.png (how that file was made)."""
    from debian import require
    from pescheduler.resource_managers import processes

    dep, base = running
    chromium = require("chromium", "chromium")
    port = processes.free_port()
    browser = processes.start("chromium", [
        chromium, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--no-first-run", "--disable-component-update", "--disable-sync", "--window-size=1280,2200",
        f"--user-data-dir={tmp_path / 'profile'}", f"--remote-debugging-port={port}",
        "--remote-allow-origins=*", "about:blank"], log_dir=str(tmp_path))
    want = [*map(short_pe, dep.placement().pes), "redis-1 dash-in", "completed", "aborted", "last checkpoint"]
    try:
        drawn, png = asyncio.run(_draw(f"http://127.0.0.1:{port}", base + "/pescheduler", browser, want))
    finally:
        browser.stop()                               # by the PID this test started
    for text in want:
        assert text in drawn, f"{text} was not drawn; drawn: {sorted(set(drawn))[:40]}"
    (tmp_path / "dashboard.png").write_bytes(png)
    assert png.startswith(b"\x89PNG")
    if os.environ.get("PESCHEDULER_UPDATE_SCREENSHOT"):
        SCREENSHOT.write_bytes(png)


async def _draw(devtools: str, url: str, browser, want: list[str]) -> tuple[list[str], bytes]:
    from tornado.httpclient import AsyncHTTPClient
    from tornado.websocket import websocket_connect

    async def targets():
        response = await AsyncHTTPClient().fetch(devtools + "/json", raise_error=False)
        return json.loads(response.body) if response.code == 200 else []
    deadline = time.monotonic() + 60
    while not [t for t in await _quietly(targets) or [] if t.get("type") == "page"]:
        assert browser.alive() and time.monotonic() < deadline, browser.log_tail(20)
        await asyncio.sleep(0.2)                     # Chromium announces no readiness but this
    page = next(t for t in await targets() if t.get("type") == "page")
    ws = await websocket_connect(page["webSocketDebuggerUrl"])
    ids = iter(range(1, 10_000))

    async def call(method, **params):
        n = next(ids)
        await ws.write_message(json.dumps({"id": n, "method": method, "params": params}))
        while True:
            answer = json.loads(await asyncio.wait_for(ws.read_message(), 60))
            if answer.get("id") == n:
                return answer.get("result", {})
    await call("Page.enable")
    await call("Page.addScriptToEvaluateOnNewDocument", source=RECORD_DRAWN_TEXT)
    await call("Page.navigate", url=url)
    deadline = time.monotonic() + 90
    drawn: list[str] = []
    while time.monotonic() < deadline:
        result = await call("Runtime.evaluate", expression=SHOWN_TEXT, returnByValue=True)
        drawn = json.loads(result.get("result", {}).get("value") or "[]")
        if all(text in drawn for text in want):      # all in one drawing (the page reloads itself)
            break
        await asyncio.sleep(0.3)                     # drawing happens in the page; polled through CDP
    shot = await call("Page.captureScreenshot", format="png")
    ws.close()
    return drawn, base64.b64decode(shot["data"])


async def _quietly(coro_fn):
    try:
        return await coro_fn()
    except OSError:
        return None


def test_a_restart_counts_in_pescheduler_restarts_total(running):
    """Runs last (it changes the placement): a worker SIGKILLed, the deployment restores its last
    checkpoint, and /metrics counts the restart as the deployment does."""
    import signal

    dep, base = running
    # A loss before the first complete checkpoint fails the deployment (nothing to restore): run
    # alone (-k), this test killed right after the start, and no restart ever came.
    until(lambda: dep.checkpoints(), WAIT, "a complete checkpoint to restore")
    pl = dep.placement()
    os.kill(dep.worker_info[pl.pes[pl.pe_of("map-2")].worker]["pid"], signal.SIGKILL)
    until(lambda: (metric(get(base + "/metrics"), "pescheduler_restarts_total", app="dash") or 0) >= 1, WAIT,
          "pescheduler_restarts_total to count the restart")
    until(lambda: dep.recovery.restarts and "first_output_s" in dep.recovery.restarts[-1], WAIT,
          "output after the restart")
    until(lambda: metric(get(base + "/metrics"), "pescheduler_restarts_total", app="dash")
          == len(dep.recovery.restarts), WAIT, "the count to match the deployment's restarts")
