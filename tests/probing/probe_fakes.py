"""Fake machines for the probe tests: sysfs/procfs trees, vendor CLI tools, NVML and pyzes.

Every fake follows the formats in shared/reference/device-semantics.md (sections 2.5, 2.6, 4.3,
4.4, 4.5, 5.2-5.4); values come from the verbatim runs where there are some (H200, H100) and
from the documented shapes otherwise. The fake tools are small Python scripts put first on
PATH; each appends its argv and the GPU selection variables it saw to a JSON-lines log.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import pynvml

from xpulaunch.model import Device, Inventory
from xpulaunch.probing.host import probe_host

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "probe"
SELECTION_VARS = (
    "ZE_AFFINITY_MASK", "ONEAPI_DEVICE_SELECTOR", "ZE_FLAT_DEVICE_HIERARCHY", "SYCL_DEVICE_FILTER",
    "ROCR_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES",
)  # fmt: skip
GIB = 1024**3
MIB = 1024**2
ROOT_CAPS = 0x000001FFFFFFFFFF  # CapEff of root on a 6.x kernel
USER_CAPS = 0


# --- sysfs / procfs ------------------------------------------------------------------------


class FakeMachine:
    """``<root>/sys`` and ``<root>/proc`` laid out like the kernel's (symlinks included)."""

    def __init__(self, root: Path, *, caps: int = USER_CAPS) -> None:
        self.sys = root / "sys"
        self.proc = root / "proc"
        (self.sys / "bus" / "pci" / "devices").mkdir(parents=True)
        (self.proc / "self").mkdir(parents=True)
        self.set_caps(caps)

    def set_caps(self, caps: int) -> None:
        status = "Name:\tpython3\nUmask:\t0022\nState:\tR (running)\nCapInh:\t0000000000000000\n"
        status += f"CapPrm:\t{caps:016x}\nCapEff:\t{caps:016x}\nCapBnd:\t000001ffffffffff\n"
        (self.proc / "self" / "status").write_text(status)

    def pci(
        self,
        bdf: str,
        *,
        vendor: int,
        device: int,
        cls: int,
        driver: str | None = None,
        drm: tuple[int, ...] = (),
        attrs: dict[str, str] | None = None,
        tiles: int = 0,
        under: str = "pci0000:00",
    ) -> Path:
        """A PCI function under /sys/devices (below the bridges ``under`` names, from the host
        bridge down), linked from /sys/bus/pci/devices like the kernel."""
        real = self.sys / "devices" / under / bdf
        real.mkdir(parents=True)
        (real / "vendor").write_text(f"0x{vendor:04x}\n")
        (real / "device").write_text(f"0x{device:04x}\n")
        (real / "class").write_text(f"0x{cls:06x}\n")
        uevent = [f"PCI_CLASS={cls:X}", f"PCI_ID={vendor:04X}:{device:04X}", f"PCI_SLOT_NAME={bdf}"]
        if driver:
            drivers = self.sys / "bus" / "pci" / "drivers" / driver
            drivers.mkdir(parents=True, exist_ok=True)
            (real / "driver").symlink_to(os.path.relpath(drivers, real))
            uevent.insert(0, f"DRIVER={driver}")
        (real / "uevent").write_text("\n".join(uevent) + "\n")
        for name, value in (attrs or {}).items():
            (real / name).parent.mkdir(parents=True, exist_ok=True)
            (real / name).write_text(value)
        for tile in range(tiles):
            (real / f"tile{tile}").mkdir(exist_ok=True)
        for minor in drm:
            self._drm(real, minor)
        link = self.sys / "bus" / "pci" / "devices" / bdf
        link.symlink_to(os.path.relpath(real, link.parent))
        return real

    def _drm(self, real: Path, minor: int) -> None:
        card = real / "drm" / f"card{minor}"
        card.mkdir(parents=True)
        (card / "device").symlink_to("../..")
        (real / "drm" / f"renderD{128 + minor}").mkdir()
        (real / "drm" / f"card{minor}-DP-1").mkdir()  # a connector: never a card
        class_drm = self.sys / "class" / "drm"
        class_drm.mkdir(parents=True, exist_ok=True)
        (class_drm / f"card{minor}").symlink_to(os.path.relpath(card, class_drm))

    def drm_attr(self, minor: int, name: str, value: str) -> None:
        (self.sys / "class" / "drm" / f"card{minor}" / name).write_text(value)

    def nvidia_proc(self, bdf: str, information: str) -> None:
        gpu = self.proc / "driver" / "nvidia" / "gpus" / bdf
        gpu.mkdir(parents=True)
        (gpu / "information").write_text(information)


