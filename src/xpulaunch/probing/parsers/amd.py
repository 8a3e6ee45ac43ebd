"""rocm-smi and amd-smi JSON (rocm-smi's ``rocm_smi.py``, amd-smi's ``amdsmi_commands.py``).

Both tools number GPUs by their SMI library index (``card0``, ``"gpu": 0``), which is neither
the DRM card number nor anything else we key on (rocm-smi's ``card1`` may be DRM's ``card2``,
the order differs between tools): every entry is joined on its PCI address, and an entry without one
is dropped by the adapter.
"""

from __future__ import annotations

from collections.abc import Mapping

from xpulaunch.model import Vendor
from xpulaunch.probing.observe import Observation
from xpulaunch.probing.parsers.common import (
    MIB,
    ParseError,
    clip,
    integer,
    load_json,
    number,
    pci_address,
    percent,
    text,
)

ROCM_SMI_ARGV = ["rocm-smi", "--showmeminfo", "vram", "--showbus", "--showuse", "--json"]
AMD_SMI_LIST_ARGV = ["amd-smi", "list", "--json"]
AMD_SMI_MEM_ARGV = ["amd-smi", "metric", "--mem-usage", "--json"]
# Well-known Instinct device ids, for a name when the board has no product_name file.
PRODUCTS: Mapping[int, str] = {
    0x74A1: "AMD Instinct MI300X",
    0x740F: "AMD Instinct MI210",
    0x740C: "AMD Instinct MI250X/MI250",
    0x738C: "AMD Instinct MI100",
}
_UNIT_BYTES = {"B": 1, "KB": 1024, "MB": MIB, "MIB": MIB, "GB": 1024 * MIB, "GIB": 1024 * MIB}


def parse_rocm_smi_json(output: str) -> list[Observation]:
    """``rocm-smi ... --json``: ``{"card<smi index>": {"<label>": "<string value>"}}``."""
    doc = _last_json_object(output, "rocm-smi --json")
    return [
        Observation(
            vendor=Vendor.AMD,
            sources=("rocm-smi",),
            pci_bus_id=pci_address(values.get("PCI Bus")),
            memory_total_bytes=integer(values.get("VRAM Total Memory (B)")),
            memory_used_bytes=integer(values.get("VRAM Total Used Memory (B)")),
            utilization_percent=percent(values.get("GPU use (%)")),
            extra={"smi_index": key},
        )
        for key, values in doc.items()
        if key.startswith("card") and isinstance(values, dict)
    ]


def parse_amd_smi(list_output: str, mem_output: str | None) -> list[Observation]:
    """``amd-smi list --json`` joined with ``amd-smi metric --mem-usage --json`` on ``gpu``."""
    memory = {}
    if mem_output is not None:
        for entry in _entries(mem_output, "amd-smi metric --json"):
            usage = entry.get("mem_usage")
            if isinstance(usage, dict):
                memory[integer(entry.get("gpu"))] = usage
    result = []
    for entry in _entries(list_output, "amd-smi list --json"):
        gpu = integer(entry.get("gpu"))
        usage = memory.get(gpu, {})
        result.append(
            Observation(
                vendor=Vendor.AMD,
                sources=("amd-smi",),
                pci_bus_id=pci_address(entry.get("bdf")),
                # amd-smi's uuid (abff74a1-0000-1000-80d1-...) is not ROCr's GPU-<16 hex>: it
                # is never a device id or a ROCR_VISIBLE_DEVICES entry, so it stays a fact.
                memory_total_bytes=_sized(usage.get("total_vram")),
                memory_used_bytes=_sized(usage.get("used_vram")),
                extra={"smi_index": gpu, "amd_smi_uuid": text(entry.get("uuid"))},
            )
        )
    return result


def _sized(cell: object) -> int | None:
    """``{"value": 65520, "unit": "MB"}`` -> bytes. amd-smi's "MB" is MiB (``// (1024*1024)``)."""
    if not isinstance(cell, dict):
        return None
    value = number(cell.get("value"))
    scale = _UNIT_BYTES.get(str(cell.get("unit", "MB")).upper())
    if value is None or scale is None or value < 0:
        return None
    return round(value * scale)


def _entries(output: str, what: str) -> list[dict[str, object]]:
    """A JSON list of objects; amd-smi 26 wraps it as ``{"gpu_data": [...]}`` (amdsmi
    CHANGELOG), and other releases may use another single key, so unwrap one level."""
    doc = load_json(output, what)
    if isinstance(doc, dict) and isinstance(doc.get("gpu_data"), list):
        doc = doc["gpu_data"]
    if isinstance(doc, dict):
        lists = [v for v in doc.values() if isinstance(v, list)]
        doc = lists[0] if len(lists) == 1 else doc
    if not isinstance(doc, list):
        raise ParseError(f"{what}: expected a list of GPUs, got {clip(output)!r}")
    return [e for e in doc if isinstance(e, dict)]


def _last_json_object(output: str, what: str) -> dict[str, object]:
    """rocm-smi prints one ``json.dumps`` line, possibly after warnings: take the JSON line."""
    lines = [line for line in output.splitlines() if line.lstrip().startswith("{")]
    doc = load_json(lines[-1] if lines else output, what)
    if not isinstance(doc, dict):
        raise ParseError(f"{what}: expected an object, got {clip(output)!r}")
    return doc
