"""Intel: cards from sysfs, then xpu-smi, pyzes and (opt-in) torch.xpu for what sysfs lacks.

Order of trust for memory: the i915 backport's
``lmem_total_bytes``/``lmem_avail_bytes`` (world-readable and real), else xpu-smi, else Sysman
through pyzes. i915 and xe report usage only to CAP_PERFMON/root callers and otherwise show
free == total, so an unprivileged "0 bytes used" is unknown, not idle.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import replace

from xpulaunch.core.intel_family import reports_one_tile
from xpulaunch.model import Problem, Vendor
from xpulaunch.probing.context import ProbeContext, VendorResult
from xpulaunch.probing.gpu_processes import drm_memory_in_use
from xpulaunch.probing.levelzero import import_pyzes, probe_pyzes
from xpulaunch.probing.observe import Observation, merge
from xpulaunch.probing.parsers.intel import PRODUCTS, is_discrete
from xpulaunch.probing.sysfs import PciGpu, count_tiles, hwmon_readings, read_int
from xpulaunch.probing.torchxpu import match_torch, probe_torch_xpu, torch_observation
from xpulaunch.probing.xpusmi import probe_xpu_smi

_Source = Callable[[], tuple[list[Observation] | None, list[Problem], list[Problem]]]


def probe_intel(ctx: ProbeContext, pci: list[PciGpu] | None) -> VendorResult:
    listed = None if pci is None else [g for g in pci if g.vendor is Vendor.INTEL]
    result = VendorResult()
    if listed == []:
        return result
    cards = [obs for gpu in listed or [] if (obs := _from_sysfs(ctx, gpu, result)) is not None]
    if listed and not cards:
        return result
    tried: list[Problem] = []  # why a card's memory may still be unknown
    sources: list[_Source] = [lambda: _xpu_smi(ctx, cards)]
    if ctx.use_pyzes:
        sources.append(lambda: _pyzes(ctx))
    for source in sources:
        if (listed is not None or cards) and not any(_lacking(c) for c in cards):
            break
        found, problems, notes = source()
        tried += problems + notes
        result.problems += problems
        result.notes += notes
        cards = _absorb(ctx, cards, found or [], result, tried, sysfs_ok=listed is not None)
    if ctx.use_torch:
        cards = _torch(ctx, cards, result, tried)
    cards = _from_fdinfo(ctx, cards, tried)
    result.problems += _unknown_memory(cards, tried)
    result.observations = cards
    return result


def _from_sysfs(ctx: ProbeContext, gpu: PciGpu, result: VendorResult) -> Observation | None:
    """A card from its PCI directory; lmem files on the DRM minor (i915 backport), xe tiles."""
    if not gpu.has_gpu_driver:
        result.problems.append(gpu.skipped())
        return None
    total, used = _lmem(ctx, gpu, result.problems)
    source = "sysfs-lmem" if total is not None else "sysfs"
    if total is None:
        total = _xe_vram(gpu, result.problems)
    name, table_tiles = PRODUCTS.get(gpu.device_id or -1, (None, None))
    integrated = not is_discrete(gpu.device_id, gpu.bus_id, has_vram=total is not None)
    tiles = count_tiles(gpu) if gpu.driver == "xe" else None
    if total is not None and reports_one_tile(total, name, tiles or table_tiles):
        result.problems.append(_one_tile_lmem(gpu, total, tiles or table_tiles or 2))
        total, used = total * (tiles or table_tiles or 2), None
    return Observation(
        vendor=Vendor.INTEL,
        sources=(source,),
        pci_bus_id=gpu.bus_id,
        name=name,
        integrated=integrated,
        tiles=tiles or table_tiles or (1 if integrated else None),
        memory_total_bytes=total,
        memory_used_bytes=used,
        extra={**gpu.facts(), **hwmon_readings(gpu.path)},
    )


def _one_tile_lmem(gpu: PciGpu, lmem_total_bytes: int, tiles: int) -> Problem:
    return Problem(
        "sysfs-lmem",
        f"lmem_total_bytes ({lmem_total_bytes}) covers tile 0 only (the 2023 i915 ubuntu/main "
        f"backport): total taken as {tiles} x that, memory in use unknown",
        gpu.bus_id,
    )


def _from_fdinfo(
    ctx: ProbeContext, cards: list[Observation], tried: list[Problem]
) -> list[Observation]:
    """Memory in use from DRM fdinfo, where i915/xe hide it from sysfs: a complete reading
    needs every process's fdinfo, so only a privileged probe (root) tries, once."""
    lacking = [
        c.pci_bus_id
        for c in cards
        if c.pci_bus_id and c.memory_used_bytes is None and not c.integrated
    ]
    if not lacking:
        return cards
    if not ctx.perfmon:
        tried.append(Problem("fdinfo", "not summed: other users' processes need root"))
        return cards
    used = drm_memory_in_use(ctx.proc_root, lacking)
    if used is None:
        tried.append(Problem("fdinfo", "some process's fdinfo was unreadable"))
        return cards
    return [
        replace(c, memory_used_bytes=used[c.pci_bus_id], sources=(*c.sources, "fdinfo"))
        if c.pci_bus_id in used
        else c
        for c in cards
    ]


