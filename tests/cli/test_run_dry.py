"""``xpulaunch run --dry-run`` through the installed entry point."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import inventory_path, write_inventory

XPULAUNCH = str(Path(sys.executable).parent / "xpulaunch")


def xpulaunch(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [XPULAUNCH, *args],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, **(env or {})},
    )


def test_cpu_only_machine_plans_a_cpu_run_and_says_why() -> None:
    cpu = str(inventory_path("cpu-only.json"))
    done = xpulaunch(
        "run", "--dry-run", "--gpus", "auto", "--inventory", cpu, "--", "python", "train.py"
    )
    assert done.returncode == 0, done.stderr
    assert "backend: cpu" in done.stdout
    assert "no usable accelerator is visible: running on the CPU" in done.stdout


def test_json_plan_document_for_the_contract_example() -> None:
    done = xpulaunch(
        "run",
        "--dry-run",
        "--json",
        "--inventory",
        str(inventory_path("2x-max1550.json")),
        "--gpus",
        "1.0",
        "--",
        "python",
        "train.py",
    )
    assert done.returncode == 0, done.stderr
    plan = json.loads(done.stdout)
    assert plan["schema"] == "xpulaunch.plan/1" and plan["backend"] == "xpu"
    assert plan["devices"] == [
        {
            "vendor": "intel",
            "index": 1,
            "tile": 0,
            "pci_bus_id": "0000:9a:00.0",
            "uuid": "00000000-0000-009a-0000-00000bd58086",
            "name": "Intel(R) Data Center GPU Max 1550",
            "memory_total_bytes": 68719476736,
            "memory_free_bytes": None,
        },
    ]
    env = plan["workers"][0]["env"]
    assert env["ZE_FLAT_DEVICE_HIERARCHY"] == "FLAT" and env["ZE_AFFINITY_MASK"] == "2"
    assert env["RANK"] == "0"
    assert env["TORCHELASTIC_MAX_RESTARTS"] == "0"  # no restarts by default
    assert plan["workers"][0]["argv"][1:] == ["train.py"]
    assert plan["set_at_start"] == [
        "XPULAUNCH_JOB_ID", "XPULAUNCH_WORKER", "TORCHELASTIC_RESTART_COUNT",
        "TORCHELASTIC_ERROR_FILE", "XPULAUNCH_HEARTBEAT_FILE",
    ]  # fmt: skip
    assert plan["device_map"] == "sequential" and plan["notes"]


@pytest.mark.parametrize(
    ("options", "value"),
    [
        ([], "0"),
        (["--max-restarts", "2"], "2"),
        (["--restart", "always", "--max-restarts", "-1"], "-1"),
    ],
)
def test_the_plan_shows_the_restart_limit_workers_will_see(options: list[str], value: str) -> None:
    cpu = str(inventory_path("cpu-only.json"))
    args = ("run", "--dry-run", "--inventory", cpu, *options)
    done = xpulaunch(*args, "--json", "--", "python", "x.py")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["workers"][0]["env"]["TORCHELASTIC_MAX_RESTARTS"] == value
    text = xpulaunch(*args, "--", "python", "x.py").stdout
    assert f"TORCHELASTIC_MAX_RESTARTS={value}" in text
    assert (
        "set at start: XPULAUNCH_JOB_ID, XPULAUNCH_WORKER, TORCHELASTIC_RESTART_COUNT, "
        "TORCHELASTIC_ERROR_FILE\n" in text
    )  # XPULAUNCH_HEARTBEAT_FILE only with --heartbeat (it was listed without)
    beating = xpulaunch(*args, "--hang-timeout", "5", "--heartbeat", "--", "python", "x.py")
    assert "TORCHELASTIC_ERROR_FILE, XPULAUNCH_HEARTBEAT_FILE\n" in beating.stdout


@pytest.mark.parametrize(
    ("gpus", "nproc", "said"),
    [
        ("2", "2", "visibility: every worker sees all selected devices, LOCAL_RANK picks one"),
        ("2", "1", "visibility: the worker sees all selected devices"),
        ("1", "1", None),
    ],
)
def test_the_visibility_note_fits_the_number_of_workers(
    gpus: str, nproc: str, said: str | None
) -> None:
    """One worker has no LOCAL_RANK to pick a device by: the note said it had."""
    h200 = str(inventory_path("2x-h200.json"))
    args = ["--inventory", h200, "--gpus", gpus, "--nproc-per-node", nproc]
    done = xpulaunch("run", "--dry-run", "--json", *args, "--", "python", "x.py")
    assert done.returncode == 0, done.stderr
    notes = [n for n in json.loads(done.stdout)["notes"] if n.startswith("visibility: ")]
    assert notes == ([said] if said else [])


def test_default_command_is_run_and_options_may_follow_program(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text("pass\n")
    done = xpulaunch(
        str(script),
        "--dry-run",
        "--json",
        "--gpus",
        "2",
        "--inventory",
        str(inventory_path("2x-h200.json")),
        "--nproc-per-node",
        "auto",
        "--lr",
        "0.1",
    )
    assert done.returncode == 0, done.stderr
    plan = json.loads(done.stdout)
    assert len(plan["workers"]) == 2
    argv = plan["workers"][0]["argv"]
    assert Path(argv[0]).resolve() == Path(sys.executable).resolve()
    assert argv[1:] == [str(script), "--lr", "0.1"]


def test_inventory_from_environment_variable() -> None:
    done = xpulaunch(
        "run",
        "--dry-run",
        "--json",
        "--",
        "python",
        "x.py",
        env={"XPULAUNCH_INVENTORY": str(inventory_path("4x-mi300x.json"))},
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["backend"] == "rocm"


def test_backend_from_environment_variable() -> None:
    done = xpulaunch(
        "run",
        "--dry-run",
        "--json",
        "--inventory",
        str(inventory_path("hybrid-4090-arc.json")),
        "--",
        "python",
        "x.py",
        env={"XPULAUNCH_BACKEND": "xpu"},
    )
    assert json.loads(done.stdout)["backend"] == "xpu"


@pytest.mark.parametrize(
    ("args", "env", "message"),
    [
        (["--gpus", "lots"], {}, "--gpus 'lots': expected auto, all, none"),
        (["--backend", "metal"], {}, "expected auto, cuda, xpu, rocm or cpu"),
        ([], {"XPULAUNCH_BACKEND": "opencl"}, "expected auto, cuda, xpu, rocm or cpu"),
        (["--nproc-per-node", "zero"], {}, "--nproc-per-node: 'zero': expected a count"),
        (["--min-free-memory", "lots"], {}, "is not a size"),
        (["--max-utilization", "200"], {}, "'200' is not a percentage"),
        (["--gpus", "9"], {}, "--gpus 9: only 2 free device(s)"),
        (["--gpus", "0,7"], {}, "--gpus device=7: no such device"),
        (["--gpus", "device=9"], {}, "--gpus device=9: no such device"),
        ([], {"CUDA_VISIBLE_DEVICES": "0,0"}, "CUDA_VISIBLE_DEVICES"),
        (["--bogus"], {}, "No such option '--bogus'"),
        (["--backend", "xpu"], {}, "no Intel GPU on this host"),
    ],
)
def test_bad_input_is_one_line_no_traceback(
    args: list[str], env: dict[str, str], message: str
) -> None:
    inventory = str(inventory_path("2x-h200.json"))
    done = xpulaunch(
        "run", "--dry-run", "--inventory", inventory, *args, "--", "python", "x.py", env=env
    )
    assert done.returncode != 0
    assert done.stdout == ""
    assert done.stderr.count("\n") == 1, done.stderr
    assert done.stderr.startswith("xpulaunch: error: ")
    assert message in done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize(
    ("document", "message"),
    [
        ("{", "not JSON"),
        (
            '{"schema": "xpulaunch.inventory/1", "devices": [{"vendor": "nvidia"}]}',
            "devices[0].index",
        ),
    ],
)
def test_bad_inventory_file(tmp_path: Path, document: str, message: str) -> None:
    bad = tmp_path / "inv.json"
    bad.write_text(document)
    done = xpulaunch("run", "--dry-run", "--inventory", str(bad), "--", "python", "x.py")
    assert done.returncode == 2 and message in done.stderr and "Traceback" not in done.stderr
    missing = xpulaunch(
        "run", "--dry-run", "--inventory", str(tmp_path / "nope.json"), "--", "python", "x.py"
    )
    assert missing.returncode == 2 and "cannot read it" in missing.stderr


def test_debug_shows_the_traceback() -> None:
    done = xpulaunch(
        "run", "--dry-run", "--gpus", "lots", "--", "python", "x.py", env={"XPULAUNCH_DEBUG": "1"}
    )
    assert "Traceback" in done.stderr and "UsageError" in done.stderr


def test_isolated_tiles_of_a_written_inventory(tmp_path: Path) -> None:
    inv = write_inventory(
        tmp_path / "inv.json",
        [
            {"vendor": "intel", "index": 0, "pci_bus_id": "0000:29:00.0", "tiles": 2},
            {"vendor": "intel", "index": 1, "pci_bus_id": "0000:9a:00.0", "tiles": 2},
        ],
    )
    done = xpulaunch(
        "run",
        "--dry-run",
        "--json",
        "--inventory",
        str(inv),
        "--gpus",
        "all",
        "--nproc-per-node",
        "auto",
        "--isolate",
        "--",
        "python",
        "x.py",
    )
    plan = json.loads(done.stdout)
    assert [w["env"]["ZE_AFFINITY_MASK"] for w in plan["workers"]] == ["0", "1", "2", "3"]
    assert [w["env"]["LOCAL_RANK"] for w in plan["workers"]] == ["0", "1", "2", "3"]


def test_a_real_run_says_where_it_runs_and_why_on_the_cpu(tmp_path: Path) -> None:
    cpu = str(inventory_path("cpu-only.json"))
    code = "import os; print('rank', os.environ['RANK'])"
    done = xpulaunch("--inventory", cpu, "--nproc-per-node", "2", "--", sys.executable, "-c", code)
    assert done.returncode == 0, done.stderr
    assert "xpulaunch: cpu: no usable accelerator is visible: running on the CPU; 2 workers" in (
        done.stderr
    )
    assert "rank 0" in done.stdout and "rank 1" in done.stdout
    gpu = xpulaunch("--inventory", str(inventory_path("2x-h200.json")), "--gpus", "1", "--",
                    sys.executable, "-c", "pass")  # fmt: skip
    assert "xpulaunch: cuda on nvidia 0 (0000:00:06.0); 1 worker" in gpu.stderr


def test_a_count_is_handed_out_in_index_order_whatever_the_free_memory(tmp_path: Path) -> None:
    """GPU 3 has the most free memory, then GPU 1: ``--gpus 2`` chooses those two, and rank 0
    gets GPU 1, the lower index, run after run."""
    used = {0: 6, 1: 2, 2: 7, 3: 0}
    inv = write_inventory(
        tmp_path / "inv.json",
        [{"vendor": "nvidia", "index": i, "pci_bus_id": f"0000:{i + 1:02x}:00.0",
          "uuid": f"GPU-{i}", "memory_total_bytes": 80 * 2**30,
          "memory_used_bytes": gib * 2**30} for i, gib in used.items()],
    )  # fmt: skip
    done = xpulaunch("run", "--dry-run", "--json", "--inventory", str(inv), "--gpus", "2",
                     "--nproc-per-node", "auto", "--isolate", "--", "python", "x.py")  # fmt: skip
    assert done.returncode == 0, done.stderr
    plan = json.loads(done.stdout)
    assert [d["index"] for d in plan["devices"]] == [1, 3]
    assert [w["env"]["CUDA_VISIBLE_DEVICES"] for w in plan["workers"]] == ["GPU-1", "GPU-3"]
    assert any("handed out in index order" in note for note in plan["notes"])
