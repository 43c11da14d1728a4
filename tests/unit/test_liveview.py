"""The live view renders a status dict: PE figures, totals, recent events; one line off a TTY."""

from __future__ import annotations

import copy

import pytest
from rich.console import Console

from pescheduler.liveview import (LiveView, format_event, format_line, load_style, new_events, pe_table,
                                  rate, render)

STATUS = {
    "app": "connected-cars", "state": "running", "elapsed_s": 42.5, "error": None,
    "pes": [
        {"pe": "generator-1", "operators": ["generator-1"], "worker": "tcp://127.0.0.1:4321",
         "host": "local-0", "tuples_in_per_s": 0.0, "tuples_out_per_s": 1_250_000.0, "busy": 0.35,
         "backpressure": 0.92, "state": "running"},
        {"pe": "map-2->filter-3", "operators": ["map-2", "filter-3"], "worker": "tcp://127.0.0.1:4999",
         "host": "local-1", "tuples_in_per_s": 12_345.0, "tuples_out_per_s": 950.0, "busy": 0.05,
         "backpressure": 0.0, "state": "finished"},
    ],
    "operators": [{"op": "map-2", "pe": "map-2->filter-3", "tuples_in": 10, "tuples_out": 10,
                   "tuples_in_per_s": 12_345.0, "busy": 0.03, "dead_letters": 3, "late": 0}],
    "dead_letters": 3, "late_events": 17,
    "events": [{"t": float(i), "kind": "reconfigure" if i % 2 else "policy", "text": f"event number {i}"}
               for i in range(10)],
}


def text_of(renderable) -> str:
    console = Console(record=True, width=200, color_system=None)
    console.print(renderable)
    return console.export_text()


def screen_80_by_24(renderable) -> list[str]:
    """The lines ``renderable`` prints on an 80×24 terminal, checked to fit (23: one for the prompt)."""
    console = Console(width=80, height=24, record=True, color_system=None)
    console.print(renderable)
    lines = console.export_text().splitlines()
    assert len(lines) <= 23 and max(len(line) for line in lines) <= 80
    return lines


def test_rates_are_short():
    assert [rate(950), rate(12_345), rate(1_250_000), rate(None)] == ["950/s", "12.3k/s", "1.25M/s", "0/s"]


@pytest.mark.parametrize("fraction, style", [(0.0, "green"), (0.29, "green"), (0.3, "yellow"),
                                             (0.79, "yellow"), (0.8, "red"), (1.0, "red")])
def test_load_colours(fraction, style):
    assert load_style(fraction) == style


def test_view_shows_each_pe_with_its_figures():
    text = text_of(render(STATUS))
    assert "map-2->filter-3 (finished)" in text and "map-2, filter-3" in text
    assert "127.0.0.1:4999" in text and "tcp://" not in text
    assert "local-1" in text
    assert "1.25M/s" in text and "12.3k/s" in text and "950/s" in text
    assert "35%" in text and "92%" in text


def test_backpressure_cell_is_coloured_by_load():
    table = pe_table(STATUS)
    backpressure = list(table.columns[-1].cells)
    assert [cell.style for cell in backpressure] == ["red", "green"]


def test_totals_line():
    text = text_of(render(STATUS))
    assert "state running" in text and "elapsed 42.5 s" in text
    assert "dead letters 3" in text and "late events 17" in text


def test_only_the_last_eight_events_are_shown():
    text = text_of(render(STATUS))
    assert "event number 9" in text and "event number 2" in text
    assert "event number 1" not in text and "event number 0" not in text


def test_failed_status_shows_the_error():
    failed = {**STATUS, "state": "failed", "error": "lost worker tcp://127.0.0.1:4999"}
    assert "error: lost worker tcp://127.0.0.1:4999" in text_of(render(failed))


def test_an_empty_status_renders():
    assert "state starting" in text_of(render({"app": "x", "state": "starting"}))


def test_format_line_has_state_rates_and_totals():
    line = format_line(STATUS)
    assert "\n" not in line
    assert line.startswith("[   42.5s] connected-cars running | generator-1: in 0/s out 1.25M/s busy 35% bp 92%")
    assert "map-2->filter-3: in 12.3k/s out 950/s busy 5% bp 0% finished" in line
    assert line.endswith("dead letters 3, late 17")


def test_format_line_of_a_failure_has_the_reason():
    assert format_line({**STATUS, "state": "failed", "error": "boom"}).endswith("| error: boom")


def test_format_event():
    assert format_event({"t": 3.5, "kind": "policy", "text": "fuse a and b"}) == \
        "[    3.5s] event policy: fuse a and b"


