"""xpu-smi 1.x / 2.x output, the torch.xpu helper's JSON, and Intel PCI-id facts.

Formats as xpumanager's ``doc/smi_user_guide.md`` and ``cli/src/comlet_dump.cpp`` give them. The two
xpu-smi generations differ: 1.x has no JSON ``dump`` and its header text changes between releases,
so its CSV is read by column position in the ``-m`` list; 2.x has nvidia-smi style ``--query-gpu``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from xpulaunch.core.intel_family import XE_HPC
from xpulaunch.model import Vendor
from xpulaunch.probing.observe import Observation
from xpulaunch.probing.parsers.common import (
    ParseError,
    clip,
    integer,
    load_json,
    mib_to_bytes,
    number,
    pci_address,
    percent,
    split_csv_rows,
    text,
)

# Device id -> (product name, tiles per card; None = unknown). Every Data Center GPU Max id
# compute-runtime knows (core.intel_family, from devices_base.inl), then the other families.
PRODUCTS: Mapping[int, tuple[str, int | None]] = {
    **XE_HPC,
    0x56C0: ("Intel(R) Data Center GPU Flex 170", 1),
    0x56C1: ("Intel(R) Data Center GPU Flex 140", 1),
    0x56A0: ("Intel(R) Arc(TM) A770 Graphics", 1),
    0x56A1: ("Intel(R) Arc(TM) A750 Graphics", 1),
    0xE20B: ("Intel(R) Arc(TM) B580 Graphics", 1),
    0xE20C: ("Intel(R) Arc(TM) B570 Graphics", 1),
    0xE211: ("Intel(R) Arc(TM) Pro B60 Graphics", 1),
    0xE212: ("Intel(R) Arc(TM) Pro B50 Graphics", 1),
}
# High bytes of the discrete families: DG1 (0x49xx), DG2/Alchemist/Flex (0x56xx), Ponte Vecchio
# (0x0bdx), Battlemage (0xe2xx). Anything else is integrated when it sits where Intel places its
# iGPU (bus 0, device 2), else assumed discrete (a newer card).
_DISCRETE_PREFIXES = (0x49, 0x56, 0xE2)
_IGPU_SLOT = re.compile(r"^[0-9a-f]{4}:00:02\.[0-7]$")

DUMP_METRICS = (0, 5, 18)  # GPU utilisation %, memory utilisation %, memory used MiB
_DUMP_REFUSAL = "Not supported without the --rawdata option"
QUERY_V2_FIELDS = ["index", "uuid", "pci.bus_id", "memory.total", "memory.used", "utilization.gpu"]
_LIST_GPU = re.compile(r"^GPU (\d+): (.*) \(UUID: (\S+)\)\s*$")


def is_discrete(device_id: int | None, bus_id: str | None, has_vram: bool = False) -> bool:
    if has_vram or (
        device_id is not None and (device_id >> 8 in _DISCRETE_PREFIXES or device_id >> 4 == 0x0BD)
    ):
        return True
    return not (bus_id is not None and _IGPU_SLOT.match(bus_id))


def bare_uuid(value: str | None) -> str | None:
    """Intel UUIDs without xpu-smi 2.x's ``GPU-`` prefix, so both generations agree with 1.x."""
    if value is None:
        return None
    return value[4:] if value.upper().startswith("GPU-") else value


@dataclass(frozen=True, slots=True)
class XpuSmiCard:
    """One entry of 1.x ``discovery -j``: the tool's device id and the card's identity."""

    device_id: int
    observation: Observation


def parse_discovery_json(output: str) -> list[XpuSmiCard]:
    """``xpu-smi discovery -j`` (1.x: ``{"device_list": [...]}``, sorted keys, 4-space indent)."""
    doc = load_json(output, "xpu-smi discovery -j")
    if not isinstance(doc, dict) or not isinstance(doc.get("device_list"), list):
        raise ParseError(f"xpu-smi discovery -j: no 'device_list' in {clip(output)!r}")
    cards = []
    for raw in doc["device_list"]:
        device_id = integer(raw.get("device_id")) if isinstance(raw, dict) else None
        if device_id is None:
            raise ParseError(f"xpu-smi discovery -j: entry without a device_id: {raw!r}")
        cards.append(XpuSmiCard(device_id, _discovery_observation(raw)))
    return cards


def _discovery_observation(raw: Mapping[str, object]) -> Observation:
    pci_id = text(raw.get("pci_device_id"))
    device_id = int(pci_id, 16) if pci_id and re.fullmatch(r"0[xX][0-9a-fA-F]+", pci_id) else None
    bus_id = pci_address(raw.get("pci_bdf_address"))
    return Observation(
        vendor=Vendor.INTEL,
        sources=("xpu-smi",),
        pci_bus_id=bus_id,
        uuid=bare_uuid(text(raw.get("uuid"))),
        name=text(raw.get("device_name")),
        integrated=None if device_id is None else not is_discrete(device_id, bus_id),
        extra={"pci_device_id": f"0x{device_id:04x}"} if device_id is not None else {},
    )


