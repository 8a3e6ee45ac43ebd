"""--accelerate-config gives what accelerate launch computes, checked with accelerate's own
launch functions on the same files (not with a copy of our mapping)."""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
import yaml
from accelerate_configs import CONFIGS, config_text

from xpulaunch.errors import UsageError
from xpulaunch.integrations.accelerate_config import translate
from xpulaunch.integrations.accelerate_env import launch_env
from xpulaunch.integrations.accelerate_files import installed_release

RELEASE = installed_release()  # whose launch functions the expectations come from
assert RELEASE is not None, "the dev extra installs accelerate"

# Set by our plan, not by the accelerate env: masks and the rendezvous address. accelerate's
# NCCL_* for RTX 4000 cards come from its launcher, not from these functions.
OURS = {"MASTER_ADDR", "MASTER_PORT", "CUDA_VISIBLE_DEVICES", "ZE_AFFINITY_MASK"}


def accelerate_launch(path: Path) -> tuple[argparse.Namespace, dict[str, str]]:
    """What `accelerate launch --config_file path train.py` computes, up to starting torchrun:
    its launch arguments and the variables it adds to the children's environment. FP8 is
    answered as available (it needs Transformer Engine or torchao, for accelerate launch as
    for the job; what it sets does not depend on them)."""
    from accelerate.commands.launch import _validate_launch_command, launch_command_parser
    from accelerate.utils import launch as accelerate_utils

    parsed = launch_command_parser().parse_args(["--config_file", str(path), "train.py"])
    args, defaults, precision_from_file = _validate_launch_command(parsed)
    with mock.patch.object(accelerate_utils, "is_fp8_available", return_value=True):
        if args.use_deepspeed:
            fields = [*defaults.deepspeed_config]
            fields += ["mixed_precision"] if precision_from_file else []
            args.deepspeed_fields_from_accelerate_config = ",".join(fields)
            _, env = accelerate_utils.prepare_deepspeed_cmd_env(args)
        elif args.use_fsdp or args.use_megatron_lm or args.multi_gpu:
            env = accelerate_utils.prepare_multi_gpu_env(args)
        else:
            _, env = accelerate_utils.prepare_simple_launcher_cmd_env(args)
    added = {k: v for k, v in env.items() if os.environ.get(k) != v and k not in OURS}
    return args, added


