"""Trades and quotes: every trade with the quote of its symbol that was valid when it happened.

    python -m pescheduler deploy examples/trades_asof.py

50 symbols are quoted about every 2 s and traded about every 1.5 s for 30
minutes of event time; both streams arrive out of order by up to 2 s (the
sources' ``max_delay``). An as-of join takes, for each trade, the latest quote
of its symbol at or before the trade's time, at most 5 s old (a trade with no
such quote keeps ``None``); a lookup adds the symbol's sector from a static
table. One line per trade goes to ``out/trades_asof.jsonl``::

    {"symbol": "S07", "ts": 61250, "price": 100.4, "bid": 100.1, "ask": 100.5,
     "quote_ts": 60120, "sector": "energy"}

The result does not depend on the arrival order: a trade waits until the
watermark shows that no later quote at or before its time can still come.
``reference()`` computes the same lines in plain Python over the inputs in
time order; the tests compare the two.
"""

import bisect
import random

from pescheduler import Application

SYMBOLS, MINUTES, TOLERANCE_MS, DELAY_MS = 50, 30, 5_000, 2_000
OUTPUT = "out/trades_asof.jsonl"
SECTORS = [{"symbol": f"S{s:02d}", "sector": ("energy", "banks", "tech")[s % 3]} for s in range(SYMBOLS)]


def ticks(every_ms: int, seed: int) -> list[dict]:
    """One event per symbol about every ``every_ms``, in time order, with a price walking around 100."""
    rng, out = random.Random(seed), []
    for s in range(SYMBOLS):
        ts, price = rng.randrange(every_ms), 100.0
        while ts < MINUTES * 60_000:
            price = round(price + rng.uniform(-0.5, 0.5), 2)
            out.append({"symbol": f"S{s:02d}", "ts": ts, "price": price})
            ts += rng.randrange(every_ms // 2, every_ms * 3 // 2) + (8_000 if rng.random() < 0.02 else 0)
    return sorted(out, key=lambda e: e["ts"])


def quotes() -> list[dict]:
    return [{"symbol": q["symbol"], "ts": q["ts"], "bid": round(q["price"] - 0.2, 2),
             "ask": round(q["price"] + 0.2, 2)} for q in ticks(2_000, 1)]


def trades() -> list[dict]:
    return ticks(1_500, 2)


def arriving(events: list[dict], seed: int) -> list[dict]:
    """``events`` shuffled within ``DELAY_MS``: each one arrives after events up to 2 s later."""
    rng = random.Random(seed)
    return [e for _, e in sorted(((e["ts"] + rng.uniform(0, DELAY_MS), e) for e in events),
                                 key=lambda pair: pair[0])]


class Line:
    """A joined trade as one flat line: the trade and its quote's fields (None without a quote)."""

    def __call__(self, joined: dict) -> dict:
        trade, quote = joined["left"], joined["right"] or {}
        return {**trade, "bid": quote.get("bid"), "ask": quote.get("ask"), "quote_ts": quote.get("ts")}


class WithSector:
    """A line and the sector its symbol has in the static table."""

    def __call__(self, looked_up: dict) -> dict:
        row = looked_up["right"]
        return {**looked_up["left"], "sector": row and row["sector"]}


def build(output: str = OUTPUT) -> Application:
    app = Application("trades-asof")
    trade = app.source("iterable", items=arriving(trades(), 3), max_delay=DELAY_MS)
    quote = app.source("iterable", items=arriving(quotes(), 4), max_delay=DELAY_MS)
    (trade.join_asof(quote, by="symbol", tolerance=TOLERANCE_MS)
        .map(Line())
        .lookup(SECTORS, key="symbol")
        .map(WithSector())
        .sink("jsonl", path=output))
    return app


def reference() -> list[dict]:
    """The same lines by a plain loop: per trade, bisect its symbol's quotes (in time order)."""
    by_symbol: dict = {}
    for q in quotes():
        by_symbol.setdefault(q["symbol"], []).append(q)
    times = {symbol: [q["ts"] for q in mine] for symbol, mine in by_symbol.items()}
    sectors = {s["symbol"]: s["sector"] for s in SECTORS}
    lines = []
    for t in trades():
        mine = by_symbol.get(t["symbol"], [])
        i = bisect.bisect_right(times.get(t["symbol"], []), t["ts"])
        q = mine[i - 1] if i and t["ts"] - mine[i - 1]["ts"] <= TOLERANCE_MS else {}
        lines.append({"symbol": t["symbol"], "ts": t["ts"], "price": t["price"], "bid": q.get("bid"),
                      "ask": q.get("ask"), "quote_ts": q.get("ts"), "sector": sectors[t["symbol"]]})
    return sorted(lines, key=lambda line: (line["symbol"], line["ts"]))