@dataclass(frozen=True, slots=True)
class XpuSmiDetail:
    """The parts of 1.x ``discovery -d N -j`` we use (bytes; tiles per card)."""

    memory_physical_bytes: int | None
    memory_free_bytes: int | None
    tiles: int | None


def parse_discovery_detail_json(output: str) -> XpuSmiDetail:
    doc = load_json(output, "xpu-smi discovery -d N -j")
    if not isinstance(doc, dict) or "error" in doc:
        raise ParseError(f"xpu-smi discovery -d N -j: {clip(output)!r}")
    tiles = integer(doc.get("number_of_tiles"))
    return XpuSmiDetail(
        memory_physical_bytes=integer(doc.get("memory_physical_size_byte")),
        memory_free_bytes=integer(doc.get("memory_free_size_byte")),
        tiles=tiles if tiles and tiles > 0 else None,
    )


def parse_dump_csv(
    output: str, metrics: Sequence[int] = DUMP_METRICS
) -> dict[int, dict[int, float | None]]:
    """``xpu-smi dump -d ... -m <metrics> -n 1`` (1.x CSV) -> device id -> metric id -> value.

    Columns are ``Timestamp, DeviceId, <metrics in -m order>`` (no ``TileId`` without ``-t``);
    they are read by POSITION because the header text differs by release (id 0 is "GPU
    Utilization (%)" in 1.2 and "Average % utilization of all GPU Engines" in 1.3).
    """
    if _DUMP_REFUSAL in output:
        raise ParseError("xpu-smi 1.x has no JSON dump ('dump -j' needs the daemon's --rawdata)")
    rows: dict[int, dict[int, float | None]] = {}
    for line in output.splitlines():
        cells = [c.strip() for c in line.split(",")]
        device_id = integer(cells[1]) if len(cells) == 2 + len(metrics) else None
        if device_id is None or cells[0] == "Timestamp":
            continue
        rows[device_id] = {m: number(c) for m, c in zip(metrics, cells[2:], strict=True)}
    if not rows:
        raise ParseError(f"xpu-smi dump: no data rows in {clip(output)!r}")
    return rows


def parse_query_gpu_v2(output: str, fields: list[str] | None = None) -> list[Observation]:
    """xpu-smi 2.x ``--query-gpu=... --format=csv[,noheader,nounits]`` (memory in MiB)."""
    _, rows = split_csv_rows(output, fields)
    if not rows:
        raise ParseError(f"xpu-smi --query-gpu: no rows in {clip(output)!r}")
    return [
        Observation(
            vendor=Vendor.INTEL,
            sources=("xpu-smi",),
            index=integer(row.get("index")),
            uuid=bare_uuid(text(row.get("uuid"))),
            pci_bus_id=pci_address(row.get("pci.bus_id")),
            memory_total_bytes=mib_to_bytes(row.get("memory.total")),
            memory_used_bytes=mib_to_bytes(row.get("memory.used")),
            utilization_percent=percent(row.get("utilization.gpu")),
        )
        for row in rows
    ]


def parse_list_gpus_v2(output: str) -> dict[str, str]:
    """xpu-smi 2.x ``--list-gpus`` (``GPU 0: <name> (UUID: GPU-<uuid>)``) -> bare uuid -> name."""
    names = {}
    for line in output.splitlines():
        match = _LIST_GPU.match(line.strip())
        if match:
            names[bare_uuid(match[3]) or match[3]] = match[2].strip()
    return names


@dataclass(frozen=True, slots=True)
class TorchXpu:
    """One ``torch.xpu`` device as the throw-away helper process reported it."""

    index: int
    name: str | None
    uuid: str | None
    integrated: bool | None
    total_memory_bytes: int | None
    free_memory_bytes: int | None
    free_error: str | None


def parse_torch_xpu_json(output: str) -> list[TorchXpu]:
    """The helper prints one JSON object: ``{"devices": [...]}`` or ``{"error": "..."}``."""
    lines = [line for line in output.splitlines() if line.startswith("{")]
    doc = load_json(lines[-1] if lines else output, "torch.xpu helper")
    if not isinstance(doc, dict) or not isinstance(doc.get("devices"), list):
        message = doc.get("error") if isinstance(doc, dict) else None
        raise ParseError(str(message or f"unexpected output {clip(output)!r}"))
    return [_torch_device(raw) for raw in doc["devices"] if isinstance(raw, dict)]


def _torch_device(raw: Mapping[str, object]) -> TorchXpu:
    integrated = raw.get("is_integrated")
    return TorchXpu(
        index=integer(raw.get("index")) or 0,
        name=text(raw.get("name")),
        uuid=text(raw.get("uuid")),
        integrated=integrated if isinstance(integrated, bool) else None,
        total_memory_bytes=integer(raw.get("total_memory")),
        free_memory_bytes=integer(raw.get("free_memory")),
        free_error=text(raw.get("free_error")),
    )