def write_config(tmp_path: Path, name: str) -> Path:
    path = tmp_path / f"{name}.yaml"
    path.write_text(config_text(name))
    return path


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_the_same_variables_as_accelerate_launch(
    name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    monkeypatch.setenv("PYTHONPATH", "/opt/lib")  # DeepSpeed jobs get the launch dir added
    path = write_config(tmp_path, name)
    _, expected = accelerate_launch(path)
    config = yaml.safe_load(path.read_text())
    ours = translate(
        config, dict(os.environ), source=str(path), cwd=os.path.abspath("."), accelerate=RELEASE
    )
    assert ours.env == expected


@pytest.mark.parametrize(
    ("name", "processes"),
    [("multi-gpu-dynamo", "2"), ("fsdp", "4"), ("megatron", "4"), ("deepspeed", "2")],
)
def test_processes_per_node_as_accelerate_gives_torchrun(
    name: str, processes: str, tmp_path: Path
) -> None:
    path = write_config(tmp_path, name)
    args, _ = accelerate_launch(path)
    ours = translate(yaml.safe_load(path.read_text()), {}, source=str(path))
    assert ours.options["nproc_per_node"] == args.nproc_per_node == processes


def test_two_machines_become_the_multi_node_options(tmp_path: Path) -> None:
    path = write_config(tmp_path, "two-machines")
    args, _ = accelerate_launch(path)
    ours = translate(yaml.safe_load(path.read_text()), {}, source=str(path)).options
    assert (ours["nproc_per_node"], ours["nnodes"], ours["node_rank"]) == (
        args.nproc_per_node,
        args.nnodes,
        args.node_rank,
    )
    assert f"{ours['master_addr']}:{ours['master_port']}" == args.rdzv_endpoint
    assert ours["gpus"] == "4"  # the 4 best free devices of this node


@pytest.mark.parametrize(
    ("name", "gpus", "backend", "gpu_ids"),
    [
        ("single", "auto", None, None),
        ("multi-cpu", "none", None, None),
        ("multi-gpu-dynamo", "2", None, None),
        ("multi-xpu-ids", "all", "xpu", "0,1"),
    ],
)
def test_devices(name: str, gpus: str, backend: str | None, gpu_ids: str | None) -> None:
    config: dict[str, Any] = yaml.safe_load(config_text(name))
    launch = translate(config, {}, source="c.yaml")
    assert (launch.options["gpus"], launch.options.get("backend")) == (gpus, backend)
    assert launch.gpu_ids == gpu_ids


def test_one_gpu_id_is_left_to_the_plan_to_read() -> None:
    config = yaml.safe_load(config_text("single")) | {"gpu_ids": 3}
    assert translate(config, {}, source="c.yaml").gpu_ids == "3"


def test_gpu_ids_under_a_parent_mask_are_named() -> None:
    config = yaml.safe_load(config_text("multi-xpu-ids"))
    launch = translate(config, {"ZE_AFFINITY_MASK": "2,3"}, source="c.yaml")
    assert launch.warnings == (
        "gpu_ids 0,1 are read as accelerate launch's children read them, and "
        "ZE_AFFINITY_MASK=2,3 restricts what may be handed out (accelerate launch would "
        "replace that mask with gpu_ids)",
    )


@pytest.mark.parametrize(
    ("extra", "named"),
    [
        ({"rdzv_backend": "c10d"}, "rdzv_backend='c10d'"),
        ({"enable_cpu_affinity": True}, "enable_cpu_affinity=True"),
        ({"downcast_bf16": "yes"}, "downcast_bf16='yes'"),
        ({"mpirun_config": {"mpirun_hostfile": "/h"}}, "mpirun_config={'mpirun_hostfile': '/h'}"),
    ],
)
def test_keys_not_honoured_are_named(extra: dict[str, object], named: str) -> None:
    config = yaml.safe_load(config_text("multi-cpu")) | extra
    assert translate(config, {}, source="c.yaml").ignored == (named,)


def test_what_accelerate_config_writes_is_all_honoured() -> None:
    for name in CONFIGS:
        config = yaml.safe_load(config_text(name))
        assert translate(config, {}, source="c.yaml").ignored == (), name


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (
            {"num_procesess": 2},
            "c.yaml: unknown key 'num_procesess'; did you mean 'num_processes'?",
        ),
        ({"distributed_type": "TPU"}, "c.yaml: distributed_type 'TPU': expected one of NO, "),
        (
            {"compute_environment": "AMAZON_SAGEMAKER"},
            "c.yaml: compute_environment 'AMAZON_SAGEMAKER': xpulaunch runs LOCAL_MACHINE",
        ),
        (
            {"mixed_precision": "fp4"},
            "c.yaml: mixed_precision 'fp4': expected one of no, fp8, fp16, bf16",
        ),
        (
            {"dynamo_config": {"dynamo_backend": "TURBO"}},
            "c.yaml: dynamo_backend 'TURBO': expected one of NO, EAGER",
        ),
        (
            {"distributed_type": "FSDP", "fsdp_config": {"fsdp_sync_module_states": False}},
            "c.yaml: fsdp_cpu_ram_efficient_loading needs fsdp_sync_module_states: true",
        ),
    ],
)
def test_bad_configs_name_file_and_key(extra: dict[str, object], message: str) -> None:
    config = yaml.safe_load(config_text("multi-cpu")) | extra
    with pytest.raises(UsageError) as caught:
        translate(config, {}, source="c.yaml")
    assert str(caught.value).startswith(message)


def test_num_processes_left_to_the_command_line_is_asked_for() -> None:
    config = {"distributed_type": "MULTI_GPU"}
    with pytest.raises(UsageError, match="num_processes is not set; give --nproc-per-node"):
        translate(config, {}, source="c.yaml")


def test_one_thread_per_process_without_omp_num_threads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    path = write_config(tmp_path, "multi-gpu-dynamo")
    _, expected = accelerate_launch(path)
    ours = translate(
        yaml.safe_load(path.read_text()), dict(os.environ), source=str(path), accelerate=RELEASE
    )
    assert ours.env["OMP_NUM_THREADS"] == expected["OMP_NUM_THREADS"] == "1"


