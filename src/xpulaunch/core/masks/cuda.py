"""``CUDA_VISIBLE_DEVICES``, read and written the way the CUDA driver does (CUDA Programming Guide,
"CUDA_VISIBLE_DEVICES").

Pure: the parser takes the variable's value (``None`` = unset) and the NVIDIA devices of the
inventory, and returns what CUDA would expose, in CUDA's order, with notes on anything
surprising. A value that CUDA refuses raises :class:`MaskError` with one line naming the
variable, the value and what would be valid.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

from xpulaunch.core.masks import C_SPACE, CUDA_VAR
from xpulaunch.errors import MaskError
from xpulaunch.model import Device, MigDevice

if TYPE_CHECKING:
    from collections.abc import Iterable, Sequence

__all__ = [
    "CUDA_VAR",
    "CudaEntry",
    "CudaVisible",
    "format_cuda_visible_devices",
    "parse_cuda_visible_devices",
]


@dataclass(frozen=True, slots=True)
class CudaEntry:
    """One device CUDA enumerates: a whole GPU, or one MIG instance of it."""

    device: Device
    mig: MigDevice | None = None

    @property
    def ident(self) -> str:
        """What makes two entries the same device for CUDA (MIG UUID, else the GPU's key)."""
        return self.mig.uuid if self.mig is not None else self.device.key


@dataclass(frozen=True, slots=True)
class CudaVisible:
    """What a CUDA process sees, in CUDA enumeration order (``cuda:0`` first)."""

    entries: tuple[CudaEntry, ...]
    notes: tuple[str, ...] = ()


def parse_cuda_visible_devices(value: str | None, devices: Sequence[Device]) -> CudaVisible:
    """Read ``CUDA_VISIBLE_DEVICES`` as the CUDA driver does (the 17-row H200 table).

    ``devices`` are the NVIDIA devices; a number names the device with that NVML index.
    """
    ordered = sorted(devices, key=lambda d: d.index)
    if value is None:
        return CudaVisible(tuple(CudaEntry(d) for d in ordered))
    if value == "":
        return CudaVisible((), (f"{CUDA_VAR} is set but empty: CUDA sees no GPU",))
    notes: list[str] = []
    entries: list[CudaEntry] = []
    raw_entries = value.split(",")
    seen_tokens: set[str] = set()
    for position, raw in enumerate(raw_entries):
        entry = _cuda_entry(raw.strip(C_SPACE), ordered, notes)
        if entry is None:
            later = ", and CUDA ignores every entry after it" if raw_entries[position + 1 :] else ""
            notes.append(
                f"{CUDA_VAR}={value!r}: entry {raw.strip()!r} names no GPU of this host "
                f"(not an index, a unique GPU-/MIG- UUID prefix){later}"
            )
            break
        token = raw.strip(C_SPACE).lower()
        if any(e.ident == entry.ident for e in entries):
            if token in seen_tokens:
                raise MaskError(
                    f"{CUDA_VAR}={value!r} lists {entry.device.label()} twice, and CUDA fails "
                    "to initialise when a device repeats; list each GPU once"
                )
            # The same GPU by index and by UUID: the driver accepted `1,GPU-<uuid of 1>` and
            # showed the GPU once (run on 2x H200, 2026-11-22, docs/hardware/); `0,0` fails.
            notes.append(
                f"{CUDA_VAR}: {raw.strip()!r} names {entry.device.label()} again; "
                "CUDA shows it once"
            )
            continue
        seen_tokens.add(token)
        if entry.mig is not None and any(e.mig is not None for e in entries):
            # A CUDA process enumerates a single MIG instance (MIG user guide, quoted in
            # pytorch #130181; not verified on MIG hardware here): the later ones are not usable.
            notes.append(f"{CUDA_VAR}: {raw.strip()!r} ignored, CUDA uses one MIG instance")
            continue
        entries.append(entry)
    entries = _one_mig_alone(entries, notes)
    if not entries:
        notes.append(f"{CUDA_VAR}={value!r} hides every NVIDIA GPU")
    return CudaVisible(tuple(entries), tuple(notes))


def _one_mig_alone(entries: list[CudaEntry], notes: list[str]) -> list[CudaEntry]:
    """With a MIG instance in the list, CUDA enumerates that one instance and no whole GPU
    ("Only single MIG instance enumeration is supported", CUDA Programming Guide 5.2.1.1;
    nvitop's parse_cuda_visible_devices keeps the first MIG device alone the same way)."""
    migs = [e for e in entries if e.mig is not None]
    whole = [e for e in entries if e.mig is None]
    if not migs or not whole:
        return entries
    names = ", ".join(e.device.label() for e in whole)
    notes.append(
        f"{CUDA_VAR}: {names} ignored: with a MIG instance in the list CUDA enumerates "
        "that instance alone"
    )
    return migs[:1]


def _cuda_entry(text: str, devices: Sequence[Device], notes: list[str]) -> CudaEntry | None:
    """One entry -> the device it names, or None when CUDA takes it as invalid."""
    if text.startswith("GPU-"):  # full UUID or a unique prefix of one
        gpus = [d for d in devices if d.uuid is not None and d.uuid.startswith(text)]
        return CudaEntry(gpus[0]) if len(gpus) == 1 else None
    if text.startswith("MIG-"):
        migs = [(d, m) for d in devices for m in d.mig_devices if m.uuid.startswith(text)]
        return CudaEntry(*migs[0]) if len(migs) == 1 else None
    # Integers are read like strtoul (torch/cuda/__init__.py::_parse_visible_devices mirrors
    # the driver: "1gpu2" reads as 1); a negative number is invalid.
    match = re.match(r"[+-]?[0-9]+", text)
    if match is None or int(match[0]) < 0:
        return None
    index = int(match[0])
    if match.end() != len(text):
        notes.append(f"{CUDA_VAR}: {text!r} is read as {index} (trailing text ignored)")
    return next((CudaEntry(d) for d in devices if d.index == index), None)


def format_cuda_visible_devices(entries: Iterable[CudaEntry]) -> str:
    """UUIDs when every GPU has one (immune to CUDA_DEVICE_ORDER), else NVML indices.

    MIG instances are always written by their MIG UUID. No entries -> ``""`` (hide all).
    """
    items = list(entries)
    idents = [e.ident for e in items]
    if len(set(idents)) != len(idents):
        raise MaskError(f"{CUDA_VAR}: refusing to write a repeated device ({', '.join(idents)})")
    by_uuid = all(e.device.uuid for e in items if e.mig is None)
    return ",".join(_cuda_name(e, by_uuid=by_uuid) for e in items)


def _cuda_name(entry: CudaEntry, *, by_uuid: bool) -> str:
    if entry.mig is not None:
        return entry.mig.uuid
    return entry.device.uuid or "" if by_uuid else str(entry.device.index)
