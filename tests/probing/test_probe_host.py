"""probe_host as a whole: no GPU runtime in-process, valid documents, blind sysfs, torch.xpu."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

from probe_fakes import (
    GIB,
    MAX1550_LMEM_BYTES,
    ROOT_CAPS,
    XPU_SMI_V2,
    FakeMachine,
    FakeNvml,
    b580_uhd_host,
    by_bus,
    h200_host,
    max1550_backport_host,
    messages,
    mi300x_host,
    nvml_h200,
    probe_fake,
    write_tool,
)

from xpulaunch.core.inventory import dumps, loads, to_dict

REPO = Path(__file__).resolve().parents[2]


def test_probing_imports_no_torch_and_no_pyzes(tmp_path: Path) -> None:
    """The launcher never initialises a GPU runtime; it does not even import one.
    torch is installed in this venv, so its absence from sys.modules means something."""
    m = FakeMachine(tmp_path)
    b580_uhd_host(m)
    h200_host(m)
    code = textwrap.dedent(f"""
        import sys
        import xpulaunch.probing.host
        assert "pynvml" not in sys.modules, "pynvml imported before probing"
        from pathlib import Path
        inv = xpulaunch.probing.host.probe_host(sys_root=Path({str(m.sys)!r}),
                                              proc_root=Path({str(m.proc)!r}))
        leaked = sorted(n for n in ("torch", "pyzes", "dpctl") if n in sys.modules)
        print(len(inv.devices), leaked)
    """)
    env = {**os.environ, "PATH": "/usr/bin:/bin"}
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
        env=env,
    )
    assert out.stdout.split("\n")[0].endswith("[]"), out.stdout + out.stderr
    import importlib.util

    assert importlib.util.find_spec("torch") is not None  # the check above is not vacuous


def test_probe_does_not_touch_os_environ(tmp_path: Path) -> None:
    m = FakeMachine(tmp_path)
    b580_uhd_host(m)
    before = dict(os.environ)
    probe_fake(m, env={"ZE_AFFINITY_MASK": "0"}, use_pyzes=True)
    assert dict(os.environ) == before


def test_probed_documents_are_valid_inventories(tmp_path: Path) -> None:
    m = FakeMachine(tmp_path, caps=ROOT_CAPS)
    h200_host(m)
    b580_uhd_host(m)
    mi300x_host(m)
    bin_dir = tmp_path / "bin"
    write_tool(bin_dir, "xpu-smi", XPU_SMI_V2, cards=[])
    inv = probe_fake(m, bin_dir, nvml_module=FakeNvml(nvml_h200()), report_missing=True)
    assert [d.vendor.value for d in inv.devices] == ["nvidia"] * 2 + ["intel"] * 2 + ["amd"] * 2
    again = loads(dumps(inv), source="probe")
    assert again.devices == inv.devices and again.problems == inv.problems
    assert json.loads(dumps(inv))["devices"][0]["sources"] == ["sysfs", "nvml"]


def test_max1550_probe_matches_the_shared_inventory_fixture(tmp_path: Path) -> None:
    m = FakeMachine(tmp_path)
    max1550_backport_host(m)
    probed = to_dict(probe_fake(m))["devices"]
    shared = json.loads((REPO / "tests/fixtures/inventories/2x-max1550.json").read_text())
    keys = ("vendor", "index", "name", "pci_bus_id", "integrated", "tiles", "memory_total_bytes")
    assert [{k: d[k] for k in keys} for d in probed] == [
        {k: d[k] for k in keys} for d in shared["devices"]
    ]
    assert probed[0]["memory_total_bytes"] == MAX1550_LMEM_BYTES


def test_blind_sysfs_is_one_problem_and_tools_are_still_asked(tmp_path: Path) -> None:
    m = FakeMachine(tmp_path)
    for entry in (m.sys / "bus" / "pci" / "devices").iterdir():
        entry.unlink()
    (m.sys / "bus" / "pci" / "devices").rmdir()
    bin_dir = tmp_path / "bin"
    cards = [{"index": 0, "name": "Intel(R) Arc(TM) B580 Graphics", "bdf": "0000:03:00.0",
              "uuid": "u-b580", "total_mib": 12216, "used_mib": 1183, "util": 3}]  # fmt: skip
    write_tool(bin_dir, "xpu-smi", XPU_SMI_V2, cards=cards)
    inv = probe_fake(m, bin_dir)
    (arc,) = inv.devices
    assert (arc.pci_bus_id, arc.memory_used_bytes) == ("0000:03:00.0", 1183 * 1024**2)
    assert [p.source for p in inv.problems] == ["sysfs"]
    quiet = probe_fake(m)  # no tools at all: missing tools are not problems without --debug
    assert [p.source for p in quiet.problems] == ["sysfs"]
    debug = probe_fake(m, report_missing=True)
    assert "xpu-smi: not installed" in messages(debug)


FAKE_TORCH = """
import json, os
__version__ = "2.13.0+xpu.fake"
with open(os.environ["FAKE_TORCH_LOG"], "w") as log:
    json.dump({"pid": os.getpid(), "env": {k: os.environ.get(k) for k in (
        "ZE_AFFINITY_MASK", "ZE_FLAT_DEVICE_HIERARCHY", "ONEAPI_DEVICE_SELECTOR")}}, log)