def test_new_events_returns_each_event_once():
    seen: set = set()
    assert [e["text"] for e in new_events(STATUS, seen)] == [f"event number {i}" for i in range(10)]
    later = copy.deepcopy(STATUS)
    later["events"] = later["events"][5:] + [{"t": 11.0, "kind": "failed", "text": "late news"}]
    assert [e["text"] for e in new_events(later, seen)] == ["late news"]
    assert new_events(later, seen) == []


def test_live_view_renders_from_the_callable_and_survives_a_failing_read():
    calls = []

    def get_status():
        calls.append(1)
        if len(calls) > 1:
            raise RuntimeError("status read while it changed")
        return STATUS

    console = Console(record=True, width=200, color_system=None)
    with LiveView(get_status, console=console):
        pass
    assert len(calls) >= 2                  # read at start and again for the final frame
    text = console.export_text()
    assert "map-2->filter-3" in text and "dead 3 late 17" in text


# -- one screen: 80 x 24 ---------------------------------------------------------------------------

def _crowded() -> dict:
    pes = [{"pe": f"window-{i}->jsonl-{i}-named-at-length-by-its-author", "operators": [f"window-{i}"],
            "worker": f"tcp://127.0.0.1:4{i:04d}", "host": "local-1", "tuples_in_per_s": 1234.5 * i,
            "tuples_out_per_s": 99.0 * i, "busy": (i * 7 % 30) / 30, "backpressure": 0.1}
           for i in range(30)]
    events = [{"t": float(i), "kind": "policy",
               "text": f"rate applied Replicate('window-{i}', 2): window-{i} is offered 4000 t/s, more than it does"}
              for i in range(20)]
    return {**STATUS, "pes": pes, "events": events, "error": "lost worker tcp://127.0.0.1:40001 " * 4,
            "slots": [{"slot": "s1", "worker": "tcp://127.0.0.1:5", "host": "h", "copies": ["window-5#1"]}]}


def test_the_live_screen_fits_80_by_24_busiest_first_with_the_latest_decisions():
    from pescheduler.liveview import screen

    lines = screen_80_by_24(screen(_crowded(), 23))
    assert lines[0].startswith("connected-cars running 42s | dead 3 late 17 | in ")
    assert lines[1].startswith("error: lost worker")
    rows = [line for line in lines if line.startswith("window-")]
    busy = [int(line.split()[-2].rstrip("%")) for line in rows]
    assert busy == sorted(busy, reverse=True) and busy[0] == 97 and len(rows) >= 10
    assert any(line.startswith("… ") and "more PEs" in line for line in lines)
    assert "Replicate('window-19', 2)" in lines[-1] and "Replicate('window-15', 2)" in lines[-5]


def test_a_small_deployment_shows_every_pe_and_no_more_line():
    from pescheduler.liveview import screen

    console = Console(width=80, height=24, record=True, color_system=None)
    console.print(screen(STATUS, 23))
    text = console.export_text()
    assert "generator-1" in text and "map-2->filter-3 (finished)" in text and "more PEs" not in text


def _lagging() -> dict:
    crowded = _crowded()
    crowded["operators"] = [{"op": f"window-{i}", "pe": crowded["pes"][i]["pe"], "lag": {"0": 12_345 * i, "1": 7}}
                            for i in (1, 29)]
    return crowded


def test_the_live_screen_has_a_lag_column_for_pes_whose_sources_report_it_and_still_fits_80_by_24():
    from pescheduler.liveview import screen

    lines = screen_80_by_24(screen(_lagging(), 23))
    header = next(line for line in lines if line.split()[:2] == ["PE", "worker"])
    assert header.split()[-1] == "lag"
    lagging = [line for line in lines if line.startswith("window-29")]
    assert lagging and lagging[0].split()[-1] == "358.0k"          # 12,345 * 29 + 7 behind, short
    assert [line.split()[-1] for line in lines if line.startswith("window-2")][:1] == ["10%"]   # no lag: blank


def test_without_lag_there_is_no_lag_column():
    from pescheduler.liveview import screen

    text = text_of(screen(STATUS, 23))
    assert " lag" not in text.splitlines()[1]


def test_the_status_table_shows_lag_too():
    text = text_of(render(_lagging()))
    assert "lag" in text and "358.0k" in text


def _checkpointing() -> dict:
    crowded = _crowded()
    crowded["checkpoints"] = {"storage": "/tmp/c", "interval_s": 1.0, "completed": 12, "aborted": 2,
                              "last": {"id": 14, "time": 1.0, "duration_s": 0.0456, "bytes": 1_234_567,
                                       "url": "/tmp/c/chk-000014", "age_s": 3.4},
                              "last_error": "checkpoint 13: CheckpointError: interrupted: lost worker",
                              "restart": {"attempts": 3, "backoff_s": 0.1, "used": 4, "in_a_row": 1, "restarts": []}}
    return crowded


