"""Device maps through real accelerate: the placements infer_auto_device_map makes with our
budgets, on a real torch.nn model (no GPU needed: accelerate plans without the devices)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

from helpers import inventory_path
from xpulaunch import api
from xpulaunch.core.devicemap import HEADROOM_FRACTION
from xpulaunch.errors import UsageError
from xpulaunch.integrations.accelerate import (
    budgets,
    dispatch,
    from_pretrained_kwargs,
    infer_device_map,
)

BLOCK_BYTES = (256 * 256 + 256) * 4  # one fp32 Linear(256, 256)
NO_SPLIT = ["Linear"]


class Stack(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(nn.Linear(256, 256) for _ in range(8))
        self.head = nn.Linear(256, 4)


def launched(device_map: str | None, budgets_bytes: list[int]) -> dict[str, str]:
    """A worker's environment as a plan writes it."""
    env = {"XPULAUNCH_BACKEND": "cuda" if device_map else "cpu"}
    if device_map:
        env["XPULAUNCH_DEVICE_MAP"] = device_map
        env["XPULAUNCH_MAX_MEMORY"] = json.dumps({str(i): b for i, b in enumerate(budgets_bytes)})
        env["XPULAUNCH_DEVICES"] = ",".join(f"nvidia:{i}" for i in range(len(budgets_bytes)))
    return env


def per_device(placement: dict[str, int | str]) -> dict[int | str, int]:
    counts: dict[int | str, int] = {}
    for device in placement.values():
        counts[device] = counts.get(device, 0) + 1
    return counts


def test_sequential_with_room_puts_everything_on_the_first_device() -> None:
    placement = infer_device_map(Stack(), launched("sequential", [10**9, 10**9]))
    assert placement == {"": 0}


def test_sequential_fills_each_budget_in_order() -> None:
    room = 3 * BLOCK_BYTES + BLOCK_BYTES // 2  # three blocks a device
    placement = infer_device_map(
        Stack(), launched("sequential", [room, room, room]), no_split_module_classes=NO_SPLIT
    )
    devices = [placement[f"blocks.{i}"] for i in range(8)]
    assert devices == sorted(devices)  # in order, device after device
    blocks = per_device({k: v for k, v in placement.items() if k != "head"})
    assert set(blocks) == {0, 1, 2}
    assert all(count * BLOCK_BYTES <= room for count in blocks.values())  # within each budget


def test_balanced_spreads_over_every_device() -> None:
    placement = infer_device_map(
        Stack(), launched("balanced", [10**9, 10**9]), no_split_module_classes=NO_SPLIT
    )
    counts = per_device(placement)
    assert set(counts) == {0, 1}
    assert abs(counts[0] - counts[1]) <= 2


def test_balanced_low_0_keeps_the_first_device_light() -> None:
    placement = infer_device_map(
        Stack(), launched("balanced_low_0", [10**9] * 3), no_split_module_classes=NO_SPLIT
    )
    counts = per_device(placement)
    assert counts.get(0, 0) < min(counts[1], counts[2])


def test_on_the_cpu_everything_stays_there() -> None:
    model = Stack()
    assert infer_device_map(model, launched(None, [])) == {"": "cpu"}
    assert from_pretrained_kwargs(launched(None, [])) == {"device_map": "cpu"}
    assert dispatch(model, launched(None, [])) is model


def test_a_real_plan_gives_from_pretrained_its_budgets() -> None:
    plan = api.plan(
        ["/bin/true"], gpus="2", inventory=inventory_path("2x-h200.json"), parent_env={}
    )
    env = {k: v for k, v in plan.workers[0].env.items() if v is not None}
    free = [
        u.memory_free_bytes if u.memory_free_bytes is not None else u.memory_total_bytes
        for u in plan.devices
    ]
    expected = {i: int(f * (1 - HEADROOM_FRACTION)) for i, f in enumerate(free) if f}
    assert from_pretrained_kwargs(env) == {"device_map": "balanced", "max_memory": expected}


def test_an_override_must_fit_what_the_probe_saw() -> None:
    env = launched("balanced", [900, 900])
    assert budgets(env, max_memory={1: 1000, "cpu": 5000}) == {0: 900, 1: 1000, "cpu": 5000}
    with pytest.raises(UsageError, match="device 1: 1001 bytes is more than the 1000 bytes"):
        budgets(env, max_memory={1: 1001})
    with pytest.raises(UsageError, match=r"device 2 is not one of this process's devices \(0, 1\)"):
        budgets(env, max_memory={2: 10})


