"""The terminal view of a deployment's status dict: rich tables on a TTY, one line otherwise.

Every renderer is a pure function of the status dict (see
:meth:`pescheduler.control.deployment.Deployment.status`), so the view is tested
without a cluster and shows the same whether the dict came from the
deploying process or from the scheduler (``python -m pescheduler status``).

Example::

    from rich.console import Console
    Console().print(render(dep.status()))
    print(format_line(dep.status()))
"""

from __future__ import annotations

from typing import Callable

from dask.utils import format_bytes
from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.table import Table
from rich.text import Text

EVENTS_SHOWN = 8
IN_FLIGHT_SHOWN_S = 1.0    # a checkpoint or reconfiguration in flight this long is shown (most take well under it)

STATE_STYLES = {"starting": "yellow", "running": "green", "finished": "bold green",
                "stopped": "yellow", "failed": "bold red"}

EVENT_STYLES = {"failed": "red", "refused": "yellow", "reconfigure": "cyan", "policy": "magenta",
                "stop": "yellow", "error": "red"}


# -- figures ------------------------------------------------------------------------------

def count(n: float) -> str:
    """A count, short: ``950``, ``12.3k``, ``1.25M``."""
    n = float(n or 0.0)
    if n >= 1e6:
        return f"{n / 1e6:.2f}M"
    if n >= 1e3:
        return f"{n / 1e3:.1f}k"
    return f"{n:.0f}"


def rate(per_s: float) -> str:
    """Tuples per second, short: ``950/s``, ``12.3k/s``, ``1.25M/s``."""
    return count(per_s) + "/s"


def pe_lag(status: dict) -> dict[str, int]:
    """Records (Kafka) or entries (Redis) behind on the broker, summed per PE over its sources'
    partitions; only PEs with a source that reports lag."""
    behind: dict[str, int] = {}
    for op in status.get("operators", ()):
        if op.get("lag") and op.get("pe"):
            behind[op["pe"]] = behind.get(op["pe"], 0) + sum(op["lag"].values())
    return behind


def percent(fraction: float) -> str:
    return f"{100 * float(fraction or 0.0):.0f}%"


def load_style(fraction: float) -> str:
    """Colour of a busy or backpressure fraction: green, then yellow, red when saturated."""
    fraction = float(fraction or 0.0)
    return "red" if fraction >= 0.8 else "yellow" if fraction >= 0.3 else "green"


def short_worker(address: str) -> str:
    """A worker address without the ``tcp://`` every address shares (the table is narrow)."""
    return address.split("://", 1)[-1] if address else ""


DECISION_OUTCOMES = ("applied", "refused", "overruled", "suppressed", "skipped", "quarantined", "cancelled")


def decision_counts(status: dict) -> dict[str, int]:
    """Policy decisions among the kept events, by outcome (``"{policy} {outcome} ..."`` texts)."""
    counts = dict.fromkeys(DECISION_OUTCOMES, 0)
    for event in status.get("events", ()):
        words = event.get("text", "").split(maxsplit=2)
        if event.get("kind") == "policy" and len(words) > 1 and words[1] in counts:
            counts[words[1]] += 1
    return {k: n for k, n in counts.items() if n}


# -- rich renderables ---------------------------------------------------------------------

