"""One PE's run figures (worker/pe_figures.py), driven directly: idle time against backpressure,
the first input's time, side-output counts."""

from __future__ import annotations

import time

import pytest

from pescheduler.worker.pe_figures import RunFigures, operator_figures


class Gate:
    """Counts the waits a full channel's gate is told of (ChannelOut's gate does the timing)."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def begin_wait(self) -> None:
        self.calls.append("begin")

    def end_wait(self) -> None:
        self.calls.append("end")


def test_an_idle_wait_counts_as_idle_and_shows_while_it_lasts():
    figures = RunFigures()
    figures.start()
    with figures.waiting(None):
        time.sleep(0.02)
        during = figures.stats()["idle_s"]
    after = figures.stats()
    assert during >= 0.02 and after["idle_s"] >= during
    assert after["elapsed_s"] >= after["idle_s"]


def test_a_wait_for_a_full_channel_s_credit_is_backpressure_on_its_gate_not_idle_time():
    figures, gate = RunFigures(), Gate()
    with pytest.raises(RuntimeError):
        with figures.waiting(gate):
            time.sleep(0.01)
            raise RuntimeError("the PE is cancelled during its wait")
    assert gate.calls == ["begin", "end"] and figures.stats()["idle_s"] == 0.0


def test_the_first_input_keeps_its_time_and_side_outputs_add_up_per_port():
    figures = RunFigures()
    assert figures.stats()["first_input_at"] is None and figures.stats()["elapsed_s"] == 0.0
    figures.input_came()
    first = figures.first_input_at
    time.sleep(0.01)
    figures.input_came()
    figures.side("window", "late", [1, 2])
    figures.side("window", "late", [3])
    stats = figures.stats()
    assert stats["first_input_at"] == first and stats["side"] == {"window.late": 3}


def test_no_operator_figures_before_the_chain_is_built():
    assert operator_figures(None, []) == {}
