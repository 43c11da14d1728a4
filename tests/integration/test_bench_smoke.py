"""Benchmarks stay runnable: each runs in its quick form, as a user types it.

A bench with a smoke test of its own elsewhere is not run twice: ``hosts.py`` runs in
tests/spark/test_bench_spark.py (``--quick --rm spark``). ``kafka.py`` (it starts its own broker)
runs here beside the others; it ran alone in tests/integration/test_kafka.py. Where the quick
form's size proves nothing a smaller one does not (repetitions of the same figure), the smoke run
asks for the smaller one.

The selected benches run in the background three at a time, the longest first, from the module's
first test on (``quick_runs``): most of a quick bench's time is its fixed phases and paced streams, not CPU,
so together they take about half the time they take one after the other, and each still checks
its own output (a bench that loses or repeats a tuple exits 1 whatever the load).
"""

from __future__ import annotations

import re
import subprocess
import sys
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

BENCH = Path(__file__).parent.parent.parent / "bench"
AT_ONCE = 3
TIMEOUT_S = {"fusion.py": 900, "columnar.py": 900, "channel.py": 900, "state.py": 600,
             "goals34.py": 1200, "kafka.py": 600}   # others 300
# Each quick run's length, s, one after another on this machine (load 5-8, (L); elastic.py and
# postgres_cdc.py at load 13: 52 and 14 s): the longest start first. In the tests' order
# bench/state.py, the longest, started last, once the three slots had been busy for minutes, and
# the module then waited for it alone. Unlisted benches start last.
QUICK_S = {"state.py": 87, "latency.py": 60, "goals34.py": 38, "elastic.py": 35, "fusion.py": 23,
           "connectors.py": 22, "recovery.py": 21, "reconfig.py": 20, "channel.py": 15, "startup.py": 13,
           "columnar.py": 12, "parallel.py": 12, "postgres_cdc.py": 10, "kafka.py": 25, "fill.py": 8,
           "rescale_ops.py": 18}


def _command(script: str, *args: str) -> tuple[str, ...]:
    return (sys.executable, str(BENCH / script), "--quick", *args)


def _item_command(item) -> tuple[str, ...]:
    """The bench command a selected test of this module checks."""
    params = getattr(item, "callspec", None)
    params = params.params if params else {"script": "state.py"}
    return _command(params["script"], *params.get("args", ()))


def _run(command: tuple[str, ...], cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(command, cwd=cwd, capture_output=True, text=True,
                          timeout=TIMEOUT_S.get(Path(command[1]).name, 300))


@pytest.fixture(scope="module")
def quick_runs(request, tmp_path_factory) -> dict[tuple[str, ...], Future]:
    """Every selected test's bench, started at once (AT_ONCE at a time, the longest first), each in
    its own directory."""
    commands = [_item_command(item) for item in request.session.items if item.module is request.module]
    commands.sort(key=lambda c: -QUICK_S.get(Path(c[1]).name, 0))
    with ThreadPoolExecutor(max_workers=AT_ONCE) as pool:
        yield {c: pool.submit(_run, c, tmp_path_factory.mktemp(Path(c[1]).stem)) for c in commands}


def _longest_first(params: list) -> list:
    """``params`` in the order ``quick_runs`` starts their benches: a test waits for its own bench
    only, so in this order each one waits about one bench's run, never the queue before its own (in
    the order written, reconfig.py's test waited for eight benches started before it: 229 s of
    pytest's 300 s in a serial run, 300 s and the timeout in a parallel one at load 13-15)."""
    return sorted(params, key=lambda p: -QUICK_S.get((p.values if hasattr(p, "values") else p)[0], 0))


@pytest.mark.parametrize("script, args, expected", _longest_first([
    # one repetition of each operation and a short monitor run: the same rows and exactly-once check
    ("reconfig.py", ("--repeat", "1", "--monitor-events", "200000"), ("0 lost, 0 duplicated",)),
    ("parallel.py", (), ("0 lost, 0 duplicated", "cold (new worker)")),
    ("ep.py", (), ("filter", "aggregation", "correlation", "pattern", "mixed", "goal: K = 100 shared",
                   "sqlite      batch", "duckdb      batch")),
    ("policies.py", (), ("rate", "copy", "threshold", "controller (rate+copy)", "(baseline pass)", "best ms")),
    ("security.py", (), ("(a) no handshake", "(b) authenticated", "(c) authenticated, TLS", "load average")),
    pytest.param("elastic.py", (), ("phase 3", "steps", "instances", "oracle", "relief", "flip-flops",
                                    "hosts                  borrowed", "activation", "0 lost, 0 duplicated"), marks=pytest.mark.lab),
    ("recovery.py", (), ("checkpoint every 1 s", "duration p50", "0 lost, 0 duplicated", "kill → first output")),
    ("startup.py", (), ("start -> first output", "launch PEs", "stop start -> stop exits", "command line", "forked",
                        "(a)/(b): deploy→result")),
    ("connectors.py", (), ("parquet", "delta", "iceberg", "ms/commit", "output checked")),
    ("latency.py", (), ("before: p50", "after: p50", "capacity (unpaced", "goals across 2 PEs",
                        "a fire of many keys at once")),
    # every issue-34 goal in one run: each part ran and printed its line (none failed: exit 0)
    ("goals34.py", (), ("issue 34's goals", "load average at start", "latency p99, 2 PEs, 50%",
                        "throughput at 90 %", "CLI deploy -> first output", "stop NAME -> exit",
                        "per tuple deployed / hand loop over tuples", "CLI end to end, per tuple / columnar",
                        "goals met")),
    # each backend's fill and the disk store's raw client loop; exit 1 if one holds other than K keys
    ("fill.py", (), ("round 1 dicts", "round 1 memory", "round 1 disk", "round 1 rocksdb", "x rocksdb")),
    # the steady stream: updates of random keys held, each backend against dicts and the raw loop
    ("fill.py", ("--updates", "20000"), ("updates of random keys", "round 1 disk", "updates/s", "x rocksdb")),
    # a session window's, a time window's and an as-of join's copy added and released on both
    # backends, each move's groups after the pause; exit 1 if not exact
    ("rescale_ops.py", (), ("session_window  memory", "session_window  disk", "window          memory",
                            "window          disk", "join_asof       memory", "join_asof       disk",
                            "deferred", "exact")),
    # a time window's checkpoints in one process: the barrier's stall, the writer beside the PE
    ("ckpt_stall.py", ("--op", "window"), ("10,000 keys on memory", "barrier ms", "max gap ms")),
    ("keyed_operators.py", (), ("count_window", "session_window", "latest", "process", "join_asof", "lookup",
                                " join ", "over_window", "pattern", "ep_patterns", "ep_over",
                                "changelog_aggregate", "memory/dict", "live/dict", "load average")),
    pytest.param("postgres_cdc.py", (), ("output checked: each change once", "bare get_changes loop",
                                         "ratio source/bare"), marks=pytest.mark.database),
    pytest.param("kafka.py", (), ("(a) plain confluent-kafka loop", "ratio", "(c) the same, checkpoints every 1 s",
                                  "(d) (c) with the exactly-once sink", "(e) lag: a backlog of", "machine load"),
                 marks=pytest.mark.broker),
]))
def test_benchmark_quick_runs_and_prints_its_figures(quick_runs, script, args, expected):
    result = quick_runs[_command(script, *args)].result()
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-4000:]
    for line in expected:
        assert line in result.stdout, result.stdout[-3000:]
    if script == "policies.py":
        row = next(r for r in result.stdout.splitlines() if r.startswith("5-op chain, 4x bottleneck    rate "))
        assert row.split()[5:8] == ["1", "1", "2"], row     # one action, at interval 1, bp-free from 2
    if script == "kafka.py":
        # the burst is drained (within its target or late, as the machine allows): every record reached the sink
        assert "not drained" not in result.stdout, result.stdout[-2000:]