def pe_table(status: dict, wide: bool = True) -> Table:
    """One row per PE: operators, placement, rates, busy and backpressure in colour; the lag of
    its sources when one reports it (:func:`pe_lag`); the state it referenced at the last complete
    checkpoint once one has (``state``); ``wide=False``: no host column."""
    table = Table(title=f"{status.get('app', '')}: processing elements", title_justify="left",
                  expand=False)
    for header in ("PE", "operators", "worker") + (("host",) if wide else ()):
        table.add_column(header, overflow="fold")
    lag = pe_lag(status)
    stored = any(pe.get("state_bytes") is not None for pe in status.get("pes", ()))
    for header in ("in", "out", "busy", "backpr.") + (("lag",) if lag else ()) + (("state",) if stored else ()):
        table.add_column(header, justify="right", no_wrap=True)
    for pe in status.get("pes", ()):
        name = Text(pe.get("pe", ""))
        if pe.get("state", "running") != "running":
            name.append(f" ({pe['state']})", style=STATE_STYLES.get(pe["state"], ""))
        behind = (count(lag[pe["pe"]]) if pe.get("pe") in lag else "",) if lag else ()
        held = (format_bytes(pe["state_bytes"]) if pe.get("state_bytes") is not None else "",) if stored else ()
        table.add_row(name, ", ".join(pe.get("operators", ())), short_worker(pe.get("worker", "")),
                      *((pe.get("host", ""),) if wide else ()), rate(pe.get("tuples_in_per_s")), rate(pe.get("tuples_out_per_s")),
                      Text(percent(pe.get("busy")), style=load_style(pe.get("busy"))),
                      Text(percent(pe.get("backpressure")), style=load_style(pe.get("backpressure"))), *behind, *held)
    return table


def totals(status: dict) -> Text:
    """State, elapsed time, dead letters and late events; the error when failed."""
    state = status.get("state", "")
    line = Text("state ")
    line.append(state, style=STATE_STYLES.get(state, ""))
    line.append(f"   elapsed {float(status.get('elapsed_s') or 0):.1f} s   dead letters ")
    dead = int(status.get("dead_letters") or 0)
    line.append(str(dead), style="red" if dead else "")
    line.append(f"   late events {int(status.get('late_events') or 0)}")
    counts = decision_counts(status)
    if counts:
        line.append("   policy decisions ")
        line.append(", ".join(f"{n} {outcome}" for outcome, n in counts.items()),
                    style="red" if "quarantined" in counts else EVENT_STYLES["policy"])
    if status.get("error"):
        line.append(f"\nerror: {status['error']}", style="red")
    return line


def events_table(status: dict, last: int = EVENTS_SHOWN) -> Table:
    """The newest ``last`` events (reconfigurations, failures, policy decisions), oldest first."""
    table = Table(title="events", title_justify="left", show_header=False, box=None, padding=(0, 1))
    table.add_column("t", justify="right", no_wrap=True)
    table.add_column("kind", no_wrap=True)
    table.add_column("text", overflow="fold")
    for event in list(status.get("events", ()))[-last:] if last > 0 else ():
        kind = event.get("kind", "")
        table.add_row(f"{float(event.get('t') or 0):.1f}s", Text(kind, style=EVENT_STYLES.get(kind, "")),
                      event.get("text", ""))
    return table


def slots_line(status: dict) -> Text:
    """Standard slots: free, or the copies they run."""
    line = Text("standard slots ", style="bold")
    for slot in status.get("slots", ()):
        held = ",".join(slot["copies"]) or "free"
        line.append(f" {slot['slot']}@{short_worker(slot['worker'])}: ")
        line.append(held, style="green" if slot["copies"] else "dim")
    return line


def reconfiguring_line(status: dict) -> Text | None:
    """An action applied for :data:`IN_FLIGHT_SHOWN_S` or more, and what it waits for (most take
    well under it; one that waits for the reconfiguration lock says what holds it)."""
    flight = status.get("reconfiguring")
    if not flight or float(flight.get("age_s") or 0) < IN_FLIGHT_SHOWN_S:
        return None
    waits = f" (waits for {flight['waits_for']})" if flight.get("waits_for") else ""
    return _one_line(f"reconfiguring {flight['action']} {float(flight['age_s']):.0f}s{waits}", "cyan")


