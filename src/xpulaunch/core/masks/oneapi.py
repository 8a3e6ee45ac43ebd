"""``ONEAPI_DEVICE_SELECTOR``: which Level Zero GPUs a SYCL process keeps (intel/llvm's
``device_filter.cpp``).

Pure, following intel/llvm ``sycl/source/detail/device_filter.cpp`` (the grammar) and
``platform_impl.cpp`` (the two steps: root devices are filtered first, the sub-device part
ignored; then ``amendDeviceAndSubDevices`` replaces a root named by a sub-device term with
its sub-devices, or drops it when it cannot be partitioned). A selector that SYCL refuses
raises :class:`MaskError` with one line naming the value and what would be valid.
"""

from __future__ import annotations

import itertools
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from xpulaunch.core.masks import C_SPACE, ODS_VAR, ZE_MASK_VAR
from xpulaunch.errors import MaskError

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

__all__ = ["ODS_VAR", "OneApiFilter", "RootPick", "parse_oneapi_device_selector"]


@dataclass(frozen=True, slots=True)
class RootPick:
    """What the selector keeps of one Level Zero root device that passed its filter."""

    whole: bool = True  # a term names the root itself (N, *, gpu)
    subs: tuple[int, ...] = ()  # sub-devices named by N.M
    all_subs: bool = False  # N.*, *.*

    def sub_devices(self, count: int) -> tuple[int, ...]:
        """Indices kept of a root with ``count`` sub-devices. DPC++ partitions a root only
        when it supports partitioning by affinity domain, which unified-runtime's Level Zero
        adapter reports for two or more sub-devices (``UR_DEVICE_INFO_SUPPORTED_PARTITIONS``);
        otherwise a sub-device term keeps nothing of it ("device is not partitionable")."""
        if count < 2:
            return ()
        if self.all_subs:
            return tuple(range(count))
        return tuple(m for m in self.subs if m < count)


@dataclass(frozen=True, slots=True)
class OneApiFilter:
    """Which Level Zero GPU positions (after the ZE mask, from 0) pass the selector's root
    filter, and what is kept of each (``picks``; the root itself unless a pick says not)."""

    positions: tuple[int, ...]
    notes: tuple[str, ...] = ()
    picks: Mapping[int, RootPick] = field(default_factory=dict)

    def pick(self, position: int) -> RootPick:
        return self.picks.get(position, RootPick())


@dataclass(frozen=True, slots=True)
class _OdsTerm:
    backend: str
    device: str  # "*", a device type, or a number
    sub_device: bool  # N.M, N.*, *.* ...
    sub_index: int | None = None  # M of N.M


_ODS_BACKENDS = frozenset({"*", "level_zero", "opencl", "cuda", "hip", "native_cpu"})
_ODS_TYPES = frozenset({"*", "gpu", "cpu", "fpga", "acc"})


def parse_oneapi_device_selector(value: str | None, visible_count: int) -> OneApiFilter:
    """Positions ``0..visible_count-1`` of the Level Zero GPUs that survive the selector."""
    everything = tuple(range(visible_count))
    if value is None:
        return OneApiFilter(everything)
    if value.strip(C_SPACE) == "":  # DPC++ Parse_ONEAPI_DEVICE_SELECTOR: "" accepts anything
        return OneApiFilter(everything, (f"{ODS_VAR} is empty: SYCL accepts every device",))
    notes: list[str] = []
    accepts: list[_OdsTerm] = []
    discards: list[_OdsTerm] = []
    for text in (t for t in value.split(";") if t.strip(C_SPACE)):
        discard = text.strip(C_SPACE).startswith("!")
        terms = _ods_terms(value, text.strip(C_SPACE).lstrip("!"))
        (discards if discard else accepts).extend(terms)
    _ods_notes(value, accepts, discards, visible_count, notes)
    # Only discard terms: an implicit "accept every root device" comes first (intel/llvm's selector
    # documentation).
    accepted = [p for p in everything if not accepts or any(_ods_match(t, p) for t in accepts)]
    kept = tuple(p for p in accepted if not any(_ods_match(t, p) for t in discards))
    if visible_count and not kept:
        notes.append(f"{ODS_VAR}={value!r} keeps no Level Zero GPU: SYCL sees no Intel GPU")
    return OneApiFilter(kept, tuple(notes), _picks(accepts, kept))