@pytest.mark.parametrize("script, expected", [
    ("fusion.py", ("hand loop, tuples", "numpy over columns", "unfused, one PE per operator")),
    ("columnar.py", ("columnar on 1 worker (deploy)", "numpy over columns")),
    ("channel.py", ("raw socket + pickle", "pescheduler", "p99", "raw socket (IPC bytes)")),
])
def test_speed_benchmarks_quick_check_every_variant_output(quick_runs, script, expected):
    # Each variant's output is asserted equal to the hand loop's inside the script (exit 1 if not).
    result = quick_runs[_command(script)].result()
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-4000:]
    for line in expected:
        assert line in result.stdout, result.stdout[-3000:]


def test_state_benchmark_quick_prints_every_part(quick_runs):
    """bench/state.py --quick (K = 10^3, 10^4): both backends, the window's snapshot, the live table,
    the checkpoints of keyed state, and issue 30's table (K = 10^3) with its goals marked."""
    result = quick_runs[_command("state.py")].result()
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-4000:]
    rows = result.stdout.splitlines()
    for k, parts in (("1000", 4), ("10000", 2)):
        for backend in ("dict", "memory", "disk"):
            assert any(r.split()[:2] == [k, backend] for r in rows), result.stdout[-3000:]
        for backend in ("memory", "disk"):                  # parts 1, 4 (and 3 and 6 at 10^3): a row each
            assert sum(r.split()[:2] == [k, backend] for r in rows) == parts, result.stdout[-3000:]
    for part in ("2. time window", "3. live", "4. checkpoints of keyed state", "5. time window on both backends",
                 "6. issue 30's table"):
        assert part in result.stdout, result.stdout[-3000:]
    table = rows[next(i for i, r in enumerate(rows) if r.startswith("6. issue 30's table")):]
    marked = [r for r in table if r.split()[:2] in (["1000", "memory"], ["1000", "disk"])]
    assert len(marked) == 2 and all(" met" in r and "nan" not in r for r in marked), "\n".join(table)
    assert any(r.split()[:2] == ["1000", "dicts"] for r in table), "\n".join(table)   # the plain-dict baseline
    # the binding's raw loop in the same pipeline: its row, and each backend's fill against it
    assert any(r.split()[:2] == ["1000", "rocksdb"] for r in table), "\n".join(table)
    against = [float(m.group(1)) for r in table if (m := re.search(r"the fill: ([\d.]+)x rocksdb's", r))]
    assert len(against) == 2 and all(x > 0 for x in against), "\n".join(table)
    cpu = [r for r in table if "CPU in the steady part" in r]      # each row's cores, its stall read against them
    assert len(cpu) == 4 and all(re.search(r"state worker: loop \d+ \(waited for a CPU \d+\)", r) for r in cpu), \
        "\n".join(table)
