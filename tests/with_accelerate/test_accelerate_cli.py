"""``xpulaunch --accelerate-config``: real accelerate programs, real `accelerate launch`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from accelerate_configs import config_text

HERE = Path(__file__).parent
BIN = Path(sys.executable).parent
XPULAUNCH = str(BIN / "xpulaunch")


def run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        list(args),
        check=False,
        capture_output=True,
        text=True,
        timeout=240,
        env={**os.environ, **(env or {})},
    )


def lines(stdout: str, tag: str) -> list[dict[str, object]]:
    found = [line.split(tag + " ", 1)[1] for line in stdout.splitlines() if tag + " " in line]
    return [json.loads(text) for text in found]


@pytest.fixture
def multi_cpu(tmp_path: Path) -> Path:
    path = tmp_path / "cfg.yaml"
    path.write_text(config_text("multi-cpu").replace("debug: true", "debug: false"))
    return path


@pytest.mark.slow
def test_a_real_accelerator_sees_the_configured_job(multi_cpu: Path) -> None:
    done = run(XPULAUNCH, "--accelerate-config", str(multi_cpu), str(HERE / "accelerate_script.py"))
    assert done.returncode == 0, done.stderr
    states = lines(done.stdout, "STATE")
    assert sorted(s["process_index"] for s in states) == [0, 1]
    assert {(s["num_processes"], s["mixed_precision"]) for s in states} == {(2, "bf16")}
    assert {s["distributed_type"] for s in states} == {"DistributedType.MULTI_CPU"}


@pytest.mark.slow
def test_accelerate_launch_gives_the_same_variables(multi_cpu: Path) -> None:
    script = str(HERE / "print_env.py")
    theirs = run(str(BIN / "accelerate"), "launch", "--config_file", str(multi_cpu), script)
    ours = run(XPULAUNCH, "--accelerate-config", str(multi_cpu), script)
    assert theirs.returncode == 0 and ours.returncode == 0, theirs.stderr + ours.stderr
    expected = lines(theirs.stdout, "ENV")
    assert len(expected) == 1  # accelerate's simple launcher starts one process on the CPU
    assert lines(ours.stdout, "ENV") == expected * 2  # we start the two it was asked for


def dry_run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return run(XPULAUNCH, *args, "--gpus", "none", "--dry-run", "--json", "/bin/true", env=env)


def test_the_command_line_wins_over_the_file(multi_cpu: Path) -> None:
    done = dry_run("--accelerate-config", str(multi_cpu), "--nproc-per-node", "3")
    assert done.returncode == 0, done.stderr
    workers = json.loads(done.stdout)["workers"]
    assert len(workers) == 3
    assert workers[0]["env"]["ACCELERATE_MIXED_PRECISION"] == "bf16"


def test_a_process_count_of_the_command_line_takes_as_many_devices(tmp_path: Path) -> None:
    """accelerate launch --num_processes 3 with gpu_ids: all runs 3 processes on 3 devices; the
    file's own count (2) must not leave the third worker without a device of its own."""
    path = tmp_path / "multi-gpu.yaml"
    path.write_text(config_text("multi-gpu-dynamo"))  # num_processes: 2, gpu_ids: all
    inventory = HERE.parent / "fixtures" / "inventories" / "8x-h100.json"
    done = run(XPULAUNCH, "--accelerate-config", str(path), "--nproc-per-node", "3",
               "--inventory", str(inventory), "--dry-run", "--json", "/bin/true")  # fmt: skip
    assert done.returncode == 0, done.stderr
    plan = json.loads(done.stdout)
    assert (len(plan["workers"]), len(plan["devices"])) == (3, 3)


def test_default_is_accelerates_default_file(multi_cpu: Path, tmp_path: Path) -> None:
    home = tmp_path / "hf"
    (home / "accelerate").mkdir(parents=True)
    (home / "accelerate" / "default_config.yaml").write_text(multi_cpu.read_text())
    done = dry_run("--accelerate-config", "default", env={"HF_HOME": str(home)})
    assert done.returncode == 0, done.stderr
    assert len(json.loads(done.stdout)["workers"]) == 2