H200 = [
    {"index": 0, "bdf": "0000:00:06.0", "uuid": "GPU-a6026e70-2f8a-387f-486f-d49cebe1fb04"},
    {"index": 1, "bdf": "0000:00:07.0", "uuid": "GPU-e436550d-4102-c58c-de2e-988dc6aaa541"},
]
MAX1550 = [
    {"bdf": "0000:29:00.0", "uuid": "00000000-0000-0029-0000-00000bd58086", "minor": 1},
    {"bdf": "0000:9a:00.0", "uuid": "00000000-0000-009a-0000-00000bd58086", "minor": 2},
]
MAX1550_LMEM_BYTES = 128 * GIB


def h200_host(m: FakeMachine) -> None:
    """2x H200 VM [run]: class 0x030200, driver nvidia, no /sys/class/drm at all; plus the
    board's other functions that must not count (NVIDIA audio, ASPEED VGA, a host bridge)."""
    for gpu in H200:
        m.pci(gpu["bdf"], vendor=0x10DE, device=0x2335, cls=0x030200, driver="nvidia")
    m.pci("0000:00:06.1", vendor=0x10DE, device=0x22A3, cls=0x040300, driver="snd_hda_intel")
    m.pci("0000:00:01.0", vendor=0x1A03, device=0x2000, cls=0x030000, driver="ast")
    m.pci("0000:00:00.0", vendor=0x8086, device=0x1237, cls=0x060000)


def max1550_backport_host(
    m: FakeMachine, *, avail: tuple[int, int] = (120 * GIB, 96 * GIB)
) -> None:
    """2x Max 1550 on the i915 backport: lmem_* files on /sys/class/drm/cardN (not device/)."""
    for card, free in zip(MAX1550, avail, strict=True):
        m.pci(card["bdf"], vendor=0x8086, device=0x0BD5, cls=0x038000, driver="i915",
              drm=(card["minor"],))  # fmt: skip
        m.drm_attr(card["minor"], "lmem_total_bytes", f"{MAX1550_LMEM_BYTES}\n")
        m.drm_attr(card["minor"], "lmem_avail_bytes", f"{free}\n")


def b580_uhd_host(m: FakeMachine, *, vram_file: bool = True) -> None:
    """Arc B580 on xe (tile0, optionally physical_vram_size_bytes) + UHD 770 iGPU on i915.
    The iGPU probes first, so it is card0: DRM numbering is not our order."""
    m.pci("0000:00:02.0", vendor=0x8086, device=0xA780, cls=0x030000, driver="i915", drm=(0,))
    attrs = {"tile0/physical_vram_size_bytes": f"{12 * GIB}\n"} if vram_file else {}
    m.pci("0000:03:00.0", vendor=0x8086, device=0xE20B, cls=0x030000, driver="xe", drm=(1,),
          tiles=1, attrs=attrs)  # fmt: skip


def mi300x_host(m: FakeMachine) -> None:
    """2x MI300X on amdgpu with the mem_info_* files (values: reference section 5.2 fixture)."""
    for i, bdf in enumerate(("0000:0c:00.0", "0000:22:00.0")):
        m.pci(bdf, vendor=0x1002, device=0x74A1, cls=0x038000, driver="amdgpu", drm=(i + 4,),
              attrs={"mem_info_vram_total": "34342961152\n", "mem_info_vram_used": "7028736\n",
                     "gpu_busy_percent": "0\n", "unique_id": f"4b2c1a9f0c1d2e3{i}\n"})  # fmt: skip


