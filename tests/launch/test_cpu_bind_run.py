"""`xpulaunch run --cpu-bind` for real on this machine: each worker runs on the CPUs its plan
names. The inventory is this host's own CPU layout (probed from /sys and /proc) with two GPUs
recorded on the node of the first CPU this process may use, so the binding is real."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from xpulaunch.core.cpu_bind import format_cpulist, parse_cpulist
from xpulaunch.probing.numa import read_cpu_topology

XPULAUNCH = str(Path(sys.executable).parent / "xpulaunch")
REPORT = """
import json, os, subprocess, sys
status = dict(l.split(":\\t", 1) for l in open("/proc/self/status").read().splitlines()
              if ":\\t" in l)
child = subprocess.run([sys.executable, "-c", "import os; print(sorted(os.sched_getaffinity(0)))"],
                       capture_output=True, text=True, check=True).stdout
print("REPORT", json.dumps({"rank": os.environ["LOCAL_RANK"],
      "mine": sorted(os.sched_getaffinity(0)), "proc": status["Cpus_allowed_list"],
      "grandchild": json.loads(child), "omp": os.environ.get("OMP_NUM_THREADS")}), flush=True)
"""


@pytest.fixture
def this_host(tmp_path: Path) -> Path:
    topology, _ = read_cpu_topology("/sys", "/proc")
    assert topology is not None
    nodes: dict[str, str] = topology["numa_nodes"]  # type: ignore[assignment]
    first = min(os.sched_getaffinity(0))
    node = next(n for n, cpus in nodes.items() if first in parse_cpulist(cpus))
    devices = [
        {"vendor": "nvidia", "index": i, "name": "stand-in", "pci_bus_id": f"0000:{i + 1:02x}:00.0",
         "uuid": f"GPU-{i:08x}-1111-2222-3333-444444444444", "integrated": False, "tiles": 1,
         "memory_total_bytes": None, "memory_used_bytes": None, "utilization_percent": None,
         "mig_devices": [], "numa_node": int(node), "local_cpulist": nodes[node]}
        for i in range(2)
    ]  # fmt: skip
    path = tmp_path / "inventory.json"
    doc = {"schema": "xpulaunch.inventory/1", "devices": devices, "cpu_topology": topology}
    path.write_text(json.dumps(doc))
    return path


def xpulaunch(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([XPULAUNCH, "run", *args], capture_output=True, text=True, timeout=120,
                          check=False)  # fmt: skip


@pytest.mark.parametrize("mode", ["numa", "exclusive"])
def test_each_worker_runs_on_the_cpus_its_plan_names(
    mode: str, this_host: Path, tmp_path: Path
) -> None:
    script = tmp_path / "report.py"
    script.write_text(REPORT)
    common = ["--inventory", str(this_host), "--gpus", "all", "--nproc-per-node", "auto",
              "--cpu-bind", mode]  # fmt: skip
    dry = xpulaunch(*common, "--dry-run", "--json", str(script))
    assert dry.returncode == 0, dry.stderr
    planned = {w["local_rank"]: w["env"] for w in json.loads(dry.stdout)["workers"]}
    done = xpulaunch(*common, str(script))
    assert done.returncode == 0, done.stderr
    reports = [json.loads(line.split("REPORT ", 1)[1]) for line in done.stdout.splitlines()
               if "REPORT " in line]  # fmt: skip
    assert sorted(int(r["rank"]) for r in reports) == [0, 1]
    for report in reports:
        env = planned[int(report["rank"])]
        cpus = parse_cpulist(env["XPULAUNCH_CPUS"])
        assert report["mine"] == report["grandchild"] == sorted(cpus)
        assert report["proc"] == format_cpulist(cpus)
        assert report["omp"] == env["OMP_NUM_THREADS"]
    if mode == "exclusive":
        a, b = (set(r["mine"]) for r in reports)
        assert not a & b