def _lmem(ctx: ProbeContext, gpu: PciGpu, problems: list[Problem]) -> tuple[int | None, int | None]:
    """i915 backport: ``/sys/class/drm/cardN/lmem_{total,avail}_bytes`` (not under device/)."""
    for card in gpu.drm_cards:
        base = os.path.join(ctx.sys_root, "class", "drm", card)
        total = read_int(os.path.join(base, "lmem_total_bytes"), problems)
        if total is not None:
            avail = read_int(os.path.join(base, "lmem_avail_bytes"), problems)
            return total, None if avail is None else max(total - avail, 0)
    return None, None


def _xe_vram(gpu: PciGpu, problems: list[Problem]) -> int | None:
    """xe on some kernels: ``tile<N>/physical_vram_size_bytes`` per tile (includes reserved)."""
    if gpu.driver != "xe":
        return None
    sizes = [
        read_int(os.path.join(gpu.path, f"tile{n}", "physical_vram_size_bytes"), problems)
        for n in range(count_tiles(gpu) or 0)
    ]
    return sum(s for s in sizes if s is not None) if any(s is not None for s in sizes) else None


def _lacking(card: Observation) -> bool:
    memory_lacking = card.memory_total_bytes is None or card.memory_used_bytes is None
    return card.tiles is None or (not card.integrated and memory_lacking)


def _xpu_smi(
    ctx: ProbeContext, cards: list[Observation]
) -> tuple[list[Observation] | None, list[Problem], list[Problem]]:
    by_bus = {c.pci_bus_id: c for c in cards}

    def needs_detail(obs: Observation) -> bool:
        card = by_bus.get(obs.pci_bus_id)
        return card is None or card.memory_total_bytes is None or card.tiles is None

    return probe_xpu_smi(ctx, needs_detail)


def _pyzes(ctx: ProbeContext) -> tuple[list[Observation] | None, list[Problem], list[Problem]]:
    zes, missing = (ctx.pyzes_module, None) if ctx.pyzes_module is not None else import_pyzes()
    if zes is None:
        return None, [], [missing or Problem("pyzes", "not importable")]
    found, problems = probe_pyzes(zes)
    return found, problems, []


def _absorb(
    ctx: ProbeContext,
    cards: list[Observation],
    found: list[Observation],
    result: VendorResult,
    tried: list[Problem],
    *,
    sysfs_ok: bool,
) -> list[Observation]:
    """Merge a tool's cards in, after dropping readings an unprivileged caller cannot trust."""
    trusted = []
    known = {c.pci_bus_id for c in cards}
    for obs in found:
        if obs.pci_bus_id is None and obs.uuid is None:
            continue  # nothing to join on: never guess by index, each tool numbers its own way
        source = "/".join(obs.sources)
        if sysfs_ok and obs.pci_bus_id not in known:
            # sysfs is the authority on which cards exist and are usable (skipped ones said why)
            why = "reports a card that sysfs does not list as usable; ignored"
            result.notes.append(Problem(source, why, obs.key))
        elif obs.memory_used_bytes == 0 and not ctx.perfmon:
            why = (
                "reads 0 bytes used, but i915/xe report usage only to CAP_PERFMON/root "
                "callers, so it is unknown"
            )
            tried.append(Problem(source, why, obs.key))
            trusted.append(replace(obs, memory_used_bytes=None))
        else:
            trusted.append(obs)
    merged, conflicts = merge(cards, trusted)
    result.problems += conflicts
    return merged


def _torch(
    ctx: ProbeContext, cards: list[Observation], result: VendorResult, tried: list[Problem]
) -> list[Observation]:
    devices, problem = probe_torch_xpu(ctx)
    if problem is not None:
        result.problems.append(problem)
        return cards
    ordered = sorted(cards, key=lambda c: (bool(c.integrated), c.pci_bus_id or "~"))
    pairs, problem = match_torch(ordered, devices or [])
    if problem is not None:
        result.problems.append(problem)
    found = [torch_observation(c, d) for c, d in pairs]
    return _absorb(ctx, cards, found, result, tried, sysfs_ok=True)


def _unknown_memory(cards: list[Observation], tried: list[Problem]) -> list[Problem]:
    """One problem per discrete card whose memory is still unknown, saying what was tried."""
    problems = []
    for card in cards:
        if card.integrated:
            continue
        sizes = {"total": card.memory_total_bytes, "used": card.memory_used_bytes}
        missing = [what for what, value in sizes.items() if value is None]
        if missing:
            relevant = [str(p) for p in tried if p.device in (None, card.key)]
            why = "; ".join(["no i915-backport lmem files", *relevant])
            problems.append(
                Problem("intel", f"memory {' and '.join(missing)} unknown ({why})", card.key)
            )
    return problems