# --- fake command-line tools ---------------------------------------------------------------

_PRELUDE = """
import json, os, sys, time
DATA = json.loads(%r)
with open(DATA["log"], "a") as _log:
    _log.write(json.dumps({"tool": %r, "argv": sys.argv[1:], "pid": os.getpid(),
                           "env": {k: os.environ.get(k) for k in DATA["watch"]}}) + "\\n")
"""


def write_tool(bin_dir: Path, name: str, body: str, **data: Any) -> Path:
    bin_dir.mkdir(parents=True, exist_ok=True)
    data = {"log": str(bin_dir / "calls.jsonl"), "watch": list(SELECTION_VARS), **data}
    script = f"#!{sys.executable}\n" + _PRELUDE % (json.dumps(data), name) + body
    path = bin_dir / name
    path.write_text(script)
    path.chmod(0o755)
    return path


def calls(bin_dir: Path, tool: str | None = None) -> list[dict[str, Any]]:
    log = bin_dir / "calls.jsonl"
    if not log.exists():
        return []
    entries = [json.loads(line) for line in log.read_text().splitlines()]
    return [e for e in entries if tool is None or e["tool"] == tool]


# nvidia-smi --query-gpu: header "field [unit]" unless noheader, "N MiB"/"N %" unless nounits;
# unknown query fields abort; exit 6 + "No devices were found" when there are none [run].
NVIDIA_SMI = r"""
UNITS = {"memory.total": "MiB", "memory.used": "MiB", "memory.free": "MiB",
         "memory.reserved": "MiB", "utilization.gpu": "%"}
args = sys.argv[1:]
query = [a.split("=", 1)[1].split(",") for a in args if a.startswith("--query-gpu=")]
fmt = [a.split("=", 1)[1].split(",") for a in args if a.startswith("--format=")]
if not DATA["gpus"]:
    print("No devices were found")
    sys.exit(6)
if args == ["topo", "-m"]:  # DATA["topo"], else a VM's: every pair through the host bridge
    names = ["GPU%d" % g["index"] for g in DATA["gpus"]]
    default = "\t" + "\t".join(names + ["CPU Affinity", "NUMA Affinity", "GPU NUMA ID"]) + "\n"
    for row in names:
        cells = [" X " if col == row else "PHB" for col in names]
        default += "\t".join([row] + cells + ["0-63", "0", "", "N/A"]) + "\n"
    print(DATA.get("topo") or default + "\nLegend:\n\n  X    = Self")
    sys.exit(0)
if not query or not fmt:
    print("usage: fake nvidia-smi only answers --query-gpu")
    sys.exit(2)
fields, opts = query[0], fmt[0]
for f in fields:
    if f not in DATA["gpus"][0]:
        print('Field "%s" is not a valid field to query.' % f)
        sys.exit(2)
def cell(f, v):
    v = str(v)
    if v.startswith("[") or "nounits" in opts or f not in UNITS:
        return v
    return "%s %s" % (v, UNITS[f])
if "noheader" not in opts:
    print(", ".join(f + (" [%s]" % UNITS[f] if f in UNITS else "") for f in fields))
for g in DATA["gpus"]:
    print(", ".join(cell(f, g[f]) for f in fields))
"""


def nvidia_smi_gpu(gpu: dict[str, Any], **overrides: Any) -> dict[str, Any]:
    """One H200 row with the values of reference section 4.3 (MiB, idle)."""
    row = {
        "index": gpu["index"], "uuid": gpu["uuid"], "pci.bus_id": "0000" + gpu["bdf"].upper(),
        "name": "NVIDIA H200", "memory.total": 143771, "memory.used": 0, "memory.free": 143156,
        "memory.reserved": 615, "utilization.gpu": 0, "mig.mode.current": "Disabled",
    }  # fmt: skip
    row.update(overrides)
    return row


