"""An operator plug-in installed as its own distribution is found by entry point and runs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

DIST = Path(__file__).parent.parent / "data" / "plugin_dist"


@pytest.fixture(scope="module")
def plugin_path(tmp_path_factory):
    """pip-install the plug-in distribution into a private directory (not the test environment)."""
    target = tmp_path_factory.mktemp("site")
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
                    "--target", str(target), str(DIST)], check=True, timeout=300)
    return target


def run(args, plugin_path, cwd):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(plugin_path), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, "-m", "pescheduler", *args], capture_output=True, text=True,
                          env=env, cwd=cwd, timeout=300)


def test_plugins_lists_the_installed_distribution(plugin_path, tmp_path):
    result = run(["plugins"], plugin_path, tmp_path)
    assert result.returncode == 0, result.stderr
    assert "reverse" in result.stdout and "pescheduler-reverse" in result.stdout


def test_deploy_runs_the_plugin_operator(plugin_path, tmp_path):
    out = tmp_path / "reverse.jsonl"
    app = tmp_path / "app.py"
    app.write_text((DIST / "app.py").read_text().replace('"out/reverse.jsonl"', repr(str(out))))
    result = run(["deploy", str(app), "--workers", "2"], plugin_path, tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    words = [json.loads(line)["w"] for line in out.read_text().splitlines()]
    assert sorted(words) == ["ksad", "maerts", "yggulp"]