def checkpoint_line(status: dict) -> Text | None:
    """Checkpoints, one line: the last complete one (id, age, duration, bytes), one in flight for a
    second or more (its phase, age and the workers it waits for), failures (aborted checkpoints,
    restarts in a row of the attempts allowed and in all), the state the last one references
    (last: an 80-column screen cuts it before the failures); None when the deployment takes none."""
    ckpt = status.get("checkpoints")
    if not ckpt:
        return None
    line = Text("checkpoint ", style="bold")
    last = ckpt.get("last")
    if last:
        line.append(f"{last['id']} {float(last.get('age_s') or 0):.0f}s ago, took "
                    f"{float(last['duration_s']) * 1000:.0f} ms, {format_bytes(int(last['bytes']))}")
    else:
        line.append("none complete yet", style="yellow")
    flight = ckpt.get("in_flight")
    if flight and float(flight.get("age_s") or 0) >= IN_FLIGHT_SHOWN_S:
        waits = ", ".join(short_worker(w) for w in flight.get("waiting_for") or ())
        written = int(flight.get("bytes") or 0)
        line.append(f" | {flight['id']} {flight['phase']} {float(flight['age_s']):.0f}s"
                    + (f", {format_bytes(written)} written" if written else "")
                    + (f" (waits for {waits})" if waits else ""), style="cyan")
    aborted = int(ckpt.get("aborted") or 0)
    line.append(f" | aborted {aborted}", style="yellow" if aborted else "")
    restart = ckpt.get("restart") or {}
    if restart:
        in_a_row, used = int(restart.get("in_a_row") or 0), int(restart.get("used") or 0)
        line.append(f" | restarts {in_a_row}/{restart.get('attempts', 0)} in a row ({used} in all)",
                    style="red" if in_a_row else "yellow" if used else "")
    loading = ckpt.get("restoring") or {}
    if loading:
        line.append(f" | restoring {restoring_text(loading)}", style="cyan")
    if last and last.get("state_bytes") is not None:
        line.append(f" | state {format_bytes(int(last['state_bytes']))}")
    if ckpt.get("last_error"):
        line.append(f" | {ckpt['last_error']}", style="dim")
    line.no_wrap, line.overflow = True, "ellipsis"
    return line


def restoring_text(loading: dict) -> str:
    """``checkpoints.restoring`` in words: how many restored PEs still load their key groups, and
    how far (``2 PEs, 40/256 key groups``; a PE not reported yet counts no group)."""
    groups = sum(int(f.get("groups") or 0) for f in loading.values())
    loaded = sum(int(f.get("loaded") or 0) for f in loading.values())
    pes = f"{len(loading)} PE{'s' if len(loading) != 1 else ''}"
    return f"{pes}, {loaded}/{groups} key groups" if groups else pes


def errors_table(status: dict) -> Table | None:
    """The first exception of each operator that dead-lettered: what, where, on what, how often."""
    errors = list(status.get("errors") or ())
    if not errors:
        return None
    table = Table(title="first error per operator", title_justify="left", title_style="red")
    for header in ("operator", "count", "exception", "at", "sample"):
        table.add_column(header, overflow="fold")
    for e in errors:
        table.add_row(e.get("op", ""), str(e.get("count", "")), exception_text(e), e.get("where", ""),
                      e.get("sample", ""))
    return table


def exception_text(error: dict) -> str:
    """``Type: message`` of a readable dead letter (control/failures.py)."""
    return ": ".join(part for part in (error.get("type"), error.get("message")) if part)


def dead_letter_lines(status: dict, last: int) -> list[str]:
    """The newest ``last`` dead letters status carries, three lines each: operator and exception,
    the app's line, the tuple."""
    lines = []
    for d in list(status.get("recent_dead_letters") or ())[-last:] if last > 0 else ():
        lines += [f"{d.get('op', '')}: {exception_text(d)}", f"  at {d.get('where') or '?'}",
                  f"  {d.get('sample', '')}"]
    return lines


def render(status: dict, wide: bool = True) -> RenderableType:
    """The whole view: PE table, totals line, checkpoints, standard slots, first errors, recent
    events (``status``: all of it); ``wide=False`` leaves out the hosts so it fits 80 columns."""
    ckpt, errors, reconf = checkpoint_line(status), errors_table(status), reconfiguring_line(status)
    return Group(pe_table(status, wide), totals(status), *([ckpt] if ckpt else []), *([reconf] if reconf else []),
                 slots_line(status),
                 *([errors] if errors else []), events_table(status))