def test_a_device_without_a_probe_figure_takes_the_override_unchecked() -> None:
    env = launched("sequential", [900]) | {"XPULAUNCH_DEVICES": "amd:0,amd:1"}
    assert budgets(env, max_memory={1: 10**12}) == {0: 900, 1: 10**12}


def test_outside_xpulaunch_it_says_so() -> None:
    with pytest.raises(UsageError, match="not started by xpulaunch"):
        from_pretrained_kwargs({})


def test_dispatch_places_the_model_on_the_cpu_the_same_way() -> None:
    """dispatch_model with a planned map on devices that exist: here, the CPU as ``cpu``."""
    torch.manual_seed(0)
    model = Stack()
    placed = dispatch(model, launched(None, []))
    assert next(placed.parameters()).device.type == "cpu"


H200_BUDGET = int(150754820096 * (1 - HEADROOM_FRACTION))  # 2x-h200.json: all of it free


def dry_run_plan(*args: str) -> dict[str, object]:
    """The plan document of ``xpulaunch run --dry-run --json`` on the 2x H200 fixture."""
    xpulaunch = str(Path(sys.executable).parent / "xpulaunch")
    inventory = str(inventory_path("2x-h200.json"))
    done = subprocess.run(
        [xpulaunch, "run", "--dry-run", "--json", "--inventory", inventory, *args, "--", "true"],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
        env=dict(os.environ),
    )
    assert done.returncode == 0, done.stderr
    plan: dict[str, object] = json.loads(done.stdout)
    return plan


def worker_kwargs(plan: dict[str, object]) -> list[dict[str, object]]:
    workers = plan["workers"]
    assert isinstance(workers, list)
    envs = [{k: v for k, v in w["env"].items() if v is not None} for w in workers]
    return [from_pretrained_kwargs(env) for env in envs]


@pytest.mark.parametrize("isolate", [False, True])
def test_each_ddp_rank_gets_the_map_of_its_own_device(isolate: bool) -> None:
    """Not the whole job's ``balanced`` map over both GPUs for every rank (two copies of the
    model, each budget promised twice): each rank its LOCAL_RANK's device, one budget; the
    plan's map is the one the workers get (also under --isolate, where each sees device 0)."""
    plan = dry_run_plan("--gpus", "2", "--nproc-per-node", "auto", *["--isolate"] * isolate)
    assert plan["device_map"] == "sequential"
    assert worker_kwargs(plan) == [
        {"device_map": "sequential", "max_memory": {0: H200_BUDGET}},
        {"device_map": "sequential", "max_memory": {0 if isolate else 1: H200_BUDGET}},
    ]


def test_ranks_that_share_a_device_share_its_budget() -> None:
    plan = dry_run_plan("--gpus", "2", "--nproc-per-node", "4")
    assert [kwargs["max_memory"] for kwargs in worker_kwargs(plan)] == [
        {0: H200_BUDGET // 2},
        {1: H200_BUDGET // 2},
        {0: H200_BUDGET // 2},
        {1: H200_BUDGET // 2},
    ]


def test_one_process_over_both_gpus_keeps_the_balanced_map() -> None:
    plan = dry_run_plan("--gpus", "2")
    assert plan["device_map"] == "balanced"
    budgets_both = {0: H200_BUDGET, 1: H200_BUDGET}
    assert worker_kwargs(plan) == [{"device_map": "balanced", "max_memory": budgets_both}]


def test_the_workers_of_torchs_agent_get_no_map_and_the_helper_says_so() -> None:
    """Under c10d one environment serves every worker: none gets rank 0's device map."""
    plan = dry_run_plan(
        "--gpus",
        "2",
        "--nproc-per-node",
        "2",
        "--rdzv-backend",
        "c10d",
        "--rdzv-endpoint",
        "127.0.0.1:29400",
        "--rdzv-id",
        "x",
    )
    assert plan["device_map"] is None
    with pytest.raises(UsageError, match=r"no device map .* LOCAL_RANK"):
        worker_kwargs(plan)
