"""AMD: ``ROCR_VISIBLE_DEVICES``, then ``HIP_VISIBLE_DEVICES`` on what ROCr left (ROCm's "GPU
isolation techniques").

Pure, following ROCr ``amd_filter_device.cpp`` and ROCclr ``rocdevice.cpp``. A value that
would crash the runtime, or that PyTorch refuses, raises :class:`MaskError` with one line
naming the variable, the value and what would be valid.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

from xpulaunch.core.masks import C_SPACE, HIP_VAR, ROCR_VAR, split_list
from xpulaunch.errors import MaskError
from xpulaunch.model import Device

if TYPE_CHECKING:
    from collections.abc import Iterable, Sequence

__all__ = [
    "HIP_VAR",
    "ROCR_VAR",
    "AmdVisible",
    "amd_visible",
    "format_rocr_visible_devices",
    "parse_hip_visible_devices",
    "parse_rocr_visible_devices",
]


@dataclass(frozen=True, slots=True)
class AmdVisible:
    """What a HIP process sees, in HIP order, with notes."""

    devices: tuple[Device, ...]
    notes: tuple[str, ...] = ()


def parse_rocr_visible_devices(value: str | None, devices: Sequence[Device]) -> tuple[Device, ...]:
    """Read ``ROCR_VISIBLE_DEVICES`` as ROCr does; the result is in list order."""
    return _rocr(value, devices, [])


def parse_hip_visible_devices(
    value: str | None,
    after_rocr: Sequence[Device],
    *,
    rocr_value: str | None = None,
    name: str = HIP_VAR,
) -> tuple[Device, ...]:
    """Read ``HIP_VISIBLE_DEVICES`` (indices relative to ``after_rocr``) as HIP does.

    ``name`` is the variable HIP took the value from (``CUDA_VISIBLE_DEVICES`` when
    HIP_VISIBLE_DEVICES is unset or empty). Pass ``rocr_value`` when ROCR_VISIBLE_DEVICES
    is set: PyTorch refuses a HIP_VISIBLE_DEVICES with more entries than it.
    """
    return _hip(value, after_rocr, rocr_value, name, [])


def amd_visible(
    rocr_value: str | None,
    hip_value: str | None,
    devices: Sequence[Device],
    *,
    hip_name: str = HIP_VAR,
) -> AmdVisible:
    """ROCR first, then HIP on what ROCR left (the two parsers above, with their notes)."""
    notes: list[str] = []
    after_rocr = _rocr(rocr_value, devices, notes)
    return AmdVisible(_hip(hip_value, after_rocr, rocr_value, hip_name, notes), tuple(notes))


_STRTOL_FULL = re.compile(r"[+-]?(?:0[xX][0-9a-fA-F]+|0[0-7]*|[1-9][0-9]*)")
_ROCR_UUID = re.compile(r"GPU-[0-9A-F]{16}")


def _rocr(value: str | None, devices: Sequence[Device], notes: list[str]) -> tuple[Device, ...]:
    """ROCr ``RvdFilter`` (src/core/runtime/amd_filter_device.cpp)."""
    ordered = sorted(devices, key=lambda d: d.index)
    if value is None:
        return tuple(ordered)
    if value == "":  # RvdFilter::SelectZeroDevices: set but empty surfaces zero devices
        notes.append(f"{ROCR_VAR} is set but empty: ROCm sees no GPU")
        return ()
    tokens = split_list(value)
    chosen: list[Device] = []
    # BuildUsrDeviceList reads at most one token per GPU; later tokens are never looked at.
    # The surviving devices are ranked in list order (usrDeviceList_[index] = rank).
    for token in (t.strip(C_SPACE).upper() for t in tokens[: len(ordered)]):
        device = _rocr_token(value, token, ordered)
        if device is None or device.key in {d.key for d in chosen}:  # the list ends here
            notes.append(f"{ROCR_VAR}={value!r}: ROCr stops at {token!r}; later entries ignored")
            return tuple(chosen)
        chosen.append(device)
    if len(tokens) > len(ordered):
        notes.append(f"{ROCR_VAR}: ROCr reads only the first {len(ordered)} entries")
    return tuple(chosen)


def _rocr_token(value: str, token: str, devices: Sequence[Device]) -> Device | None:
    if token == "":  # token.at(0) on an empty token throws inside ROCr init
        raise MaskError(
            f"{ROCR_VAR}={value!r} has an empty entry, which ROCm cannot parse; "
            "use indices or GPU- UUIDs separated by single commas"
        )
    if token.startswith("G"):  # ProcessUuidToken: a unique prefix of "GPU-<16 hex digits>"
        if not 5 <= len(token) <= 20:
            return None
        hits = [d for d in devices if d.uuid and d.uuid.upper().startswith(token)]
        return hits[0] if len(hits) == 1 else None
    if _STRTOL_FULL.fullmatch(token) is None:  # strtol(token, &end, 0) must use every char
        return None
    number = int(token, 0) if not re.fullmatch(r"[+-]?0[0-7]+", token) else int(token, 8)
    number = max(min(number, 2**63 - 1), -(2**63))  # strtol saturates at LONG_MIN/MAX
    index = (number + 2**31) % 2**32 - 2**31  # ...then it is stored in an int32_t
    return next((d for d in devices if d.index == index), None)


def _hip(
    value: str | None,
    after_rocr: Sequence[Device],
    rocr_value: str | None,
    name: str,
    notes: list[str],
) -> tuple[Device, ...]:
    """ROCclr ``roc::Device::init`` (rocdevice.cpp): HIP's own device list."""
    if value is None or value == "":  # HIP_VISIBLE_DEVICES[0] == '\0': no HIP filtering
        return tuple(after_rocr)
    if name == HIP_VAR and rocr_value is not None:
        hip_count, rocr_count = len(value.split(",")), len(rocr_value.split(","))
        if hip_count > rocr_count:
            raise MaskError(
                f"{HIP_VAR}={value!r} lists {hip_count} devices but {ROCR_VAR}={rocr_value!r} "
                f"only {rocr_count} (PyTorch raises RuntimeError); list at most {rocr_count} "
                f"indices relative to {ROCR_VAR}"
            )
    chosen: list[Device] = []
    for text in split_list(value):
        device = _hip_entry(text, after_rocr)
        if device is None:  # "anything to the right of invalid deviceId has to be discarded"
            notes.append(f"{name}={value!r}: HIP stops at {text!r}; later entries ignored")
            break
        if device not in chosen:  # a repeated index is skipped, not an error
            chosen.append(device)
    return tuple(chosen)


def _hip_entry(text: str, after_rocr: Sequence[Device]) -> Device | None:
    # A substring of an agent UUID; case compared loosely (not verified on hardware).
    if "GPU-" in text:
        return next((d for d in after_rocr if d.uuid and text.upper() in d.uuid.upper()), None)
    # atoi() plus "str_id == std::to_string(index)": plain decimal, nothing else.
    if re.fullmatch(r"0|[1-9][0-9]*", text) is None or int(text) >= len(after_rocr):
        return None
    return after_rocr[int(text)]


def format_rocr_visible_devices(devices: Iterable[Device]) -> str:
    """ROCr UUIDs (``GPU-`` + 16 hex digits) when every device has one, else indices."""
    items = list(devices)
    if len({d.key for d in items}) != len(items):
        raise MaskError(f"{ROCR_VAR}: refusing to write a repeated device")
    if all(d.uuid and _ROCR_UUID.fullmatch(d.uuid.upper()) for d in items):
        return ",".join(d.uuid or "" for d in items)
    return ",".join(str(d.index) for d in items)