def test_the_live_screen_has_a_checkpoint_line_and_still_fits_80_by_24():
    from pescheduler.liveview import checkpoint_line, screen

    lines = screen_80_by_24(screen(_checkpointing(), 23))
    line = next(line for line in lines if line.startswith("checkpoint "))
    # restarts in a row of the attempts allowed (what fails the run), not the run's lifetime count
    assert line.startswith("checkpoint 14 3s ago, took 46 ms, 1.18 MiB | aborted 2 | restarts 1/3 in a row")
    assert "Replicate('window-19', 2)" in lines[-1]                   # the latest event still shown
    assert "checkpoint 14" in text_of(render(_checkpointing()))      # and in `status`'s view
    assert "restarts 1/3 in a row (4 in all)" in checkpoint_line(_checkpointing()).plain


def test_without_checkpoints_there_is_no_checkpoint_line_and_before_the_first_it_says_so():
    from pescheduler.liveview import checkpoint_line, screen

    assert not any(line.startswith("checkpoint") for line in text_of(screen(STATUS, 23)).splitlines())
    waiting = {"checkpoints": {"completed": 0, "aborted": 0, "last": None, "last_error": None}}
    assert checkpoint_line(waiting).plain == "checkpoint none complete yet | aborted 0"


def test_a_checkpoint_in_flight_for_a_second_or_more_is_shown_with_its_phase_and_the_workers_it_waits_for():
    """A whole-state checkpoint of 10^7 keys takes tens of seconds: the line shows it in flight,
    its phase, age, the bytes written so far and the workers it waits for; one in flight for less
    is not shown (most are)."""
    from pescheduler.liveview import checkpoint_line

    def line(age, written=0):
        return checkpoint_line({"checkpoints": {"completed": 1, "aborted": 0, "last_error": None,
                                                "last": {"id": 6, "age_s": 2, "duration_s": 0.05, "bytes": 2048},
                                                "in_flight": {"id": 7, "phase": "writing", "age_s": age,
                                                              "waiting_for": ["tcp://10.0.0.2:4001"],
                                                              "bytes": written, "idle_s": 0.1}}}).plain

    assert "| 7 writing 12s (waits for 10.0.0.2:4001) | aborted 0" in line(12.4)
    assert "| 7 writing 12s, 1.50 MiB written (waits for 10.0.0.2:4001) | aborted 0" in line(12.4, 3 << 19)
    assert "writing" not in line(0.2)


def test_the_state_each_pe_and_the_last_checkpoint_reference_is_shown_once_a_checkpoint_has_it():
    """``status``'s PE table gains a ``state`` column once a PE has a figure (the last complete
    checkpoint's part of it; blank for a PE made since), and the checkpoint line ends with the
    state the last one references, after the failures an 80-column screen must still show."""
    from pescheduler.liveview import checkpoint_line

    status = _checkpointing()
    assert "state" not in text_of(pe_table(status)).splitlines()[2]
    status["checkpoints"]["last"]["state_bytes"] = 120 << 20
    status["pes"][0]["state_bytes"], status["pes"][1]["state_bytes"] = 3 << 20, None
    table = text_of(pe_table(status))
    assert "state" in table.splitlines()[2] and "3.00 MiB" in table
    line = checkpoint_line(status).plain
    assert line.startswith("checkpoint 14 3s ago, took 46 ms, 1.18 MiB | aborted 2 | restarts 1/3 in a row")
    assert "| state 120.00 MiB |" in line


def test_restored_pes_whose_key_groups_still_load_are_shown_with_how_far_they_are():
    """A lazy restore at 10^7 keys loads for tens of seconds after the first output, and rescales of
    its PEs wait until it is done: the checkpoint line and the dashboard say how far it is; a PE its
    worker has not reported yet counts; nothing is shown once every group is in."""
    from pescheduler.dashboard import checkpoint_summary
    from pescheduler.liveview import checkpoint_line

    status = _checkpointing()
    status["checkpoints"]["restoring"] = {"pe-3": {"groups": 128, "loaded": 20, "s": 1.5},
                                          "pe-4": {"groups": 128, "loaded": 100, "s": 1.5}}
    assert "| restoring 2 PEs, 120/256 key groups |" in checkpoint_line(status).plain
    assert "restoring 2 PEs, 120/256 key groups (rescales of them wait" in checkpoint_summary(status["checkpoints"])
    status["checkpoints"]["restoring"] = {"pe-3": {}}
    assert "| restoring 1 PE |" in checkpoint_line(status).plain
    status["checkpoints"]["restoring"] = {}
    assert "restoring" not in checkpoint_line(status).plain
    assert "restoring" not in checkpoint_summary(status["checkpoints"])
