"""``xpulaunch devices --topology`` and the dry run's words about links, through the entry
point, for every inventory fixture."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import inventory_names, inventory_path

XPULAUNCH = str(Path(sys.executable).parent / "xpulaunch")


def xpulaunch(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [XPULAUNCH, *args],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
        env=dict(os.environ),
    )


@pytest.mark.parametrize("name", inventory_names())
def test_the_matrix_prints_for_every_fixture(name: str) -> None:
    done = xpulaunch("devices", "--topology", "--inventory", str(inventory_path(name)))
    assert done.returncode == 0, done.stderr
    devices = json.loads(inventory_path(name).read_text())["devices"]
    if not devices:
        assert "topology: no accelerators" in done.stdout
        return
    lines = done.stdout.split("topology:\n", 1)[1].splitlines()
    assert lines[0].split()[-4:] == ["CPU", "Affinity", "NUMA", "Affinity"]
    assert len(
        [line for line in lines[1:] if line.strip() and not line.startswith("legend")]
    ) >= len(devices)
    assert "legend: X = self" in done.stdout


def test_json_carries_the_matrix() -> None:
    done = xpulaunch(
        "devices",
        "--topology",
        "--json",
        "--inventory",
        str(inventory_path("8x-a6000-nvlink-pairs.json")),
    )
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    assert doc["topology"]["cells"][0][:3] == ["X", "NV4", "NODE"]
    assert doc["topology"]["numa_affinity"] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert doc["devices"][0]["links"][0]["peer"] == "0000:2a:00.0"
    plain = json.loads(
        xpulaunch(
            "devices", "--json", "--inventory", str(inventory_path("8x-a6000-nvlink-pairs.json"))
        ).stdout
    )
    assert "topology" not in plain


@pytest.mark.parametrize(
    ("name", "gpus", "chosen", "shares"),
    [
        ("8x-h100.json", "2", ["nvidia 0", "nvidia 1"], "one NVLink group (NV18)"),
        ("8x-a6000-nvlink-pairs.json", "2", ["nvidia 0", "nvidia 1"], "one NVLink group (NV4)"),
        ("8x-l40s-pcie.json", "3", ["nvidia 4", "nvidia 5", "nvidia 6"], "one PCIe switch"),
        (
            "8x-a6000-nvlink-pairs.json",
            "4",
            ["nvidia 0", "nvidia 1", "nvidia 2", "nvidia 3"],
            "NUMA node 0",
        ),
        ("8x-mi300x-xgmi.json", "2", ["amd 0", "amd 1"], "one XGMI hive (XGMI)"),
        (
            "2x-max1550-xelink.json",
            "3",
            [
                "intel 0 (0000:29:00.0) tile 0",
                "intel 0 (0000:29:00.0) tile 1",
                "intel 1 (0000:9a:00.0) tile 0",
            ],
            "one Xe Link group (XL4)",
        ),
    ],
)
def test_the_dry_run_says_what_the_set_shares(
    name: str, gpus: str, chosen: list[str], shares: str
) -> None:
    done = xpulaunch(
        "run", "--dry-run", "--inventory", str(inventory_path(name)), "--gpus", gpus, "--", "true"
    )
    assert done.returncode == 0, done.stderr
    why = done.stdout.split("why:\n", 1)[1]
    picked = [
        line.split(": chosen")[0].strip("- ").strip()
        for line in why.splitlines()
        if ": chosen," in line
    ]
    assert [p.split(" (")[0] if "tile" not in p else p for p in picked] == chosen
    assert f"  - topology: the {gpus} chosen devices share {shares}\n" in why


def test_the_dry_run_names_what_it_passed_over() -> None:
    done = xpulaunch(
        "run",
        "--dry-run",
        "--inventory",
        str(inventory_path("8x-l40s-pcie.json")),
        "--gpus",
        "3",
        "--",
        "true",
    )
    assert (
        "  - topology: passed over nvidia 0 (0000:18:00.0), nvidia 1 (0000:2a:00.0), nvidia 2 "
        "(0000:3a:00.0), ranked first by free memory and index: the first 3 share NUMA node 0\n"
    ) in done.stdout


def test_require_refuses_in_one_line() -> None:
    done = xpulaunch(
        "run",
        "--dry-run",
        "--inventory",
        str(inventory_path("8x-l40s-pcie.json")),
        "--gpus",
        "5",
        "--topology",
        "require",
        "--",
        "true",
    )
    assert done.returncode != 0
    assert "Traceback" not in done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1
    assert "--topology require: no 5 devices of this host share a link" in lines[0]


def test_a_bad_topology_word_is_a_usage_error() -> None:
    done = xpulaunch(
        "run",
        "--dry-run",
        "--inventory",
        str(inventory_path("8x-h100.json")),
        "--topology",
        "best",
        "--",
        "true",
    )
    assert done.returncode == 2
    assert "Traceback" not in done.stderr


def test_llama_takes_the_option() -> None:
    done = xpulaunch("llama", "--help")
    assert "--topology [prefer|require|ignore]" in done.stdout