# xpu-smi 1.x: Level Zero core enumeration, so ZE_AFFINITY_MASK hides and renumbers cards;
# rejects --query-gpu (CLI11); `dump -j` refused; dump streams until killed unless -n is given,
# its first row after one interval; CSV per comlet_dump.cpp.
XPU_SMI_V1 = r"""
args = sys.argv[1:]
cards = DATA["cards"]
mask = os.environ.get("ZE_AFFINITY_MASK")
if mask is not None and mask.strip():
    roots = []
    for tok in mask.split(","):
        head = tok.split(".")[0].strip()
        if head.isdigit() and int(head) < len(cards) and int(head) not in roots:
            roots.append(int(head))
    cards = [cards[i] for i in sorted(roots)]
def opt(name, default=None):
    return args[args.index(name) + 1] if name in args else default
if any(a.startswith("--query-gpu") for a in args):
    bad = [a for a in args if a.startswith("--query-gpu")][0]
    print("The following argument was not expected: " + bad)
    print("Run with --help for more information.")
    sys.exit(109)
if args[:1] == ["discovery"] and "-d" not in args and "-j" in args:
    keys = ["device_function_type", "device_id", "device_name", "device_type", "drm_device",
            "pci_bdf_address", "pci_device_id", "uuid", "vendor_name"]
    out = []
    for i, c in enumerate(cards):
        d = {"device_function_type": "physical", "device_id": i, "device_name": c["name"],
             "device_type": "GPU", "drm_device": "/dev/dri/card%d" % c["minor"],
             "pci_bdf_address": c["bdf"], "pci_device_id": c["pci_device_id"], "uuid": c["uuid"],
             "vendor_name": "Intel(R) Corporation"}
        out.append({k: d[k] for k in sorted(d)})
    print(json.dumps({"device_list": out}, indent=4, sort_keys=True))
elif args[:1] == ["discovery"] and "-d" in args:
    i = int(opt("-d"))
    if i >= len(cards):
        print(json.dumps({"error": "device Id or PCI BDF is invalid", "errno": 15}, indent=4))
        sys.exit(1)
    c = cards[i]
    print(json.dumps({"device_id": i, "device_name": c["name"], "pci_bdf_address": c["bdf"],
                      "memory_physical_size_byte": str(c["physical"]),
                      "memory_free_size_byte": str(c["free"]),
                      "number_of_tiles": str(c["tiles"]), "uuid": c["uuid"]},
                     indent=4, sort_keys=True))
elif args[:1] == ["dump"]:
    if "-j" in args:
        print("Not supported without the --rawdata option, "
              "which is only available in the daemon version")
        sys.exit(1)
    ids = [int(x) for x in opt("-d", "0").split(",")]
    metrics = [int(x) for x in opt("-m", "0").split(",")]
    names = {0: "Average % utilization of all GPU Engines", 5: "GPU Memory Utilization (%)",
             18: "GPU Memory Used (MiB)"}
    print(", ".join(["Timestamp", "DeviceId"] + [names[m] for m in metrics]))
    sys.stdout.flush()
    samples = int(opt("-n", "0"))
    n = 0
    while samples == 0 or n < samples:
        time.sleep(DATA.get("interval_s", 1.0))
        for i in ids:
            c = cards[i]
            cells = ["%.2f" % c["metrics"][str(m)] if c["metrics"].get(str(m)) is not None
                     else "N/A" for m in metrics]
            print(", ".join(["10:02:03.000", "%4d" % i] + ["%4s" % v for v in cells]))
        sys.stdout.flush()
        n += 1
elif args == ["topology", "-m"]:  # DATA["topology"], else tiles of other cards across SYS
    if DATA.get("topology"):
        print(DATA["topology"])
        sys.exit(0)
    tiles = [(i, t) for i, c in enumerate(cards) for t in range(c["tiles"])]
    print(" " * 12 + "".join(("GPU %d/%d" % x).ljust(20) for x in tiles) + "CPU Affinity")
    for a in tiles:
        cells = ["S" if a == b else "MDF" if a[0] == b[0] else "SYS" for b in tiles]
        print(("GPU %d/%d" % a).ljust(12) + "".join(c.ljust(20) for c in cells) + "0-63")
else:
    print("fake xpu-smi 1.x: unsupported " + " ".join(args))
    sys.exit(2)
"""

