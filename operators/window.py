"""Event-time windows: tumbling or sliding, keyed, with shared incremental aggregates.

``window(size, slide=None, aggregates={name: (function, field)})`` emits one
dict per key and window::

    {"car": "car-0042", "window_start": 1_700_000_040_000,
     "window_end": 1_700_000_100_000, "avg_speed": 13.9}

Times are milliseconds, windows are aligned to multiples of ``slide`` (of
``size`` when tumbling) and their end is exclusive. A sliding window is
incremental: the stream is cut into *panes* of ``slide``, each tuple updates
the accumulators of one pane, and a window's result merges its
``size / slide`` panes (so ``size`` must be a multiple of ``slide``).

Firing: window ``[start, end)`` fires when the watermark reaches ``end - 1``.
Windows fire in order of ``window_end``; within a window, keys come in the
order they were first seen in its panes (earliest pane first). The end of the
stream (watermark ``MAX_WATERMARK``) fires every window still open. A
``flush`` without end of stream fires nothing: a keyed window's open state
moves by ``snapshot``/``restore``, it is not emitted half-done.

Late events: a tuple whose pane can no longer reach any unfired window
(``pane_start + size - 1 <= watermark``) goes to the ``late`` side output,
where the runtime counts it; nothing is dropped silently. A tuple that cannot
be aggregated (missing field, wrong type) is dead-lettered alone; the rest of
its batch counts.
"""

from __future__ import annotations

from bisect import bisect_left
from typing import Any, Callable

from pescheduler.aggregates import AggregatePlan
from pescheduler.chain import MIN_WATERMARK
from pescheduler.operator import Emitter, Operator, OperatorContext, Parallelism
from pescheduler.timeutil import parse_duration

RESERVED = ("window_start", "window_end")


def _plugin_aggregates() -> dict:
    """The aggregates registered by plug-ins (the built-ins are the plan's fallback)."""
    from pescheduler.plugins import active_plugins

    return active_plugins().aggregates


class Window(Operator):
    """Keyed event-time window with aggregates; see the module docstring.

    ``key``: a field name or a callable; by default the key of the preceding
    ``key_by`` (``context.key_field``). A callable key is emitted as ``"key"``;
    with no key at all there is one global group and no key field.
    """

    name = "window"
    parallelism = Parallelism.KEYED
    outputs = ("late",)

    def __init__(self, size: Any, slide: Any = None, aggregates: dict | None = None,
                 key: str | Callable | None = None, ts_field: str = "ts") -> None:
        self.size = parse_duration(size)
        self.slide = self.size if slide is None else parse_duration(slide)
        if self.size <= 0 or self.slide <= 0:
            raise ValueError(f"window size and slide must be positive, got size={size!r}, slide={slide!r}")
        if self.size % self.slide:
            raise ValueError(f"window size ({self.size} ms) must be a multiple of slide "
                             f"({self.slide} ms): sliding windows are built from panes of slide")
        if not isinstance(aggregates, (dict, type(None))):
            raise TypeError(f"aggregates must be a dict {{name: (function, field)}}, got {aggregates!r}")
        if ts_field is None:
            raise ValueError("a window needs event time: ts_field names the timestamp field (ms)")
        self.key = key
        self.ts_field = ts_field
        requests = dict(aggregates or {})
        self.plan = AggregatePlan(registry=_plugin_aggregates())
        self.query = self.plan.add(requests)
        self._merge = self.plan.merger()
        self._panes: dict[Any, dict] = {}          # pane start -> {key: slots}, keys first-seen
        self._wm = MIN_WATERMARK
        self._fired_end: int | None = None          # every window ending at or before is done
        self._compile(key)

    def open(self, context: OperatorContext) -> None:
        super().open(context)
        if self.key is None and context.key_field is not None:
            self._compile(context.key_field)

    def _compile(self, key: str | Callable | None) -> None:
        """Generate the update loop and row writer for ``key``."""
        key_name = None if key is None else ("key" if callable(key) else key)
        clash = set(self.query.names) & set(RESERVED + ((key_name,) if key_name else ()))
        if clash:
            raise ValueError(f"aggregate output names {sorted(clash)} clash with the key or "
                             f"window fields; rename them")
        self._update = self.plan.pane_updater(key, self.ts_field, self.slide)
        self._rows = self.plan.row_writer(self.query, key_name)

    # -- data -------------------------------------------------------------------------
    def process(self, batch: list, emit: Emitter) -> None:
        late: list = []
        items = iter(batch)
        lim = self._wm - self.size + 1          # panes starting at or before this are late
        failed = self._update(items, self._panes, lim, late.append)
        while failed is not None:               # rare: a bad tuple; go on after it
            emit.dead_letter(*failed)
            failed = self._update(items, self._panes, lim, late.append)
        for t in late:
            emit.to("late", t)

    def on_watermark(self, watermark: int, emit: Emitter) -> None:
        self._wm = watermark
        if self._panes:
            starts = sorted(self._panes)
            self._fire(starts, watermark + 1, emit.append)
            self._drop(starts, watermark)
        # Even with nothing to fire, windows ending here are done: a tuple
        # arriving later must not reopen them.
        self._fired_end = (watermark + 1) - (watermark + 1) % self.slide

    def _fire(self, starts: list, last_end: int, out: Callable) -> None:
        """Emit every window ending in ``(fired_end, last_end]`` that has data, by end."""
        size, slide = self.size, self.slide
        end = starts[0] + slide
        if self._fired_end is not None:
            end = max(end, self._fired_end + slide)
        while end <= last_end:
            lo = bisect_left(starts, end - size)
            if lo == len(starts):
                break
            if starts[lo] >= end:               # a gap with no data: jump to the next pane
                end = starts[lo] + slide
                continue
            hi = bisect_left(starts, end, lo)
            self._rows(self._window(starts[lo:hi]), end - size, end, out)
            end += slide

    def _window(self, starts: list) -> Any:
        """``(key, slots)`` of one window: its panes merged, keys in first-seen order."""
        panes = self._panes
        if len(starts) == 1:
            return panes[starts[0]].items()
        merged = dict(panes[starts[0]])
        merge = self._merge
        for p in starts[1:]:
            for k, s in panes[p].items():
                a = merged.get(k)
                merged[k] = s if a is None else merge(a, s)
        return merged.items()

    def _drop(self, starts: list, watermark: int) -> None:
        """Forget panes that can reach no unfired window."""
        bound = watermark - self.size + 1
        for p in starts:
            if p > bound:
                break
            del self._panes[p]

    # -- state --------------------------------------------------------------------------
    def snapshot(self) -> dict:
        """Panes (copied: slots are updated in place), watermark and fired frontier."""
        return {"layout": self.plan.layout, "size": self.size, "slide": self.slide,
                "panes": _copy_panes(self._panes), "watermark": self._wm,
                "fired_end": self._fired_end}

    def restore(self, state: dict) -> None:
        if (state["layout"], state["size"], state["slide"]) != (self.plan.layout, self.size, self.slide):
            raise ValueError(f"window state of {state['layout']} size={state['size']} "
                             f"slide={state['slide']} cannot be restored into {self.plan.layout} "
                             f"size={self.size} slide={self.slide}")
        self._panes = _copy_panes(state["panes"])
        self._wm = state["watermark"]
        self._fired_end = state["fired_end"]


def _copy_panes(panes: dict) -> dict:
    return {p: {k: list(s) for k, s in d.items()} for p, d in panes.items()}

