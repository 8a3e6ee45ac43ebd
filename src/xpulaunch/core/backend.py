"""Which vendor stack a job uses (docs/CONTRACT.md, section 2: hybrid hosts)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from xpulaunch.core.device_ids import normalize_bus_id
from xpulaunch.core.selection import GpuMode, GpuRequest, split_vendor, uuid_prefix_names
from xpulaunch.errors import SelectionError, UsageError
from xpulaunch.model import Backend, Device, Unit, Vendor

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

# With --backend auto and several vendors visible: NVIDIA first (docs/CONTRACT.md, section 2), then
# AMD, then Intel. Users of the other stacks say so with --backend / XPULAUNCH_BACKEND.
PREFERENCE = (Vendor.NVIDIA, Vendor.AMD, Vendor.INTEL)
_BACKEND_OF = {Vendor.NVIDIA: Backend.CUDA, Vendor.INTEL: Backend.XPU, Vendor.AMD: Backend.ROCM}
_NAMES = {Vendor.NVIDIA: "NVIDIA", Vendor.INTEL: "Intel", Vendor.AMD: "AMD"}


def parse_backend(text: str | None) -> Backend | None:
    """``auto`` (or nothing) -> None; otherwise a Backend."""
    value = (text or "auto").strip().lower()
    if value == "auto":
        return None
    try:
        return Backend(value)
    except ValueError:
        raise UsageError(
            "expected auto, cuda, xpu, rocm or cpu", option="backend", value=text, malformed=True
        ) from None


def choose_backend(
    requested: Backend | None,
    gpus: GpuRequest,
    devices: Sequence[Device],
    visible: Mapping[Vendor, Sequence[Unit]],
) -> tuple[Backend, tuple[str, ...]]:
    """Pick the backend; every decision comes with a note.

    ``visible`` holds, per vendor present on the host, the units the parent lets us hand out.
    """
    if gpus.mode is GpuMode.NONE or requested is Backend.CPU:
        return Backend.CPU, (
            "backend cpu: " + ("--gpus none" if requested is None else "--backend cpu"),
        )
    if requested is not None:
        return _explicit(requested, devices, visible)
    named = _vendor_named_by_ids(gpus, devices, visible)
    if named is not None and not visible.get(named):
        where = (
            "hidden by the parent's visibility variables"
            if any(d.vendor is named for d in devices)
            else f"not on this host (present: {_present(devices)})"
        )
        raise SelectionError(f"{_NAMES[named]} GPUs are {where}", option="gpus", value=gpus.text)
    if named is not None:
        return _BACKEND_OF[named], (
            f"backend {_BACKEND_OF[named].value}: the devices named in "
            f"--gpus are {_NAMES[named]} GPUs",
        )
    return _automatic(gpus, devices, visible)


def _explicit(
    requested: Backend, devices: Sequence[Device], visible: Mapping[Vendor, Sequence[Unit]]
) -> tuple[Backend, tuple[str, ...]]:
    vendor = requested.vendor
    assert vendor is not None  # CPU handled by the caller
    if not any(d.vendor is vendor for d in devices):
        raise SelectionError(
            f"no {_NAMES[vendor]} GPU on this host; present: {_present(devices)}",
            option="backend",
            value=requested.value,
        )
    if not visible.get(vendor):
        raise SelectionError(
            f"every {_NAMES[vendor]} GPU is hidden by the parent's visibility variables",
            option="backend",
            value=requested.value,
        )
    return requested, (f"backend {requested.value}: requested",)


def _automatic(
    gpus: GpuRequest, devices: Sequence[Device], visible: Mapping[Vendor, Sequence[Unit]]
) -> tuple[Backend, tuple[str, ...]]:
    notes: list[str] = []
    usable = []
    for vendor in PREFERENCE:
        if not any(d.vendor is vendor for d in devices):
            continue
        units = visible.get(vendor, ())
        if not units:
            notes.append(
                f"{_NAMES[vendor]} GPUs are hidden by the parent's visibility "
                "variables: not considered"
            )
        elif all(u.device.integrated for u in units) and gpus.mode is not GpuMode.EXPLICIT:
            notes.append(
                f"{_NAMES[vendor]}: only integrated GPUs, which are used only when named explicitly"
            )
        else:
            usable.append(vendor)
    if not usable:
        if gpus.mode is GpuMode.AUTO:
            return Backend.CPU, (*notes, "no usable accelerator is visible: running on the CPU")
        raise SelectionError(
            "no usable accelerator is visible"
            + (f" ({'; '.join(notes)})" if notes else f"; present: {_present(devices)}"),
            option="gpus",
            value=gpus.text,
        )
    chosen, name = usable[0], _NAMES[usable[0]]
    why = f"the visible accelerators are {name} GPUs"
    if len(usable) > 1:
        others = " and ".join(_NAMES[v] for v in usable[1:])
        alt = ", ".join(f"--backend {_BACKEND_OF[v].value}" for v in usable[1:])
        why = (
            f"{name} and {others} GPUs are visible; {name} is preferred (use {alt} for the others)"
        )
    notes.append(f"backend {_BACKEND_OF[chosen].value}: {why}")
    return _BACKEND_OF[chosen], tuple(notes)


def _vendor_named_by_ids(
    gpus: GpuRequest, devices: Sequence[Device], visible: Mapping[Vendor, Sequence[Unit]]
) -> Vendor | None:
    """The one vendor the ids name: by a ``vendor:`` prefix, a UUID or PCI address, or a bare
    index that only one visible vendor has. A bare index several vendors have is refused."""
    if gpus.mode is not GpuMode.EXPLICIT:
        return None
    vendors = set()
    for ident in gpus.ids:
        qualifier, bare = split_vendor(ident)
        vendors |= {qualifier} if qualifier else _vendors_of(bare, devices, visible, ident)
    if len(vendors) > 1:
        raise SelectionError(
            "these ids name GPUs of "
            + " and ".join(_NAMES[v] for v in sorted(vendors, key=PREFERENCE.index))
            + "; a job runs on one vendor's GPUs",
            option="gpus",
            value=gpus.text,
        )
    return vendors.pop() if vendors else None


def _vendors_of(
    bare: str, devices: Sequence[Device], visible: Mapping[Vendor, Sequence[Unit]], ident: str
) -> set[Vendor]:
    bus = normalize_bus_id(bare)
    lowered = bare.lower()
    found = set()
    for d in devices:
        uuids = {(d.uuid or "").lower(), *(m.uuid.lower() for m in d.mig_devices)} - {""}
        if (
            (bus is not None and bus == d.pci_bus_id)
            or lowered in uuids
            or uuid_prefix_names(bare, d)
        ):
            found.add(d.vendor)
    if found:
        return found
    card = bare.split(".", maxsplit=1)[0]
    if not (card.isascii() and card.isdigit()):
        return set()
    having = [d for d in devices if d.index == int(card) and visible.get(d.vendor)]
    if len({d.vendor for d in having}) > 1:
        options = ", ".join(f"{d.vendor.value}:{bare} ({d.name or d.pci_bus_id})" for d in having)
        raise SelectionError(
            f"ambiguous on this host, where every vendor numbers its GPUs from 0: write "
            f"{options}, or choose the vendor with --backend",
            option="gpus",
            value=ident,
        )
    return {d.vendor for d in having}


def elsewhere_hint(chosen: Vendor, visible: Mapping[Vendor, Sequence[Unit]]) -> str:
    """What other vendors' visible GPUs there are, for an error about too few ``chosen``."""
    others = [
        f"{len(units)} {_NAMES[v]} unit(s) are visible too (--backend {_BACKEND_OF[v].value})"
        for v, units in visible.items()
        if v is not chosen and units
    ]
    if not others:
        return ""
    return "; ".join(others) + ", but one job runs on one vendor's GPUs"


def _present(devices: Sequence[Device]) -> str:
    return ", ".join(sorted({_NAMES[d.vendor] for d in devices})) or "no accelerators"
