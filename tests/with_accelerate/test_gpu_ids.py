"""accelerate's gpu_ids in the numbering of the child's runtime, as `accelerate launch` hands
them over: it writes them into ZE_AFFINITY_MASK (XPU) or CUDA_VISIBLE_DEVICES and leaves the
runtime to read them (accelerate/utils/launch.py). Each plan's children are re-derived from
their environments and compared with what accelerate's own children would see, read through
the same runtime models from the environment accelerate builds."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from accelerate_configs import config_text

from helpers import inventory_path, load_inventory
from xpulaunch.core.plan import LaunchRequest, make_plan
from xpulaunch.core.visibility import parent_visible
from xpulaunch.errors import SelectionError
from xpulaunch.model import Inventory, Plan, Unit, Vendor

MAX = load_inventory("2x-max1550.json")
CARD0, CARD1 = MAX.of(Vendor.INTEL)
H100 = load_inventory("8x-h100.json")
XPULAUNCH = str(Path(sys.executable).parent / "xpulaunch")


def accelerate_child_env(gpu_ids: str, parent: dict[str, str]) -> dict[str, str]:
    """The visibility part of what accelerate's multi-GPU launcher gives its children, from
    accelerate's own function (prepare_multi_gpu_env), with the accelerator answered as on an
    XPU host (is_xpu_available until 1.15; torch's accelerator type from 1.16)."""
    from unittest import mock

    from accelerate.commands.launch import _validate_launch_command, launch_command_parser
    from accelerate.utils import launch as accelerate_utils

    argv = ["--multi_gpu", "--num_processes", "2", "--gpu_ids", gpu_ids, "train.py"]
    args, _, _ = _validate_launch_command(launch_command_parser().parse_args(argv))
    if hasattr(accelerate_utils, "get_torch_accelerator_backend"):
        on_xpu = mock.patch.object(
            accelerate_utils, "get_torch_accelerator_backend", return_value=("xpu", None)
        )
    else:
        on_xpu = mock.patch.object(accelerate_utils, "is_xpu_available", return_value=True)
    with on_xpu:
        env = accelerate_utils.prepare_multi_gpu_env(args)
    return {**parent, "ZE_AFFINITY_MASK": env["ZE_AFFINITY_MASK"]}


def seen(inventory: Inventory, vendor: Vendor, env: dict[str, str]) -> set[Unit]:
    return set(parent_visible(inventory, vendor, env, hierarchy=None).units)


def plan_with(gpu_ids: str, parent: dict[str, str], inventory: Inventory = MAX) -> Plan:
    request = LaunchRequest(argv=("x",), gpu_ids=gpu_ids, nproc_per_node=None, isolate=True)
    return make_plan(request, inventory, parent)


@pytest.mark.parametrize(
    ("gpu_ids", "parent", "expected"),
    [
        ("0,1", {}, {Unit(CARD0, 0), Unit(CARD0, 1)}),  # FLAT by default: two tiles of card 0
        ("1,3", {}, {Unit(CARD0, 1), Unit(CARD1, 1)}),
        ("2", {"ZE_FLAT_DEVICE_HIERARCHY": "FLAT"}, {Unit(CARD1, 0)}),
        ("0,1", {"ZE_FLAT_DEVICE_HIERARCHY": "COMPOSITE"}, {Unit(CARD0), Unit(CARD1)}),
    ],
)
def test_gpu_ids_name_what_accelerates_children_would_see(
    gpu_ids: str, parent: dict[str, str], expected: set[Unit]
) -> None:
    theirs = seen(MAX, Vendor.INTEL, accelerate_child_env(gpu_ids, parent))
    assert theirs == expected  # the hand-written expectation agrees with accelerate's env
    plan = plan_with(gpu_ids, parent)
    assert set(plan.devices) == expected
    ours: set[Unit] = set()
    for worker in plan.workers:
        ours |= seen(MAX, Vendor.INTEL, worker.child_env(parent))
    assert ours == theirs
    assert any("gpu_ids" in note and "ZE_AFFINITY_MASK" in note for note in plan.notes)


def test_gpu_ids_past_the_last_tile_are_refused_with_what_is_valid() -> None:
    with pytest.raises(SelectionError, match=r"name no device.*valid: 0-3 \(tiles, FLAT\)"):
        plan_with("4,5", {})


def test_nvidia_gpu_ids_are_cuda_indices() -> None:
    plan = plan_with("6,2", {}, H100)
    assert [u.device.index for u in plan.devices] == [6, 2]


def test_a_user_gpus_wins_over_the_files_gpu_ids(tmp_path: Path) -> None:
    config = tmp_path / "xpu.yaml"
    config.write_text(config_text("multi-xpu-ids"))
    base = [XPULAUNCH, "run", "--accelerate-config", str(config), "--inventory"]
    base += [str(inventory_path("2x-max1550.json")), "--dry-run", "--json"]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ZE_", "ONEAPI"))}

    def devices(*extra: str) -> list[tuple[int, int | None]]:
        done = subprocess.run(
            [*base, *extra, "--", "/bin/true"], capture_output=True, text=True, env=env,
            timeout=120, check=False,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        return [(d["index"], d["tile"]) for d in json.loads(done.stdout)["devices"]]

    assert devices() == [(0, 0), (0, 1)]  # the file's gpu_ids 0,1: card 0's tiles
    assert devices("--gpus", "device=1") == [(1, 0), (1, 1)]  # --gpus names card 1