# -- one screen (the live view): everything fits, the busiest first ------------------------------

SCREEN_EVENTS = 5       # latest events (decisions, reconfigurations) on a full screen


def summary(status: dict) -> Text:
    """One line: app, state, elapsed, PEs and workers, total in/out, dead letters, late, decisions."""
    pes = list(status.get("pes", ()))
    workers = {pe.get("worker") for pe in pes if pe.get("worker")}
    state = status.get("state", "")
    line = Text(f"{status.get('app', '')} ", style="bold")
    line.append(state, style=STATE_STYLES.get(state, ""))
    line.append(f" {float(status.get('elapsed_s') or 0):.0f}s | ")
    dead = int(status.get("dead_letters") or 0)
    line.append(f"dead {dead}", style="red" if dead else "")
    # the least needed last: a narrow terminal cuts it first
    line.append(f" late {int(status.get('late_events') or 0)} | in "
                f"{rate(sum(float(p.get('tuples_in_per_s') or 0) for p in pes))} | "
                f"{len(pes)} PEs on {len(workers)} workers")
    counts = decision_counts(status)
    if counts:
        line.append(" | " + " ".join(f"{n} {outcome}" for outcome, n in counts.items()),
                    style="red" if "quarantined" in counts else EVENT_STYLES["policy"])
    line.no_wrap, line.overflow = True, "ellipsis"
    return line


def busiest_first(pes) -> list[dict]:
    """PEs by busy fraction, then backpressure, highest first: where to look comes first."""
    return sorted(pes, key=lambda pe: (-float(pe.get("busy") or 0), -float(pe.get("backpressure") or 0),
                                       pe.get("pe", "")))


def compact_pe_table(pes: list[dict], lag: dict[str, int] | None = None) -> Table:
    """PE, worker, in, out, busy, backpressure, and with ``lag`` (:func:`pe_lag`) what its
    sources have left on the broker: one line each, names shortened with an ellipsis."""
    table = Table(box=None, padding=(0, 1), expand=False, show_edge=False, pad_edge=False)
    # Figures keep their width (7 for "12.3k/s", 4 for "100%"); names give way, with an ellipsis.
    table.add_column("PE", no_wrap=True, overflow="ellipsis", max_width=30 if not lag else 22)
    table.add_column("worker", no_wrap=True, overflow="ellipsis", max_width=15)
    figures = (("in", 8), ("out", 8), ("busy", 4), ("bp", 4)) + ((("lag", 6),) if lag else ())
    for header, width in figures:
        table.add_column(header, justify="right", no_wrap=True, min_width=width)
    for pe in pes:
        name = pe.get("pe", "") + ("" if pe.get("state", "running") == "running" else f" ({pe['state']})")
        behind = (count(lag[pe["pe"]]) if pe.get("pe") in lag else "",) if lag else ()
        table.add_row(name, short_worker(pe.get("worker", "")), rate(pe.get("tuples_in_per_s")),
                      rate(pe.get("tuples_out_per_s")),
                      Text(percent(pe.get("busy")), style=load_style(pe.get("busy"))),
                      Text(percent(pe.get("backpressure")), style=load_style(pe.get("backpressure"))), *behind)
    return table


def _one_line(text: str, style: str = "") -> Text:
    line = Text(text, style=style)
    line.no_wrap, line.overflow = True, "ellipsis"
    return line


