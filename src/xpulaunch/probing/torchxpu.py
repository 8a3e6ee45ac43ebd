"""Opt-in ``torch.xpu`` probe (``devices --torch``), always in a throw-away subprocess.

Any ``torch.xpu`` call initialises Level Zero/SYCL, a process that has initialised a GPU
runtime cannot fork a child that uses it, and older ``device_count()`` caches its first answer
for the life of the process (a Level Zero context is never released), so the launcher never does it
itself. The helper runs under COMPOSITE hierarchy with no mask, so each torch device is one card, in
Level Zero order (discrete before integrated, then PCI address) - our Intel order.
"""

from __future__ import annotations

from collections.abc import Sequence

from xpulaunch.model import Problem, Vendor
from xpulaunch.probing.context import ProbeContext, parsed_run
from xpulaunch.probing.observe import Observation
from xpulaunch.probing.parsers.intel import TorchXpu, parse_torch_xpu_json
from xpulaunch.probing.xpusmi import SELECTION_VARS

# The helper prints exactly one JSON line; everything it cannot learn is reported in it.
HELPER = r"""
import json
from uuid import UUID
def main():
    try:
        import torch
    except ImportError as exc:
        return {"error": "torch is not importable: %s" % exc}
    xpu = getattr(torch, "xpu", None)
    if xpu is None or not xpu.is_available():
        return {"error": "torch %s has no usable XPU" % torch.__version__}
    devices = []
    for i in range(xpu.device_count()):
        p = xpu.get_device_properties(i)
        uuid = getattr(p, "uuid", None)
        if uuid is not None and not isinstance(uuid, str):
            try:
                uuid = str(UUID(bytes=bytes(uuid)))
            except (TypeError, ValueError):
                uuid = str(uuid)
        d = {"index": i, "name": p.name, "total_memory": p.total_memory, "uuid": uuid,
             "is_integrated": getattr(p, "is_integrated_gpu", None)}
        try:
            d["free_memory"] = xpu.mem_get_info(i)[0]
        except (RuntimeError, AttributeError) as exc:
            d["free_error"] = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        devices.append(d)
    return {"devices": devices}
print(json.dumps(main()))
"""
HELPER_ENV = {"ZE_FLAT_DEVICE_HIERARCHY": "COMPOSITE", "ONEAPI_DEVICE_SELECTOR": "level_zero:gpu"}


def probe_torch_xpu(ctx: ProbeContext) -> tuple[list[TorchXpu] | None, Problem | None]:
    found = parsed_run(
        ctx,
        [ctx.torch_python, "-c", HELPER],
        parse_torch_xpu_json,
        "torch.xpu",
        drop_env=SELECTION_VARS,
        set_env=HELPER_ENV,
        timeout_s=ctx.torch_timeout_s,
    )
    if found is None:
        return None, Problem("torch.xpu", f"{ctx.torch_python} not found")
    if isinstance(found, Problem):
        return None, found
    return found, None


def match_torch(
    cards: Sequence[Observation], devices: Sequence[TorchXpu]
) -> tuple[list[tuple[Observation, TorchXpu]], Problem | None]:
    """Pair torch devices with cards: by UUID, else by position (all cards or discrete only).

    Newer torch lists only discrete GPUs when there are any [src c10/xpu]; older lists all.
    """
    by_uuid = {c.uuid: c for c in cards if c.uuid}
    if devices and all(d.uuid in by_uuid for d in devices):
        return [(by_uuid[d.uuid or ""], d) for d in devices], None
    discrete = [c for c in cards if not c.integrated]
    for candidates in (list(cards), discrete):
        if len(candidates) == len(devices):
            return list(zip(candidates, devices, strict=True)), None
    why = f"{len(devices)} torch.xpu device(s) cannot be matched to {len(cards)} Intel card(s)"
    return [], Problem("torch.xpu", f"{why} by UUID or position; ignored")


def torch_observation(card: Observation, dev: TorchXpu) -> Observation:
    """What torch adds to a card, keyed by the card's PCI address (torch has none)."""
    used = None
    if dev.total_memory_bytes is not None and dev.free_memory_bytes is not None:
        used = max(dev.total_memory_bytes - dev.free_memory_bytes, 0)
    return Observation(
        vendor=Vendor.INTEL,
        sources=("torch.xpu",),
        pci_bus_id=card.pci_bus_id,
        uuid=card.uuid,
        name=dev.name,
        integrated=dev.integrated,
        memory_total_bytes=dev.total_memory_bytes,
        memory_used_bytes=used,
    )
