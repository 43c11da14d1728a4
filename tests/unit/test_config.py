"""Settings: packaged defaults, PESCHEDULER__ environment variables, --config files."""

from __future__ import annotations

import os
import subprocess
import sys

from pescheduler import config


def test_defaults_come_from_the_packaged_yaml():
    assert config.get("batch.size") == 1000
    assert config.get_seconds("monitor.interval") == 1.0


def test_short_environment_variables_are_honoured():
    env = {**os.environ, "PESCHEDULER__BATCH__SIZE": "500", "PESCHEDULER__MONITOR__INTERVAL": "250ms"}
    out = subprocess.run([sys.executable, "-c", "from pescheduler import config; "
                          "print(config.get('batch.size'), config.get_seconds('monitor.interval'))"],
                         env=env, capture_output=True, text=True, check=True, timeout=60)
    assert out.stdout.split() == ["500", "0.25"]


def test_config_file_with_or_without_the_top_level(tmp_path):
    import copy

    import dask

    saved = copy.deepcopy(dask.config.config)
    try:
        (tmp_path / "a.yaml").write_text("pescheduler:\n  channel:\n    credits: 3\n")
        config.load_file(str(tmp_path / "a.yaml"))
        assert config.get("channel.credits") == 3
        (tmp_path / "b.yaml").write_text("channel:\n  credits: 5\n")
        config.load_file(str(tmp_path / "b.yaml"))
        assert config.get("channel.credits") == 5
    finally:
        dask.config.config.clear()
        dask.config.config.update(saved)
    assert config.get("channel.credits") == 8