def test_no_distribution_is_one_process_whatever_the_count(tmp_path: Path) -> None:
    # accelerate launch runs distributed_type NO with its simple launcher: one process
    path = tmp_path / "no.yaml"
    config: dict[str, Any] = {**yaml.safe_load(config_text("single")), "num_processes": 2}
    path.write_text(yaml.safe_dump(config))
    args, _ = accelerate_launch(path)
    assert not (args.multi_gpu or args.use_deepspeed or args.use_fsdp)  # the simple launcher
    launch = translate(config, {}, source=str(path))
    assert launch.options["nproc_per_node"] == "1"
    assert launch.warnings == (
        "distributed_type NO: one process, as accelerate launch starts; num_processes 2 is for "
        "a distributed type (MULTI_GPU, MULTI_XPU, MULTI_CPU)",
    )
    mine = translate(config, {}, source=str(path), nproc_per_node=3)  # --nproc-per-node 3
    assert (mine.options["nproc_per_node"], mine.warnings) == ("3", ())


@pytest.mark.parametrize("kind", ["MULTI_GPU", "MULTI_XPU"])
def test_several_processes_on_one_gpu_id_are_refused_as_accelerate_does(
    kind: str, tmp_path: Path
) -> None:
    path = tmp_path / "one-id.yaml"
    config = yaml.safe_load(config_text("multi-gpu-dynamo")) | {"distributed_type": kind,
                                                                "gpu_ids": "0"}  # fmt: skip
    path.write_text(yaml.safe_dump(config))
    with pytest.raises(ValueError, match="Less than two GPU ids"):
        accelerate_launch(path)
    with pytest.raises(UsageError) as caught:
        translate(config, {}, source="c.yaml")
    assert str(caught.value) == (
        f"c.yaml: gpu_ids '0': distributed_type {kind} needs at least two GPU ids, or all (for "
        "one GPU: distributed_type NO)"
    )


def test_use_cpu_under_multi_gpu_gets_what_multi_cpu_gets(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The variables accelerate's own launcher gives the same file as MULTI_CPU (with
    ACCELERATE_USE_CPU, which makes the processes one job), and the process count it asks."""
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    text = config_text("multi-gpu-dynamo").replace("use_cpu: false", "use_cpu: true")
    as_multi_cpu = tmp_path / "cpu.yaml"
    as_multi_cpu.write_text(
        text.replace("distributed_type: MULTI_GPU", "distributed_type: MULTI_CPU")
    )
    _, expected = accelerate_launch(as_multi_cpu)
    assert expected["ACCELERATE_USE_CPU"] == "True"
    ours = translate(yaml.safe_load(text), dict(os.environ), source="c.yaml", accelerate=RELEASE)
    assert ours.env == expected
    assert (ours.options["nproc_per_node"], ours.options["gpus"]) == ("2", "none")
    assert any("one MULTI_CPU job" in w for w in ours.warnings)


@pytest.mark.parametrize(
    ("release", "configured", "expected"),
    [
        ((1, 15), None, "False"),  # 1.15's parser default: static shapes
        ((1, 16), None, None),  # 1.16 leaves it to torch.compile: no variable
        ((1, 15), True, "True"),
        ((1, 16), False, "False"),
    ],
)
def test_dynamo_use_dynamic_follows_the_workers_accelerate(
    release: tuple[int, int], configured: bool | None, expected: str | None
) -> None:
    """The installed accelerate is compared above; the other release's default is the one its
    launch.py wrote (ACCELERATE_DYNAMO_USE_DYNAMIC always until 1.15, only when set from 1.16)."""
    args = {
        "distributed_type": "MULTI_GPU",
        "mixed_precision": "no",
        "dynamo_use_dynamic": configured,
    }
    env = launch_env(args, "multi_gpu", {}, accelerate=release)
    assert env.get("ACCELERATE_DYNAMO_USE_DYNAMIC") == expected


@pytest.mark.parametrize(
    ("version", "release"),
    [("1.16.0", (1, 16)), ("1.15.0.dev0", (1, 15)), ("2.0rc1", None), ("1", None), (None, None)],
)
def test_the_installed_release_is_read_from_package_metadata(
    version: str | None, release: tuple[int, int] | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """None (not installed, or a version we cannot order) makes the CLI take NEWEST."""
    import importlib.metadata

    def installed(name: str) -> str:
        assert name == "accelerate"
        if version is None:
            raise importlib.metadata.PackageNotFoundError(name)
        return version

    monkeypatch.setattr(importlib.metadata, "version", installed)
    assert installed_release() == release
