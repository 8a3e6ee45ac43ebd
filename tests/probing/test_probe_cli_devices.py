"""``xpulaunch devices`` through the installed entry point, plus the table rendering."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from probe_fakes import (
    H200,
    NVIDIA_SMI,
    FakeMachine,
    b580_uhd_host,
    h200_host,
    nvidia_smi_gpu,
    tool_path,
    write_tool,
)

from xpulaunch.cli.devices import render_table
from xpulaunch.core.inventory import loads, to_dict
from xpulaunch.model import Device, Inventory, MigDevice, Problem, Vendor

REPO = Path(__file__).resolve().parents[2]
INVENTORIES = REPO / "tests" / "fixtures" / "inventories"
XPULAUNCH = Path(sys.executable).parent / "xpulaunch"


def xpulaunch(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("XPULAUNCH_")}
    return subprocess.run(
        [str(XPULAUNCH), *args], capture_output=True, text=True, timeout=60, check=False,
        env={**base, **(env or {})},
    )  # fmt: skip


def fake_host_env(m: FakeMachine, bin_dir: Path | None = None) -> dict[str, str]:
    path = tool_path(bin_dir)
    return {"XPULAUNCH_SYSFS_ROOT": str(m.sys), "XPULAUNCH_PROCFS_ROOT": str(m.proc), "PATH": path}


def test_json_echoes_an_inventory_file() -> None:
    path = INVENTORIES / "a100-mig.json"
    out = xpulaunch("devices", "--json", "--inventory", str(path))
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == to_dict(loads(path.read_text()))


def test_inventory_from_the_environment_variable_as_a_table() -> None:
    path = INVENTORIES / "arc-b580-igpu.json"
    out = xpulaunch("devices", env={"XPULAUNCH_INVENTORY": str(path)})
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0] == f"inventory: {path} (not probed)"
    assert lines[1].split() == ["IDX", "VENDOR", "NAME", "PCI", "MEMORY", "USED", "/", "TOTAL",
                                "UTIL", "TILES"]  # fmt: skip
    assert "Intel(R) Arc(TM) B580 Graphics" in lines[2] and "? / 12.0 GiB" in lines[2]
    assert "(integrated)" in lines[3] and lines[3].split()[-3:] == ["-", "-", "1"]


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        ('{"schema": "xpulaunch.inventory/1", "devices": [{"vendor": "ati", "index": 0}]}',
         "devices[0].vendor: 'ati' is not one of nvidia, intel, amd"),
        ("{not json", "not JSON"),
    ],
)  # fmt: skip
def test_bad_inventory_is_one_line_exit_2(tmp_path: Path, content: str, expected: str) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text(content)
    out = xpulaunch("devices", "--inventory", str(bad))
    assert out.returncode == 2
    assert out.stdout == ""
    (line,) = out.stderr.splitlines()
    assert line.startswith("xpulaunch: error: ") and expected in line


def test_missing_inventory_file(tmp_path: Path) -> None:
    out = xpulaunch("devices", "--json", "--inventory", str(tmp_path / "nope.json"))
    assert out.returncode == 2
    (line,) = out.stderr.splitlines()
    assert line.startswith("xpulaunch: error: ") and str(tmp_path / "nope.json") in line
    assert "No such file or directory" in line


def test_probe_of_a_fake_h200_host_through_the_cli(tmp_path: Path) -> None:
    m = FakeMachine(tmp_path)
    h200_host(m)
    bin_dir = tmp_path / "bin"
    write_tool(bin_dir, "nvidia-smi", NVIDIA_SMI, gpus=[nvidia_smi_gpu(g) for g in H200])
    out = xpulaunch("devices", "--json", env=fake_host_env(m, bin_dir))
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert [(d["index"], d["pci_bus_id"], d["uuid"]) for d in doc["devices"]] == [
        (g["index"], g["bdf"], g["uuid"]) for g in H200
    ]
    assert doc["devices"][0]["memory_total_bytes"] == 143771 * 1024**2
    assert doc["devices"][0]["sources"] == ["sysfs", "nvidia-smi"]
    assert "problems" not in doc  # the hook switches NVML off: its absence is not a problem


def test_a_dry_run_reads_the_lock_directory_only_for_a_plan_that_leases(tmp_path: Path) -> None:
    """As a real run: a plan on the CPU never touches the lock directory (it may be unusable,
    as /tmp/xpulaunch-UID is where /tmp is closed to its user); a plan for a device reads it."""
    m = FakeMachine(tmp_path)
    h200_host(m)
    bin_dir = tmp_path / "bin"
    write_tool(bin_dir, "nvidia-smi", NVIDIA_SMI, gpus=[nvidia_smi_gpu(g) for g in H200])
    unsafe = tmp_path / "run" / "xpulaunch"  # the private default under XDG_RUNTIME_DIR
    unsafe.mkdir(parents=True)
    unsafe.chmod(0o777)  # private, yet writable by all: refused
    env = {**fake_host_env(m, bin_dir), "XDG_RUNTIME_DIR": str(unsafe.parent)}
    for gpus in ("none", "auto"):
        cpu = xpulaunch("--gpus", gpus, "--backend", "cpu", "--dry-run", "--json", "x.py", env=env)
        assert cpu.returncode == 0, cpu.stderr
        assert json.loads(cpu.stdout)["backend"] == "cpu"
    gpu = xpulaunch("--gpus", "1", "--dry-run", "--json", "x.py", env=env)
    assert gpu.returncode == 1 and gpu.stdout == ""
    assert gpu.stderr.startswith(f"xpulaunch: error: lock directory {unsafe} has mode 0777")
    real = xpulaunch("--gpus", "none", sys.executable, "-c", "pass", env=env)
    assert real.returncode == 0, real.stderr


def test_table_footer_and_debug_on_a_fake_intel_host(tmp_path: Path) -> None:
    m = FakeMachine(tmp_path)
    b580_uhd_host(m)
    env = fake_host_env(m)
    table = xpulaunch("devices", env=env)
    assert table.returncode == 0, table.stderr
    assert "1 problem:" in table.stdout
    assert "intel [0000:03:00.0]: memory used unknown" in table.stdout
    assert "'xpulaunch devices --debug' shows every problem in full" in table.stdout
    debug = xpulaunch("devices", "--debug", env=env)
    assert "sources:" in debug.stdout and "from sysfs; driver=xe" in debug.stdout
    assert "xpu-smi: not installed (not found on PATH)" in debug.stdout


def test_devices_json_imports_no_torch(tmp_path: Path) -> None:
    m = FakeMachine(tmp_path)
    h200_host(m)
    out = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "xpulaunch", "devices", "--json"],
        capture_output=True, text=True, timeout=60, check=False,
        env={**os.environ, **fake_host_env(m)},
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    imported = {line.split("|")[-1].strip() for line in out.stderr.splitlines() if "|" in line}
    assert "xpulaunch.probing.host" in imported  # the probe really ran
    assert not {n for n in imported if n.split(".")[0] in ("torch", "pyzes", "rich")}


def test_torch_on_a_host_without_an_intel_gpu_says_it_added_nothing(tmp_path: Path) -> None:
    """``devices --torch`` asks torch.xpu only about Intel cards: on a host with none, it did
    nothing and said nothing (and its help says it is slow, so it seemed to have run)."""
    m = FakeMachine(tmp_path)
    h200_host(m)
    out = xpulaunch("devices", "--torch", env=fake_host_env(m))
    assert out.returncode == 0, out.stderr
    assert out.stderr == (
        "xpulaunch: note: --torch: no Intel GPU here, and torch.xpu is asked only about "
        "Intel GPUs\n"
    )
    assert "nvidia GPU [0x2335]" in out.stdout


def _device(**kw: object) -> Device:
    base: dict[str, object] = {"vendor": Vendor.INTEL, "index": 0}
    return Device(**{**base, **kw})  # type: ignore[arg-type]


def test_unknown_values_never_print_as_zero() -> None:
    text = render_table(Inventory(devices=(
        _device(name=None, extra={"pci_device_id": "0xe20b"}),
        _device(index=1, memory_total_bytes=16 * 1024**3, memory_used_bytes=0,
                utilization_percent=0.0),
    )))  # fmt: skip
    unknown, known = text.splitlines()[1:3]
    assert "intel GPU [0xe20b]" in unknown
    assert unknown.split()[-3:] == ["-", "-", "1"] and " 0" not in unknown[10:]
    assert "0.0 / 16.0 GiB" in known and known.split()[-2] == "0%"


def test_mig_rows_and_problem_footer_truncation() -> None:
    mig = MigDevice(uuid="MIG-7f6a1b2c", memory_total_bytes=20 * 1024**3, memory_used_bytes=None)
    problems = tuple(Problem("nvml", f"problem {i} " + "x" * 200) for i in range(7))
    inv = Inventory(devices=(_device(vendor=Vendor.NVIDIA, mig_devices=(mig,)),), problems=problems)
    text = render_table(inv)
    assert "  MIG-7f6a1b2c  " in text and text.count("? / 20.0 GiB") == 1
    assert "7 problems:" in text
    assert text.count("  - nvml: problem") == 5
    assert "(and 2 more; 'xpulaunch devices --debug' shows every problem in full)" in text
    assert max(len(line) for line in text.splitlines()) < 200
    full = render_table(inv, debug=True)
    assert full.count("  - nvml: problem") == 7 and "x" * 200 in full


def test_mig_rows_line_up_with_the_memory_column() -> None:
    """They ran through NAME and PCI: ``     MIG MIG-7f6a1b2c-...  0.0 / 20.0 GiB``."""
    out = xpulaunch("devices", "--inventory", str(INVENTORIES / "a100-mig.json"))
    assert out.returncode == 0, out.stderr
    header, *rows = out.stdout.splitlines()[1:]
    column = header.index("MEMORY")
    migs = [row for row in rows if row.lstrip().startswith("MIG-")]
    assert len(migs) == 2
    for row in [*migs, rows[0]]:
        assert row[column:].split()[:4] == ["0.0", "/", "20.0" if "MIG-" in row else "40.0", "GiB"]
        assert row[column - 2 : column] == "  "


def test_debug_on_an_inventory_file_prints_no_empty_sources() -> None:
    """Each device got ``sources:`` with an empty value (``intel 0 (0000:29:00.0): ``)."""
    out = xpulaunch("devices", "--debug", "--inventory", str(INVENTORIES / "2x-max1550.json"))
    assert out.returncode == 0, out.stderr
    assert "sources:" not in out.stdout
    assert not any(line.endswith(": ") or line.endswith(":") for line in out.stdout.splitlines())


def test_empty_host_says_so() -> None:
    assert render_table(Inventory()) == "No accelerators found."


def test_a_mixed_host_lists_vendor_qualified_ids() -> None:
    out = xpulaunch("devices", "--inventory", str(INVENTORIES / "hybrid-4090-arc.json"))
    assert out.returncode == 0, out.stderr
    ids = [line.split()[0] for line in out.stdout.splitlines()[2:4]]
    assert ids == ["nvidia:0", "intel:0"]
