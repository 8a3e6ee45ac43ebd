"""nvidia-smi CSV and ``/proc/driver/nvidia/gpus/*/information``."""

from __future__ import annotations

from xpulaunch.model import Vendor
from xpulaunch.probing.observe import Observation
from xpulaunch.probing.parsers.common import (
    integer,
    mib_to_bytes,
    pci_address,
    percent,
    split_csv_rows,
    text,
)

# Queried in this order; ``name`` last because it is free text (see split_csv_rows).
QUERY_FIELDS = [
    "index",
    "uuid",
    "pci.bus_id",
    "memory.total",
    "memory.used",
    "utilization.gpu",
    "mig.mode.current",
    "name",
]
QUERY_ARGV = [
    "nvidia-smi",
    f"--query-gpu={','.join(QUERY_FIELDS)}",
    "--format=csv,noheader,nounits",
]
# `nvidia-smi -i <bad>` and a host whose GPUs are all gone print this and exit 6 (as run).
NO_DEVICES_TEXT = "No devices were found"
NO_DEVICES_EXIT = 6


def parse_query_gpu(output: str, fields: list[str] | None = None) -> list[Observation]:
    """Rows of ``nvidia-smi --query-gpu=... --format=csv[,noheader][,nounits]``.

    ``memory.used`` is used memory *without* the driver reserve (``memory.total - memory.used``
    is not ``memory.free``; the reserve is ``memory.reserved``), which is what the contract wants.
    Pass ``fields`` for ``noheader`` output; otherwise the header names them.
    """
    _, rows = split_csv_rows(output, fields)
    return [_observation(row) for row in rows]


def _observation(row: dict[str, str]) -> Observation:
    mig = text(row.get("mig.mode.current"))
    return Observation(
        vendor=Vendor.NVIDIA,
        sources=("nvidia-smi",),
        index=integer(row.get("index")),
        uuid=text(row.get("uuid")),
        pci_bus_id=pci_address(row.get("pci.bus_id")),
        name=text(row.get("name")),
        integrated=False,
        tiles=1,
        memory_total_bytes=mib_to_bytes(row.get("memory.total")),
        memory_used_bytes=mib_to_bytes(row.get("memory.used")),
        utilization_percent=percent(row.get("utilization.gpu")),
        extra={"mig_mode": mig} if mig else {},
    )


def parse_proc_information(output: str) -> Observation:
    """``/proc/driver/nvidia/gpus/<BDF>/information``: identity only, no memory figures.

    Lines are ``Key: <tabs and spaces> value``; the UUID line is ``GPU UUID:``.
    """
    pairs = (line.partition(":") for line in output.splitlines())
    fields = {key.strip(): value.strip() for key, sep, value in pairs if sep}
    minor = integer(fields.get("Device Minor"))
    return Observation(
        vendor=Vendor.NVIDIA,
        sources=("procfs",),
        pci_bus_id=pci_address(fields.get("Bus Location")),
        uuid=text(fields.get("GPU UUID")),
        name=text(fields.get("Model")),
        integrated=False,
        tiles=1,
        extra={"device_minor": minor} if minor is not None else {},
    )