# xpu-smi 2.x: Sysman enumeration (masks do not apply); nvidia-smi style --query-gpu.
XPU_SMI_V2 = r"""
args = sys.argv[1:]
UNITS = {"memory.total": "MiB", "memory.used": "MiB", "memory.free": "MiB", "utilization.gpu": "%"}
query = [a.split("=", 1)[1].split(",") for a in args if a.startswith("--query-gpu=")]
fmt = [a.split("=", 1)[1].split(",") for a in args if a.startswith("--format=")]
if "--list-gpus" in args:
    for c in DATA["cards"]:
        print("GPU %d: %s (UUID: GPU-%s)" % (c["index"], c["name"], c["uuid"]))
elif query:
    opts = fmt[0] if fmt else ["csv"]
    if "noheader" not in opts:
        print(", ".join(f + (" (%s)" % UNITS[f] if f in UNITS and "nounits" not in opts else "")
                        for f in query[0]))
    for c in DATA["cards"]:
        row = {"index": c["index"], "uuid": "GPU-" + c["uuid"], "pci.bus_id": c["bdf"],
               "memory.total": c["total_mib"], "memory.used": c["used_mib"],
               "memory.free": c["total_mib"] - c["used_mib"], "utilization.gpu": c["util"]}
        print(", ".join(str(row[f]) for f in query[0]))
else:
    print("fake xpu-smi 2.x: unsupported " + " ".join(args))
    sys.exit(2)
"""

ROCM_SMI = r"""
# json.dumps of JSON_DATA: every value a string; keys card<smi index> (rocm_smi.py)
print(json.dumps({"card%d" % i: {"VRAM Total Memory (B)": str(c["total"]),
                                 "VRAM Total Used Memory (B)": str(c["used"]),
                                 "PCI Bus": c["bdf"].upper(), "GPU use (%)": str(c["util"])}
                  for i, c in enumerate(DATA["cards"])}))
"""

AMD_SMI = r"""
args = sys.argv[1:]
cards = DATA["cards"]
if args[:1] == ["list"]:
    listing = [{"gpu": i, "bdf": c["bdf"], "uuid": c["uuid"], "kfd_id": 1000 + i,
                "node_id": 2 + i, "partition_id": 0} for i, c in enumerate(cards)]
    print(json.dumps(listing, indent=4))
elif args[:1] == ["metric"]:
    def mb(v):
        return {"value": v // (1024 * 1024), "unit": "MB"} if v is not None else "N/A"
    print(json.dumps([{"gpu": i, "mem_usage": {"total_vram": mb(c["total"]),
                       "used_vram": mb(c["used"]),
                       "free_vram": mb(None if c["used"] is None else c["total"] - c["used"]),
                       "total_visible_vram": mb(c["total"]), "total_gtt": "N/A"}}
                      for i, c in enumerate(cards)], indent=4))
else:
    sys.exit(2)
"""

SLEEPER = r"""
time.sleep(60)
"""


def max1550_cards(*, used_mib: tuple[float, float] = (26.31, 40102.55)) -> list[dict[str, Any]]:
    """The two Max 1550 of MAX1550 as xpu-smi 1.x reports them (dump values: section 2.5)."""
    utils = (0.0, 97.5)
    mem_utils = (0.04, 61.23)
    return [
        {"name": "Intel(R) Data Center GPU Max 1550", "bdf": c["bdf"], "uuid": c["uuid"],
         "minor": c["minor"], "pci_device_id": "0xbd5", "physical": MAX1550_LMEM_BYTES,
         "free": MAX1550_LMEM_BYTES - round(u * MIB), "tiles": 2,
         "metrics": {"0": util, "5": mem, "18": u}}
        for c, u, util, mem in zip(MAX1550, used_mib, utils, mem_utils, strict=True)
    ]  # fmt: skip


def tool_path(bin_dir: Path | None) -> str:
    """PATH with the fake tools and nothing else: on a GPU host /usr/bin has the real
    nvidia-smi, which would answer for a tool the test means to be missing. (The fakes run
    under this Python by absolute path and need nothing from PATH.)"""
    return str(bin_dir) if bin_dir else "/nonexistent-xpulaunch-test-tools"