def _picks(accepts: Sequence[_OdsTerm], kept: Sequence[int]) -> dict[int, RootPick]:
    """What the accept terms keep of each root that passed (amendDeviceAndSubDevices); only
    roots that some sub-device term names are listed."""
    picks: dict[int, RootPick] = {}
    for position in kept:
        terms = [t for t in accepts if _ods_match(t, position)]
        if not any(t.sub_device for t in terms):
            continue
        picks[position] = RootPick(
            whole=any(not t.sub_device for t in terms),
            subs=tuple(sorted({t.sub_index for t in terms if t.sub_index is not None})),
            all_subs=any(t.sub_device and t.sub_index is None for t in terms),
        )
    return picks


def _ods_terms(value: str, text: str) -> list[_OdsTerm]:
    pair = [p for p in text.split(":") if p]
    backend = pair[0].strip(C_SPACE).lower().removeprefix("ext_oneapi_") if pair else ""
    problem = None
    if backend not in _ODS_BACKENDS:
        problem = f"{text!r} needs a backend (*, level_zero, opencl, cuda, hip, native_cpu)"
    elif len(pair) != 2:
        problem = f"{text!r} must be backend:devices, e.g. 'level_zero:gpu' or 'level_zero:0,1'"
    if problem is not None:
        raise MaskError(f"{ODS_VAR}={value!r}: {problem}")
    devices = [d.strip(C_SPACE).lower() for d in pair[1].split(",") if d.strip(C_SPACE)]
    if not devices:
        raise MaskError(f"{ODS_VAR}={value!r}: {text!r} lists no device; try '{backend}:*'")
    return [_ods_term(value, backend, d) for d in devices]


_ODS_DEVICE = re.compile(r"(?P<top>\*|[a-z]+|[0-9]+)(?P<subs>(?:\.(?:\*|[0-9]+)){0,2})")


def _ods_term(value: str, backend: str, device: str) -> _OdsTerm:
    match = _ODS_DEVICE.fullmatch(device)
    top = match["top"] if match else ""
    subs = match["subs"].split(".")[1:] if match else []
    # Grammar rules of device_filter.cpp::Parse_ODS_Device: a type takes no sub-device, a
    # wildcard parent takes only wildcard children.
    valid = match is not None and (top in _ODS_TYPES or top.isdigit())
    valid = valid and not (subs and top.isalpha())
    chain = [top, *subs]
    valid = valid and all(b == "*" for a, b in itertools.pairwise(chain) if a == "*")
    if not valid:
        raise MaskError(
            f"{ODS_VAR}={value!r}: device {device!r} is not *, gpu, cpu, fpga, N, N.M, N.* or *.*"
        )
    if len(subs) == 2:
        # Sub-sub-devices are compute slices (CCS): unified-runtime makes them only on some
        # parts and driver settings (ZEX_NUMBER_OF_CCS, UR_L0_EXPOSE_CSLICE_IN_AFFINITY_
        # PARTITIONING), so what such a term keeps cannot be told from here.
        raise MaskError(
            f"{ODS_VAR}={value!r}: {device!r} names sub-sub-devices (compute slices), which "
            "xpulaunch cannot hand out; name root devices (N, *) or tiles (N.M, N.*)"
        )
    sub_index = int(subs[0]) if subs and subs[0].isdigit() else None
    return _OdsTerm(backend, top, bool(subs), sub_index)


def _ods_match(term: _OdsTerm, position: int) -> bool:
    """Does ``term`` select the Level Zero GPU at ``position``?"""
    if term.backend not in ("*", "level_zero"):
        return False
    return term.device in ("*", "gpu") or term.device == str(position)


def _opencl_gpus(term: _OdsTerm) -> bool:
    return term.backend in ("*", "opencl") and term.device in ("*", "gpu")


def _ods_notes(
    value: str,
    accepts: Sequence[_OdsTerm],
    discards: Sequence[_OdsTerm],
    visible_count: int,
    notes: list[str],
) -> None:
    for term in (*accepts, *discards):
        if term.device.isdigit() and int(term.device) >= visible_count:
            notes.append(
                f"{ODS_VAR}: {term.backend}:{term.device} matches nothing "
                f"({visible_count} Level Zero device(s) after {ZE_MASK_VAR})"
            )
    if any(t.sub_device for t in discards):
        # filterDeviceFilter matches a discard term on backend, type and number only.
        notes.append(f"{ODS_VAR}={value!r}: a discard term drops its whole root device")
    if any(t.sub_device for t in accepts):
        notes.append(
            f"{ODS_VAR}={value!r} names sub-devices: SYCL sees the tiles of each named root "
            "that has two or more, and nothing of a root that has none"
        )
    if any(_opencl_gpus(t) for t in accepts) and not any(_opencl_gpus(t) for t in discards):
        notes.append(
            f"{ODS_VAR}={value!r} also accepts OpenCL GPUs: SYCL lists each Intel GPU twice"
        )
