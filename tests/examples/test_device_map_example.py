"""examples/device_map.py, run for real: under xpulaunch on the CPU, and with the environment a
plan for an 8-GPU host gives (the placement is planned; the forward pass falls back to the CPU)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import inventory_path
from xpulaunch import api

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "device_map.py"
XPULAUNCH = str(Path(sys.executable).parent / "xpulaunch")
pytestmark = pytest.mark.slow


def run(argv: list[str], env: dict[str, str]) -> str:
    done = subprocess.run(
        argv, check=False, capture_output=True, text=True, timeout=120, env={**os.environ, **env}
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def test_on_the_cpu_under_xpulaunch() -> None:
    out = run([XPULAUNCH, str(EXAMPLE), "--gpus", "none"], {})
    assert "[0] device map: none (CPU); budgets: {}" in out
    assert "[0] placement: model->cpu" in out
    assert "[0] output (2, 4), sum " in out


@pytest.mark.parametrize(
    ("device_map", "placement"),
    [
        ("sequential", "placement: model->0"),
        ("balanced", "placement: blocks.0->0, blocks.1->1, "),
        ("balanced_low_0", "placement: blocks.0->1, "),
    ],
)
def test_with_a_plan_for_eight_gpus(device_map: str, placement: str) -> None:
    plan = api.plan(
        [sys.executable, str(EXAMPLE)],
        gpus="all",
        device_map=device_map,
        inventory=inventory_path("8x-h100.json"),
        parent_env={},
    )
    env = {k: v for k, v in plan.workers[0].env.items() if v is not None}
    out = run([sys.executable, str(EXAMPLE)], env)
    assert f"device map: {device_map}; budgets: {{0: " in out
    assert placement in out
    assert "those devices are not on this machine" in out