def test_a_key_not_honoured_is_named_in_one_warning(multi_cpu: Path) -> None:
    multi_cpu.write_text(multi_cpu.read_text() + "rdzv_backend: c10d\nenable_cpu_affinity: true\n")
    done = dry_run("--accelerate-config", str(multi_cpu))
    assert done.returncode == 0, done.stderr
    warning = [line for line in done.stderr.splitlines() if "warning" in line]
    assert warning == [
        f"xpulaunch: warning: {multi_cpu}: not honoured: rdzv_backend='c10d', "
        "enable_cpu_affinity=True"
    ]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("distributed_type: MULTI_CPU\nnum_procs: 2\n", "unknown key 'num_procs'; did you mean"),
        ("distributed_type: [MULTI_CPU\n", "line 2: expected ',' or ']', but got '<stream end>'"),
        ("- a list\n", "expected a mapping of keys to values"),
    ],
)
def test_a_bad_file_is_one_line_with_file_and_key(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    done = dry_run("--accelerate-config", str(path))
    assert done.returncode == 2
    assert done.stderr.startswith(f"xpulaunch: error: --accelerate-config {path}: ")
    assert message in done.stderr
    assert len(done.stderr.splitlines()) == 1


def test_a_missing_file_says_how_to_make_one(tmp_path: Path) -> None:
    done = dry_run("--accelerate-config", str(tmp_path / "nope.yaml"))
    assert done.returncode == 2
    assert "cannot read it (No such file or directory); run `accelerate config`" in done.stderr


def test_the_plan_says_what_the_file_asked_for(multi_cpu: Path) -> None:
    done = dry_run("--accelerate-config", str(multi_cpu))
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["notes"][-1] == (
        f"accelerate config {multi_cpu}: MULTI_CPU, 2 processes, mixed precision bf16; "
        "the workers get the variables accelerate launch would set"
    )


def test_the_file_wins_over_project_defaults(multi_cpu: Path, tmp_path: Path) -> None:
    (tmp_path / "xpulaunch.toml").write_text("nproc-per-node = 3\nmax-restarts = 1\n")
    done = subprocess.run(
        [XPULAUNCH, "--accelerate-config", str(multi_cpu), "--dry-run", "--json", "/bin/true"],
        cwd=tmp_path, check=False, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    workers = json.loads(done.stdout)["workers"]
    assert len(workers) == 2  # num_processes, not the project's 3
    assert workers[0]["env"]["TORCHELASTIC_MAX_RESTARTS"] == "1"  # what the file leaves alone


README_CONFIG = """compute_environment: LOCAL_MACHINE
distributed_type: MULTI_GPU
gpu_ids: all
mixed_precision: bf16
num_machines: 1
num_processes: 2
use_cpu: {use_cpu}
"""


@pytest.mark.slow
def test_use_cpu_under_multi_gpu_is_one_job_of_its_processes(tmp_path: Path) -> None:
    """accelerate launch starts these as two jobs of one process each ("0 of 1" twice,
    both writing the same checkpoints); here they are one MULTI_CPU job of two."""
    path = tmp_path / "a.yaml"
    path.write_text(README_CONFIG.format(use_cpu="true"))
    done = run(XPULAUNCH, "--accelerate-config", str(path), str(HERE / "accelerate_script.py"))
    assert done.returncode == 0, done.stderr
    states = lines(done.stdout, "STATE")
    assert sorted((s["process_index"], s["num_processes"]) for s in states) == [(0, 2), (1, 2)]
    assert {s["distributed_type"] for s in states} == {"DistributedType.MULTI_CPU"}
    assert "use_cpu: true under distributed_type MULTI_GPU" in done.stderr


@pytest.mark.parametrize("dry_run", [True, False])
def test_no_accelerator_for_the_files_gpus_names_the_file(tmp_path: Path, dry_run: bool) -> None:
    """The README's file on a host without GPUs: the error is about the file's keys, not a
    --gpus the user never typed, and says how to run it on the CPU."""
    path = tmp_path / "accelerate_config.yaml"
    path.write_text(README_CONFIG.format(use_cpu="false"))
    (tmp_path / "train.py").write_text("print('ran')\n")
    empty = tmp_path / "none.json"
    empty.write_text('{"schema": "xpulaunch.inventory/1", "devices": []}')
    args = ["--accelerate-config", str(path), *(["--dry-run"] if dry_run else []), "train.py"]
    env = {**os.environ, "XPULAUNCH_INVENTORY": str(empty)}
    done = subprocess.run(
        [XPULAUNCH, *args],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
        env=env,
    )
    assert done.returncode == 1 and "ran" not in done.stdout
    line = done.stderr.strip()
    keys = "num_processes 2, distributed_type MULTI_GPU, gpu_ids all, use_cpu false"
    assert line.startswith(f"xpulaunch: error: {path} ({keys}): no usable accelerator")
    assert "--gpus" not in line and "use_cpu: true" in line and "MULTI_CPU" in line