def screen(status: dict, height: int = 24) -> RenderableType:
    """What the live view shows in ``height`` lines (24: a classic terminal): a summary line,
    the error if any, the checkpoint line (with checkpoints on), the busiest PEs first (as many as fit; a ``lag`` column when a source
    reports what it has left on its broker), the standard slots, and the latest events. Every line is one terminal line; longer texts end in an ellipsis."""
    parts: list[RenderableType] = [summary(status)]
    if status.get("error"):
        parts.append(_one_line(f"error: {status['error']}", "red"))
    parts += [line for line in (checkpoint_line(status), reconfiguring_line(status)) if line is not None]
    slots = list(status.get("slots", ()))
    events = list(status.get("events", ()))
    shown_events = min(len(events), SCREEN_EVENTS, max(0, height - len(parts) - 6))
    room = height - len(parts) - 1 - (1 if slots else 0) - (1 + shown_events if shown_events else 0)
    pes, lag = busiest_first(status.get("pes", ())), pe_lag(status)
    if len(pes) > room:
        parts.append(compact_pe_table(pes[:max(0, room - 1)], lag))
        parts.append(_one_line(f"… {len(pes) - max(0, room - 1)} more PEs (python -m pescheduler status)",
                               "dim"))
    else:
        parts.append(compact_pe_table(pes, lag))
    if slots:
        parts.append(_one_line("slots " + "  ".join(f"{s['slot']}:{','.join(s['copies']) or 'free'}"
                                                     for s in slots)))
    if shown_events:
        parts.append(_one_line("latest events", "bold"))
        for event in events[-shown_events:]:
            kind = event.get("kind", "")
            line = _one_line(f"{float(event.get('t') or 0):6.1f}s ")
            line.append(f"{kind} ", style=EVENT_STYLES.get(kind, ""))
            line.append(event.get("text", ""))
            parts.append(line)
    return Group(*parts)


# -- plain text (not a terminal) ------------------------------------------------------------

def format_line(status: dict) -> str:
    """One log line: elapsed, app, state, each PE's rates and load, totals, an action applied for a
    second or more (:func:`reconfiguring_line`)."""
    pes = " | ".join(
        f"{pe.get('pe', '')}: in {rate(pe.get('tuples_in_per_s'))} out {rate(pe.get('tuples_out_per_s'))} "
        f"busy {percent(pe.get('busy'))} bp {percent(pe.get('backpressure'))}"
        + ("" if pe.get("state", "running") == "running" else f" {pe['state']}")
        for pe in status.get("pes", ()))
    line = (f"[{float(status.get('elapsed_s') or 0):7.1f}s] {status.get('app', '')} {status.get('state', '')}"
            + (f" | {pes}" if pes else "")
            + f" | dead letters {int(status.get('dead_letters') or 0)}, late {int(status.get('late_events') or 0)}")
    reconf = reconfiguring_line(status)
    if reconf is not None:
        line += f" | {reconf.plain}"
    if status.get("error"):
        line += f" | error: {status['error']}"
    return line


def format_event(event: dict) -> str:
    """One event as a log line: ``[   3.2s] event reconfigure: ...``."""
    return f"[{float(event.get('t') or 0):7.1f}s] event {event.get('kind', '')}: {event.get('text', '')}"


def new_events(status: dict, seen: set) -> list[dict]:
    """Events of ``status`` not in ``seen`` (which is updated), oldest first.

    Events carry no id and the deployment keeps only the newest ones, so an
    event is known by its (time, kind, text).
    """
    fresh = []
    for event in status.get("events", ()):
        key = (event.get("t"), event.get("kind"), event.get("text"))
        if key not in seen:
            seen.add(key)
            fresh.append(event)
    return fresh


# -- live view ------------------------------------------------------------------------------

class LiveView:
    """A ``rich.live.Live`` that re-renders the status returned by ``get_status``.

    Example::

        with LiveView(dep.status):
            dep.wait()

    Rich refreshes from its own thread while the deployment updates its status
    from another; a read that fails shows the last good status rather than
    ending the view.
    """

    def __init__(self, get_status: Callable[[], dict], console: Console | None = None,
                 refresh_per_second: float = 2.0) -> None:
        self.get_status = get_status
        self.last: dict = {}
        self.console = console or Console()
        self.live = Live(get_renderable=self._renderable, console=self.console,
                         refresh_per_second=refresh_per_second, transient=False)

    def _renderable(self) -> RenderableType:
        try:
            self.last = self.get_status()
        except Exception:
            pass
        return screen(self.last, self.console.size.height - 1)   # the last line holds the cursor

    def refresh(self) -> None:
        self.live.refresh()

    def __enter__(self) -> "LiveView":
        self.live.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self.live.__exit__(*exc)

