"""What the probe does per device, counted: `devices --json` on 4x H100 took 1.48x a bare
NVML process where one H100 took 1.00x, so whatever scales with the device count must be no
more than the bare process does, plus what the inventory needs and it does not ask.

The bare process (bench/bench_probe.py's peer) asks, per GPU: a handle, the UUID, the PCI
info, memory (v2) and utilisation. The probe also needs the name and the MIG mode (MIG
instances are the units a MIG GPU hands out). Everything else it does per GPU is a sysfs
read of a few bytes; nothing is asked twice, and no file is read once per device that one
read per host or per driver answers."""

from __future__ import annotations

import collections
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from probe_fakes import FakeNvml

from xpulaunch.probing.host import probe_host

MACHINE = Path(__file__).parents[1] / "fixtures" / "sysfs" / "nvidia-8x-h100-2socket"
BUSES = ("18", "2a", "3a", "5d", "9a", "ab", "ba", "db")
PEER_PER_GPU = {
    "nvmlDeviceGetHandleByIndex",
    "nvmlDeviceGetUUID",
    "nvmlDeviceGetPciInfo",
    "nvmlDeviceGetMemoryInfo",
    "nvmlDeviceGetUtilizationRates",
}
# ... and the topology read's first NVLink state (Not Supported: a PCIe board, no walk).
NEEDED_PER_GPU = {"nvmlDeviceGetName", "nvmlDeviceGetMigMode", "nvmlDeviceGetNvLinkState"}
SYSFS_PER_GPU = {"vendor", "class", "device", "numa_node", "local_cpulist"}


class CountingNvml:
    """FakeNvml behind a proxy that counts each NVML call by function and device."""

    def __init__(self, inner: FakeNvml) -> None:
        self._inner = inner
        self.calls: collections.Counter[tuple[str, str]] = collections.Counter()

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._inner, name)
        if not (callable(attr) and name.startswith("nvml")):
            return attr

        def call(*args: Any, **kwargs: Any) -> Any:
            device = args[0]["uuid"] if args and isinstance(args[0], dict) else None
            index = args[0] if name == "nvmlDeviceGetHandleByIndex" else None
            owner = device or (self._inner.gpus[index]["uuid"] if index is not None else "-")
            self.calls[(name, owner)] += 1
            return attr(*args, **kwargs)

        return call


def h100s(count: int) -> list[dict[str, Any]]:
    return [
        {"uuid": f"GPU-{i:08x}-aaaa-bbbb-cccc-dddddddddddd", "bus": f"00000000:{bus.upper()}:00.0",
         "name": "NVIDIA H100 80GB HBM3", "total": 85520809984, "used_v1": 500 << 20,
         "used_v2": 0, "util": 0, "mig": []}
        for i, bus in enumerate(BUSES[:count])
    ]  # fmt: skip


@pytest.fixture
def opened() -> Iterator[Callable[[], collections.Counter[str]]]:
    """Files the probe opens under the fixture machine (an audit hook sees every open)."""
    seen: collections.Counter[str] = collections.Counter()
    active = [True]
    root = str(MACHINE)

    def hook(event: str, args: tuple[Any, ...]) -> None:
        if active[0] and event == "open" and isinstance(args[0], str) and root in args[0]:
            seen[args[0].split(root, 1)[1]] += 1

    sys.addaudithook(hook)  # cannot be removed: switched off at the end instead
    yield lambda: seen
    active[0] = False


def probe(nvml: CountingNvml) -> None:
    inventory = probe_host(sys_root=MACHINE / "sys", proc_root=MACHINE / "proc",
                           env={"PATH": ""}, nvml_module=nvml, use_pyzes=False)  # fmt: skip
    assert len(inventory.devices) == 8 and inventory.problems == ()


def test_each_gpu_gets_the_bare_processs_nvml_calls_plus_name_and_mig_mode_once() -> None:
    nvml = CountingNvml(FakeNvml(h100s(8)))
    probe(nvml)
    per_gpu = collections.defaultdict(set)
    for (name, owner), times in nvml.calls.items():
        if name == "nvmlDeviceGetTopologyCommonAncestor":
            continue  # once a pair of GPUs, counted below
        assert times == 1, (name, owner)
        per_gpu[owner].add(name)
    pairs = [t for (n, _), t in nvml.calls.items() if n == "nvmlDeviceGetTopologyCommonAncestor"]
    assert sum(pairs) == 8 * 7 // 2
    host = per_gpu.pop("-")
    assert host == {"nvmlInit", "nvmlDeviceGetCount", "nvmlSystemGetDriverVersion"}
    assert len(per_gpu) == 8
    assert all(calls == PEER_PER_GPU | NEEDED_PER_GPU for calls in per_gpu.values())


def test_per_gpu_files_are_a_few_sysfs_reads_and_per_host_files_are_read_once(
    opened: Callable[[], collections.Counter[str]],
) -> None:
    probe(CountingNvml(FakeNvml(h100s(8))))
    files = opened()
    per_gpu = collections.defaultdict(set)
    for path, times in files.items():
        parts = path.split("/")
        if path.startswith("/sys/bus/pci/devices/"):
            per_gpu[parts[5]].add(parts[6])
        else:  # host-wide: the CPU layout, the process's status; read once each
            assert times <= (2 if path == "/proc/self/status" else 1), path
    assert all(times == 1 for path, times in files.items() if "/pci/" in path)
    assert len(per_gpu) == 8 and all(names == SYSFS_PER_GPU for names in per_gpu.values())
    # NVML said the driver's version once for all GPUs; no per-device read of sysfs for it
    assert not [p for p in files if p.startswith(("/sys/module", "/proc/sys/kernel"))]