class _Props:
    def __init__(self, name, total, integrated):
        self.name, self.total_memory, self.is_integrated_gpu = name, total, integrated
        self.uuid = None
class xpu:
    _devices = [_Props("Intel(R) Arc(TM) B580 Graphics", 12168933376, False),
                _Props("Intel(R) UHD Graphics 770", 30000000000, True)]
    @staticmethod
    def is_available():
        return True
    @staticmethod
    def device_count():
        return len(xpu._devices)
    @staticmethod
    def get_device_properties(i):
        return xpu._devices[i]
    @staticmethod
    def mem_get_info(i):
        if xpu._devices[i].is_integrated_gpu:
            raise RuntimeError("The device (Intel(R) UHD Graphics 770) doesn't support querying "
                               "the available free memory.")
        return (11811160064, 12168933376)
"""


def test_torch_xpu_runs_in_a_throwaway_process_with_a_clean_env(tmp_path: Path) -> None:
    """torch.xpu only in a child (it initialises Level Zero and caches its count): COMPOSITE,
    no masks, level_zero only (SYCL lists a card twice when OpenCL is visible too)."""
    m = FakeMachine(tmp_path)
    b580_uhd_host(m, vram_file=False)
    site = tmp_path / "site" / "torch"
    site.mkdir(parents=True)
    (site / "__init__.py").write_text(FAKE_TORCH)
    log = tmp_path / "torch.json"
    env = {"PYTHONPATH": str(site.parent), "FAKE_TORCH_LOG": str(log),
           "ZE_AFFINITY_MASK": "0.1", "ZE_FLAT_DEVICE_HIERARCHY": "FLAT"}  # fmt: skip
    inv = probe_fake(m, env=env, use_torch=True)
    seen = json.loads(log.read_text())
    assert seen["pid"] != os.getpid()
    assert seen["env"] == {"ZE_AFFINITY_MASK": None, "ZE_FLAT_DEVICE_HIERARCHY": "COMPOSITE",
                           "ONEAPI_DEVICE_SELECTOR": "level_zero:gpu"}  # fmt: skip
    arc, uhd = by_bus(inv)["0000:03:00.0"], by_bus(inv)["0000:00:02.0"]
    assert arc.memory_total_bytes == 12168933376
    assert arc.memory_used_bytes == 12168933376 - 11811160064
    assert "torch.xpu" in arc.extra["sources"]  # type: ignore[operator]
    assert uhd.memory_used_bytes is None  # mem_get_info unsupported on the iGPU: unknown
    assert arc.memory_total_bytes != 12 * GIB


def test_torch_helper_failure_is_a_problem(tmp_path: Path) -> None:
    m = FakeMachine(tmp_path)
    b580_uhd_host(m)
    site = tmp_path / "site" / "torch"
    site.mkdir(parents=True)
    (site / "__init__.py").write_text("raise ImportError('libsycl.so.8: cannot open')\n")
    inv = probe_fake(m, env={"PYTHONPATH": str(site.parent)}, use_torch=True)
    assert "torch.xpu: torch is not importable: libsycl.so.8" in messages(inv)
