"""What ``run`` and ``devices`` hand their functions for a command line: click parses it, with
our options anywhere before ``--`` and values from the environment where an option has one."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click
import pytest

from xpulaunch.cli.devices import devices
from xpulaunch.cli.run import run
from xpulaunch.launch.request import Backoff

HERE = Path(__file__).resolve().parent
A_FILE = str(HERE / "test_run_options.py")
A_DIR = str(HERE)


def values(command: click.Command, *args: str) -> dict[str, Any]:
    """The keyword arguments ``command``'s function gets for ``args``."""
    return dict(command.make_context(command.name or "", list(args)).params)


def refused(command: click.Command, *args: str) -> click.ClickException:
    with pytest.raises(click.ClickException) as caught:
        command.make_context(command.name or "", list(args))
    return caught.value


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["train.py", "--gpus", "auto"], {"gpus": "auto", "program": ("train.py",)}),
        (
            ["examples/train.py", "--gpus", "auto", "--nproc-per-node", "2"],
            {"nproc_per_node": 2, "program": ("examples/train.py",)},
        ),
        (
            ["--gpus", "2", "--nproc-per-node", "auto", "train.py", "--lr", "0.1"],
            {"gpus": "2", "nproc_per_node": None, "program": ("train.py", "--lr", "0.1")},
        ),
        (
            [
                "train.py",
                "--gpus=0,2",
                "--isolate",
                "--restart",
                "on-failure",
                "--max-restarts",
                "5",
            ],
            {"gpus": "0,2", "isolate": True, "restart": "on-failure", "max_restarts": 5},
        ),
        (
            ["--dry-run", "--json", "--inventory", A_FILE, "--", "python", "-c", "pass"],
            {
                "dry_run": True,
                "as_json": True,
                "inventory": A_FILE,
                "program": ("python", "-c", "pass"),
            },
        ),
        (
            ["train.py", "--gang", "--no-gang", "--grace", "2.5", "--backoff", "0", "--no-color"],
            {"gang": False, "grace": 2.5, "backoff": Backoff(0, 30, 2), "no_color": True},
        ),
        (
            ["train.py", "--log-dir", A_DIR, "--ranks", "0,2", "--wait", "--wait-timeout", "30"],
            {"log_dir": A_DIR, "ranks": frozenset({"0", "2"}), "wait": True, "wait_timeout": 30.0},
        ),
        (
            ["train.py", "--master-port", "29500", "--device-map", "balanced", "--shared"],
            {"master_port": 29500, "device_map": "balanced", "shared": True},
        ),
        (
            [
                "train.py",
                "--min-free-memory",
                "8GiB",
                "--max-utilization",
                "10",
                "--lock-dir",
                "/x",
            ],
            {"min_free_memory": 8 * 2**30, "max_utilization": 10.0, "lock_dir": "/x"},
        ),
        (["train.py", "--local-ranks-filter", "1"], {"ranks": frozenset({"1"})}),
        (
            ["train.py", "--", "--gpus", "7"],
            {"gpus": "auto", "program": ("train.py", "--gpus", "7")},
        ),
    ],
)
def test_everyday_run_lines(args: list[str], expected: dict[str, Any]) -> None:
    got = values(run, *args)
    assert {key: got[key] for key in expected} == expected


def test_run_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("XPULAUNCH_LOCK_DIR", raising=False)  # the conftest sets one per test
    got = values(run, "train.py")
    assert got == {
        "program": ("train.py",), "gpus": "auto", "backend": "auto", "dry_run": False,
        "as_json": False, "inventory": None, "min_free_memory": None, "max_utilization": None,
        "nproc_per_node": 1, "isolate": False, "device_map": None, "master_addr": None,
        "master_port": None, "cpu_bind": "none", "restart": None, "max_restarts": None,
        "backoff": Backoff(1, 30, 2),
        "stable_window": 60.0, "gang": None, "grace": 10.0, "log_dir": None,
        "log_layout": "xpulaunch", "log_run_id": None, "ranks": None,
        "no_color": False, "lock_dir": None, "shared": False, "wait": False,
        "wait_timeout": None, "slots_per_gpu": None, "gpu_memory": None,
        "accelerate_config": None, "hang_timeout": None,
        "heartbeat": False, "max_runtime": None,
        "events": None, "metrics_port": None, "metrics_host": "127.0.0.1",
        "metrics_interval": 10.0,
        "nnodes": None, "node_rank": None, "rdzv_backend": None,
        "rdzv_endpoint": None, "rdzv_id": None, "join_timeout": 600.0, "rdzv_conf": None,
        "topology": "prefer",
    }  # fmt: skip


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--gpu", "2", "train.py"], "Did you mean '--gpus'?"),
        (["--gpus"], "'--gpus' requires an argument"),
        (["train.py", "--gpus"], "'--gpus' requires an argument"),
        (["--dry-run=1", "train.py"], "does not take a value"),
        (["--master-port", "0", "train.py"], "0 is not in the range 1 to 65535"),
        (["--device-map", "Balanced", "train.py"], "'Balanced' is not one of"),
        (["--log-dir", A_FILE, "train.py"], "is a file"),
        (["--max-restarts", "1.5", "train.py"], "'1.5' is not a whole number"),
        (["--wait-timeout", "-1", "train.py"], "'-1' is not a number of seconds >= 0"),
        (["--dry-run"], "Missing argument 'PROGRAM...'"),
    ],
)
def test_mistakes_are_click_usage_errors(args: list[str], message: str) -> None:
    error = refused(run, *args)
    assert error.exit_code == 2 and message in error.format_message()


def test_environment_variables_count_as_click_reads_them(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XPULAUNCH_GRACE", "2")
    monkeypatch.setenv("XPULAUNCH_RESTART", "always")
    monkeypatch.setenv("XPULAUNCH_LOG_DIR", "")  # set but empty: as if unset
    monkeypatch.setenv("XPULAUNCH_BACKEND", "cuda")
    got = values(run, "train.py")
    assert (got["grace"], got["restart"], got["log_dir"], got["backend"]) == (
        2.0, "always", None, "cuda",
    )  # fmt: skip
    assert values(run, "train.py", "--grace", "3")["grace"] == 3.0  # the command line wins
    monkeypatch.setenv("XPULAUNCH_GRACE", "soon")
    assert "'soon' is not a number of seconds" in refused(run, "train.py").format_message()


@pytest.mark.parametrize(
    ("args", "grace"),
    [(["train.py", "--grace=0.5"], 0.5), (["--grace", "1", "train.py", "--grace=2"], 2.0)],
)
def test_repeated_options_last_one_wins(args: list[str], grace: float) -> None:
    assert values(run, *args)["grace"] == grace


def test_devices_options(monkeypatch: pytest.MonkeyPatch) -> None:
    assert values(devices, "--json") == {
        "as_json": True, "inventory_file": None, "debug": False, "use_torch": False,
        "show_processes": False, "show_topology": False,
    }  # fmt: skip
    assert values(devices, "--processes")["show_processes"] is True
    monkeypatch.setenv("XPULAUNCH_INVENTORY", A_FILE)
    assert values(devices)["inventory_file"] == A_FILE
    assert "is a directory" in refused(devices, "--inventory", A_DIR).format_message()
    assert "unexpected extra argument" in refused(devices, "train.py").format_message()
