"""The /pescheduler page and the pescheduler_* metrics, on the embedded cluster's Dask dashboard."""

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

import pytest

import pescheduler
from pescheduler import Application
from waiting import until

pytestmark = pytest.mark.integration


def get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=30) as r:
        assert r.status == 200
        return r.read().decode()


@pytest.fixture(scope="module")
def running():
    app = Application("dash")
    (app.source("generator", events=None, keys=20, rate=5_000)
        .map(lambda e: {**e, "kmh": e["speed"]})
        .sink("discard"))
    with pescheduler.deploy(app, workers=2, policies=[]) as dep:
        until(lambda: dep.status()["state"] == "running", 120, "the deployment to run")
        base = dep.cluster.dashboard_link.rsplit("/status", 1)[0]
        yield dep, base


def test_the_dashboard_listens_on_the_loopback_only(running):
    _dep, base = running
    assert base.startswith("http://127.0.0.1:")


def test_the_pescheduler_page_draws_every_pe_with_bokeh(running):
    dep, base = running
    pes = [html.escape(pe) for pe in dep.placement().pes]      # the document JSON sits in HTML: "->" is "-&gt;"
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
    crossing = {(pl.pe_of(src), dst_pe) for src, _port, _dst, dst_pe in pl.channels()}
    assert crossing, "the app crosses PEs on two workers"

    def edges():
        data = drawn_source(get(base + "/pescheduler"), "pe-edges")
        return set(zip(data["from"], data["to"]))
    until(lambda: edges() == crossing, 60, "the page to draw every channel between PEs")


def test_metrics_with_the_pescheduler_prefix_are_on_the_dashboards_metrics(running):
    dep, base = running
    pe = next(iter(dep.placement().pes))

    def busy_line():
        text = get(base + "/metrics")
        return re.search(r'^pescheduler_pe_busy\{[^}]*pe="%s"[^}]*\} [0-9.e+-]+$' % re.escape(pe), text, re.M)
    until(busy_line, 60, "pescheduler_pe_busy for the first PE on /metrics")
    text = get(base + "/metrics")
    assert re.search(r'^pescheduler_deployment_running\{.*app="dash".*\} 1\.0$', text, re.M)
    assert "pescheduler_pe_tuples_in_per_second" in text and "dask_scheduler_workers" in text


# -- as a person sees it: headless Chromium draws the page ---------------------------------------------

RECORD_DRAWN_TEXT = """
window.__drawn = [];
const fillText = CanvasRenderingContext2D.prototype.fillText;
CanvasRenderingContext2D.prototype.fillText = function (text, ...rest) {
    window.__drawn.push(String(text));
    return fillText.call(this, text, ...rest);
};
"""
SCREENSHOT = Path(__file__).parents[2] / "docs" / "dashboard.png"


def test_chromium_draws_every_pe_name_on_the_page(running, tmp_path):
    """Every canvas text Bokeh draws is recorded in the page (a wrapped fillText), read over the
    DevTools protocol. The screenshot goes to the test's folder; with PESCHEDULER_UPDATE_SCREENSHOT=1
    it replaces docs/dashboard.png (how that file was made)."""
    from debian import require
    from pescheduler.resource_managers import processes

    dep, base = running
    chromium = require("chromium", "chromium")
    port = processes.free_port()
    browser = processes.start("chromium", [
        chromium, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--no-first-run", "--disable-component-update", "--disable-sync", "--window-size=1280,1400",
        f"--user-data-dir={tmp_path / 'profile'}", f"--remote-debugging-port={port}",
        "--remote-allow-origins=*", "about:blank"], log_dir=str(tmp_path))
    try:
        drawn, png = asyncio.run(_draw(f"http://127.0.0.1:{port}", base + "/pescheduler", browser))
    finally:
        browser.stop()                               # by the PID this test started
    for pe in dep.placement().pes:
        assert pe in drawn, f"{pe} was not drawn; drawn: {sorted(set(drawn))[:40]}"
    (tmp_path / "dashboard.png").write_bytes(png)
    assert png.startswith(b"\x89PNG")
    if os.environ.get("PESCHEDULER_UPDATE_SCREENSHOT"):
        SCREENSHOT.write_bytes(png)


async def _draw(devtools: str, url: str, browser) -> tuple[list[str], bytes]:
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
        result = await call("Runtime.evaluate", expression="JSON.stringify(window.__drawn || [])",
                            returnByValue=True)
        drawn = json.loads(result.get("result", {}).get("value") or "[]")
        if any("->" in text for text in drawn):
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