def probe_fake(m: FakeMachine, bin_dir: Path | None = None, **kwargs: Any) -> Inventory:
    """``probe_host`` on a fake machine: its roots, its PATH, no real NVML or pyzes."""
    kwargs.setdefault("nvml_module", FakeNvml([], init_error=pynvml.NVML_ERROR_LIBRARY_NOT_FOUND))
    kwargs.setdefault("use_pyzes", False)
    env = {"PATH": tool_path(bin_dir), **kwargs.pop("env", {})}
    return probe_host(sys_root=m.sys, proc_root=m.proc, env=env, **kwargs)


def by_bus(inventory: Inventory) -> dict[str, Device]:
    return {d.pci_bus_id or "": d for d in inventory.devices}


def messages(inventory: Inventory) -> str:
    return "\n".join(str(p) for p in inventory.problems)


# --- fake NVML -----------------------------------------------------------------------------


class _Struct:
    def __init__(self, **fields: Any) -> None:
        self.__dict__.update(fields)


class FakeNvml:
    """Enough of ``pynvml`` for the probe, with the real module's errors and constants.

    GPU dicts: ``uuid``, ``bus`` (NVML's ``00000000:00:06.0``), ``name``, ``total``,
    ``used_v1`` (includes the reserve), ``used_v2``, optional ``util_error`` (an NVML error
    code), ``mig`` (None = not MIG capable, else list of MIG dicts with uuid/total/used).
    """

    NVMLError = pynvml.NVMLError
    nvmlMemory_v2 = pynvml.nvmlMemory_v2
    NVML_DEVICE_MIG_ENABLE = pynvml.NVML_DEVICE_MIG_ENABLE
    NVML_ERROR_LIBRARY_NOT_FOUND = pynvml.NVML_ERROR_LIBRARY_NOT_FOUND
    NVML_ERROR_DRIVER_NOT_LOADED = pynvml.NVML_ERROR_DRIVER_NOT_LOADED
    NVML_ERROR_NOT_SUPPORTED = pynvml.NVML_ERROR_NOT_SUPPORTED
    NVML_ERROR_NOT_FOUND = pynvml.NVML_ERROR_NOT_FOUND
    NVML_TEMPERATURE_GPU = pynvml.NVML_TEMPERATURE_GPU
    NVML_ERROR_INVALID_ARGUMENT = pynvml.NVML_ERROR_INVALID_ARGUMENT
    NVML_FEATURE_ENABLED = pynvml.NVML_FEATURE_ENABLED
    NVML_NVLINK_MAX_LINKS = pynvml.NVML_NVLINK_MAX_LINKS

    def __init__(
        self, gpus: list[dict[str, Any]], *, init_error: int | None = None, v2: bool = True
    ) -> None:
        self.gpus = gpus
        self.init_error = init_error
        self.v2 = v2
        self.calls: list[str] = []
        self.initialised = 0

    def nvmlInit(self) -> None:
        self.calls.append("nvmlInit")
        if self.init_error is not None:
            raise pynvml.NVMLError(self.init_error)
        self.initialised += 1

    def nvmlShutdown(self) -> None:
        self.calls.append("nvmlShutdown")
        self.initialised -= 1

    def nvmlSystemGetDriverVersion(self) -> str:
        return "580.159.04"

    def nvmlDeviceGetCount(self) -> int:
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> dict[str, Any]:
        return self.gpus[index]

    def nvmlDeviceGetUUID(self, h: dict[str, Any]) -> str:
        return str(h["uuid"])

    def nvmlDeviceGetName(self, h: dict[str, Any]) -> str:
        return str(h["name"])

    def nvmlDeviceGetPciInfo(self, h: dict[str, Any]) -> _Struct:
        return _Struct(busId=h["bus"], busIdLegacy=h["bus"][4:])

    def nvmlDeviceGetMemoryInfo(self, h: dict[str, Any], version: int | None = None) -> _Struct:
        self.calls.append(f"memory v{2 if version else 1}")
        if version:
            if not self.v2:
                raise pynvml.NVMLError(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)
            reserved = h["used_v1"] - h["used_v2"]
            free = h["total"] - h["used_v1"]
            return _Struct(total=h["total"], reserved=reserved, free=free, used=h["used_v2"])
        return _Struct(total=h["total"], free=h["total"] - h["used_v1"], used=h["used_v1"])

    def nvmlDeviceGetUtilizationRates(self, h: dict[str, Any]) -> _Struct:
        if h.get("util_error") is not None:
            raise pynvml.NVMLError(h["util_error"])
        return _Struct(gpu=h.get("util", 0), memory=0)

    def nvmlDeviceGetTemperature(self, h: dict[str, Any], sensor: int) -> int:
        """``temp`` (°C) of the GPU dict; "Not Supported" without one, as some boards say."""
        if sensor != pynvml.NVML_TEMPERATURE_GPU or "temp" not in h:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return int(h["temp"])

    def nvmlDeviceGetPowerUsage(self, h: dict[str, Any]) -> int:
        """``power_mw`` of the GPU dict (NVML's milliwatts)."""
        if "power_mw" not in h:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return int(h["power_mw"])

    def nvmlDeviceGetMigMode(self, h: dict[str, Any]) -> list[int]:
        if h.get("mig") is None:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        mode = pynvml.NVML_DEVICE_MIG_ENABLE if h["mig"] else pynvml.NVML_DEVICE_MIG_DISABLE
        return [mode, mode]

    def nvmlDeviceGetMaxMigDeviceCount(self, h: dict[str, Any]) -> int:
        return 7

    def nvmlDeviceGetComputeRunningProcesses(self, h: dict[str, Any]) -> list[_Struct]:
        """pynvml's c_nvmlProcessInfo_t list; usedGpuMemory None where NVML has no value."""
        return [_Struct(pid=p["pid"], usedGpuMemory=p["used"]) for p in h.get("processes", [])]

    # A GPU's "nvlinks": one (remote PCI address, remote device type) a link, all active; a
    # GPU without any answers Not Supported for link 0, as a PCIe board does. "ancestors":
    # other GPU's NVML bus id -> nvmlGpuTopologyLevel_t; without it, Not Supported.
    def nvmlDeviceGetNvLinkState(self, h: dict[str, Any], link: int) -> int:
        self.calls.append("nvlink state")
        links = h.get("nvlinks")
        if not links:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        if link >= len(links):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return int(pynvml.NVML_FEATURE_ENABLED)

    def nvmlDeviceGetNvLinkRemotePciInfo(self, h: dict[str, Any], link: int) -> _Struct:
        return _Struct(busId=h["nvlinks"][link][0])

    def nvmlDeviceGetNvLinkRemoteDeviceType(self, h: dict[str, Any], link: int) -> int:
        return int(h["nvlinks"][link][1])

    def nvmlDeviceGetTopologyCommonAncestor(self, a: dict[str, Any], b: dict[str, Any]) -> int:
        self.calls.append("common ancestor")
        if b["bus"] not in a.get("ancestors", {}):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return int(a["ancestors"][b["bus"]])

    def nvmlDeviceGetMigDeviceHandleByIndex(self, h: dict[str, Any], slot: int) -> dict[str, Any]:
        if slot >= len(h["mig"]):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_FOUND)
        mig = h["mig"][slot]
        return {"uuid": mig["uuid"], "total": mig["total"], "used_v1": mig["used"],
                "used_v2": mig["used"]}  # fmt: skip


def nvml_h200(**overrides: Any) -> list[dict[str, Any]]:
    """The two H200 of reference section 4.4: v1 used includes the 615 MiB reserve."""
    return [
        {"uuid": g["uuid"], "bus": "0000" + g["bdf"].upper(), "name": "NVIDIA H200",
         "total": 150754820096, "used_v1": 644939776, "used_v2": 0, "util": 0, "mig": None,
         **overrides}
        for g in H200
    ]  # fmt: skip
