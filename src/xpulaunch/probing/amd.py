"""AMD: amdgpu sysfs (no runtime, no root), then amd-smi or rocm-smi for what sysfs lacks.

amdgpu exposes ``mem_info_vram_total``/``mem_info_vram_used`` (bytes, mode 0444) and
``gpu_busy_percent`` on the PCI device (amdgpu_vram_mgr.c), so the
SMI tools are only a fallback; their JSON layout has changed between releases (section 5.4).
"""

from __future__ import annotations

import os
import re

from xpulaunch.core.visibility import VENDOR_VARS
from xpulaunch.model import Problem, Vendor
from xpulaunch.probing.context import (
    ProbeContext,
    VendorResult,
    failed,
    not_installed,
    parsed_run,
    run_tool,
)
from xpulaunch.probing.kfd import (
    partition_mode,
    read_kfd_nodes,
    split_partitions,
    with_xgmi_links,
)
from xpulaunch.probing.observe import Observation, merge
from xpulaunch.probing.parsers.amd import (
    AMD_SMI_LIST_ARGV,
    AMD_SMI_MEM_ARGV,
    PRODUCTS,
    ROCM_SMI_ARGV,
    parse_amd_smi,
    parse_rocm_smi_json,
)
from xpulaunch.probing.parsers.common import ParseError, percent
from xpulaunch.probing.runner import RunResult
from xpulaunch.probing.sysfs import PciGpu, hwmon_readings, read_int, read_text

# The SMI tools may honour the ROCm visibility variables (not verified); we want every
# physical GPU.
_SELECTION_VARS = VENDOR_VARS[Vendor.AMD]
_HEX_ID = re.compile(r"^(?:0x)?([0-9a-fA-F]{8,32})$")


def probe_amd(ctx: ProbeContext, pci: list[PciGpu] | None) -> VendorResult:
    listed = None if pci is None else [g for g in pci if g.vendor is Vendor.AMD]
    result = VendorResult()
    if listed == []:
        return result
    nodes = read_kfd_nodes(ctx.sys_root, result.problems) if listed else None
    cards = []
    for gpu in listed or []:
        card = _from_sysfs(gpu, result)
        if card is not None:
            parts, problems = split_partitions(card, nodes, partition_mode(gpu.path, []))
            cards += parts
            result.problems += problems
    if listed and not cards:
        return result
    if ctx.read_topology:
        cards = with_xgmi_links(cards, nodes)
    lacking = [c for c in cards if c.memory_total_bytes is None or c.memory_used_bytes is None]
    tried: list[Problem] = []
    if listed is None or lacking:
        found, problems, notes = _from_smi(ctx)
        tried += problems + notes
        result.problems += problems
        result.notes += notes
        known = {c.pci_bus_id for c in cards}
        usable = [o for o in found if o.pci_bus_id and (listed is None or o.pci_bus_id in known)]
        cards, conflicts = merge(cards, usable)
        result.problems += conflicts
    result.problems += _unknown_memory(cards, tried)
    result.observations = cards
    return result


def _from_sysfs(gpu: PciGpu, result: VendorResult) -> Observation | None:
    if not gpu.has_gpu_driver:
        result.problems.append(gpu.skipped())
        return None
    problems = result.problems
    busy = read_int(os.path.join(gpu.path, "gpu_busy_percent"), problems)
    return Observation(
        vendor=Vendor.AMD,
        sources=("sysfs",),
        pci_bus_id=gpu.bus_id,
        uuid=_uuid(read_text(os.path.join(gpu.path, "unique_id"), problems)),
        name=read_text(os.path.join(gpu.path, "product_name"), problems)
        or PRODUCTS.get(gpu.device_id or -1),
        integrated=False,  # amdgpu has no sysfs flag for APUs; unknown APUs count as discrete
        tiles=1,
        memory_total_bytes=read_int(os.path.join(gpu.path, "mem_info_vram_total"), problems),
        memory_used_bytes=read_int(os.path.join(gpu.path, "mem_info_vram_used"), problems),
        utilization_percent=percent(busy),
        extra={**gpu.facts(), **hwmon_readings(gpu.path)},
    )


def _uuid(unique_id: str | None) -> str | None:
    """``unique_id`` (hex) as ROCr spells the UUID in ROCR_VISIBLE_DEVICES: ``GPU-<hex>``
    (inferred from ROCr's documentation, not verified on hardware)."""
    match = _HEX_ID.match(unique_id or "")
    return f"GPU-{match[1].lower()}" if match else None


def _from_smi(ctx: ProbeContext) -> tuple[list[Observation], list[Problem], list[Problem]]:
    """amd-smi (current), else rocm-smi (deprecated); each entry keyed by its PCI address."""
    listing = run_tool(ctx, AMD_SMI_LIST_ARGV, drop_env=_SELECTION_VARS)
    if listing is not None:
        found, problem = _amd_smi(ctx, listing)
        return found, [] if problem is None else [problem], []
    notes = [not_installed("amd-smi")]
    rocm = parsed_run(ctx, ROCM_SMI_ARGV, parse_rocm_smi_json, "rocm-smi", drop_env=_SELECTION_VARS)
    if rocm is None:
        return [], [], [*notes, not_installed("rocm-smi")]
    if isinstance(rocm, Problem):
        return [], [rocm], notes
    return rocm, [], notes


def _amd_smi(
    ctx: ProbeContext, listing: RunResult | Problem
) -> tuple[list[Observation], Problem | None]:
    if isinstance(listing, Problem):
        return [], listing
    if listing.returncode != 0:
        return [], failed(listing, "amd-smi")
    memory = run_tool(ctx, AMD_SMI_MEM_ARGV, drop_env=_SELECTION_VARS)
    mem_text = memory.stdout if isinstance(memory, RunResult) and memory.returncode == 0 else None
    try:
        found = parse_amd_smi(listing.stdout, mem_text)
    except ParseError as exc:
        return [], Problem("amd-smi", str(exc))
    if mem_text is None:
        why = memory if isinstance(memory, Problem) else None
        return found, why or Problem("amd-smi", "metric --mem-usage gave no usable output")
    return found, None


def _unknown_memory(cards: list[Observation], tried: list[Problem]) -> list[Problem]:
    problems = []
    for card in cards:
        if card.memory_total_bytes is None or card.memory_used_bytes is None:
            why = "; ".join(["no mem_info_vram_* sysfs files", *(str(p) for p in tried)])
            problems.append(Problem("amd", f"memory unknown ({why})", card.key))
    return problems
