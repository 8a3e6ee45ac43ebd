"""Which build a llama-server binary is, from its ``--list-devices`` output. Pure.

llama.cpp prints (common/arg.cpp ``common_print_available_devices``)::

    Available devices:
      CUDA0: NVIDIA H200 (143156 MiB, 142000 MiB free)

or ``  (none)`` when the build has no device but the CPU. Device names are the ggml backend
name plus an ordinal: ``CUDA``, ``ROCm`` (the CUDA backend built for HIP), ``SYCL`` and
``Vulkan`` (ggml-cuda.h ``GGML_CUDA_NAME``, ggml-sycl.h, ggml-vulkan.h).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum

from xpulaunch.errors import ProbeError, UsageError
from xpulaunch.model import Backend

MIB = 1024 * 1024
HEADER = "Available devices:"
_LINE = re.compile(
    r"^\s+(?P<name>\S+): (?P<description>.*) \((?P<total>\d+) MiB, (?P<free>\d+) MiB free\)\s*$"
)
_NAME = re.compile(r"^(?P<prefix>[A-Za-z]+)(?P<ordinal>\d+)$")


class LlamaBackend(str, Enum):
    """The GPU backend a llama-server binary was built with (``--llama-backend``)."""

    CUDA = "cuda"
    SYCL = "sycl"
    VULKAN = "vulkan"
    ROCM = "rocm"
    CPU = "cpu"

    @property
    def device_prefix(self) -> str | None:
        """The ggml device name without its ordinal (``CUDA`` of ``CUDA0``)."""
        return _PREFIX.get(self)

    @property
    def plan_backend(self) -> Backend | None:
        """The xpulaunch backend whose masks pin this build; None: Vulkan runs on any vendor
        and is pinned with ``--device`` instead of a mask."""
        return _PLAN_BACKEND.get(self)


_PREFIX = {
    LlamaBackend.CUDA: "CUDA",
    LlamaBackend.SYCL: "SYCL",
    LlamaBackend.VULKAN: "Vulkan",
    LlamaBackend.ROCM: "ROCm",
}
_BY_PREFIX = {prefix: backend for backend, prefix in _PREFIX.items()}
_PLAN_BACKEND = {
    LlamaBackend.CUDA: Backend.CUDA,
    LlamaBackend.SYCL: Backend.XPU,
    LlamaBackend.ROCM: Backend.ROCM,
    LlamaBackend.CPU: Backend.CPU,
}
# A multi-backend build lists e.g. CUDA0 and Vulkan0 side by side. With
# --backend auto the native stack wins, in the contract's vendor order (NVIDIA, AMD, Intel).
_NATIVE_ORDER = (LlamaBackend.CUDA, LlamaBackend.ROCM, LlamaBackend.SYCL, LlamaBackend.VULKAN)
_FOR_PLAN_BACKEND = {
    Backend.CUDA: (LlamaBackend.CUDA, LlamaBackend.VULKAN),
    Backend.XPU: (LlamaBackend.SYCL, LlamaBackend.VULKAN),
    Backend.ROCM: (LlamaBackend.ROCM, LlamaBackend.VULKAN),
}


def parse_llama_backend(text: str | None) -> LlamaBackend | None:
    """``--llama-backend``: ``auto`` (or nothing) -> None, else the build (a
    :class:`LlamaBackend` is its own text)."""
    value = (text or "auto").strip().lower()
    if value == "auto":
        return None
    try:
        return LlamaBackend(value)
    except ValueError:
        valid = ", ".join(["auto", *(b.value for b in LlamaBackend)])
        raise UsageError(
            f"expected one of {valid}", option="llama_backend", value=text, malformed=True
        ) from None


@dataclass(frozen=True, slots=True)
class LlamaDevice:
    """One line of ``--list-devices``; memory as the build reported it."""

    name: str
    description: str
    memory_total_bytes: int | None = None
    memory_free_bytes: int | None = None

    @property
    def backend(self) -> LlamaBackend | None:
        """The build this device belongs to; None for kinds we do not pin (RPC, BLAS ...)."""
        match = _NAME.match(self.name)
        return None if match is None else _BY_PREFIX.get(match["prefix"])

    def __str__(self) -> str:
        return f"{self.name}: {self.description}"


@dataclass(frozen=True, slots=True)
class DeviceList:
    """Parsed ``--list-devices``; ``ignored`` holds lines that were not a device."""

    devices: tuple[LlamaDevice, ...]
    ignored: tuple[str, ...] = ()

    def of(self, backend: LlamaBackend) -> tuple[LlamaDevice, ...]:
        return tuple(d for d in self.devices if d.backend is backend)

    @property
    def builds(self) -> tuple[LlamaBackend, ...]:
        """The GPU backends present, in listing order."""
        found = [d.backend for d in self.devices if d.backend is not None]
        return tuple(dict.fromkeys(found))


def parse_list_devices(text: str, *, source: str = "llama-server --list-devices") -> DeviceList:
    """Parse the listing; raises :class:`ProbeError` when there is no ``Available devices:``."""
    lines = text.splitlines()
    try:
        start = next(i for i, line in enumerate(lines) if line.strip() == HEADER)
    except StopIteration:
        raise ProbeError(
            f"{source}: no {HEADER!r} line in its output; is this llama.cpp's llama-server?"
        ) from None
    devices: list[LlamaDevice] = []
    ignored: list[str] = []
    for line in lines[start + 1 :]:
        match = _LINE.match(line)
        if match is not None:
            total, free = int(match["total"]) * MIB, int(match["free"]) * MIB
            devices.append(LlamaDevice(match["name"], match["description"].strip(), total, free))
        elif line.strip() and line.strip() != "(none)":
            ignored.append(line.strip())
    return DeviceList(tuple(devices), tuple(ignored))


def detect_build(
    listing: DeviceList, wanted: Backend | None
) -> tuple[LlamaBackend, tuple[str, ...]]:
    """The build to pin for, and why. ``wanted`` is the user's ``--backend`` (None: auto)."""
    builds = listing.builds
    if not builds:
        kinds = ", ".join(d.name for d in listing.devices)
        extra = f" (ignored: {kinds})" if kinds else ""
        return LlamaBackend.CPU, (f"llama-server lists no GPU device: a CPU build{extra}",)
    if len(builds) == 1:
        return builds[0], (f"llama-server is a {_PREFIX[builds[0]]} build (--list-devices)",)
    listed = ", ".join(_PREFIX[b] for b in builds)
    if wanted is not None and wanted is not Backend.CPU:
        for build in _FOR_PLAN_BACKEND[wanted]:
            if build in builds:
                return build, (
                    f"llama-server has {listed} devices; --backend {wanted.value} uses "
                    f"{_PREFIX[build]} (pin another with --llama-backend)",
                )
        raise UsageError(
            f"llama-server has only {listed} devices; "
            "use a build for that backend or another backend",
            option="backend",
            value=wanted.value,
        )
    build = next(b for b in _NATIVE_ORDER if b in builds)
    return build, (
        f"llama-server has {listed} devices: using {_PREFIX[build]} "
        "(choose with --llama-backend or --backend)",
    )


def device_names(build: LlamaBackend, count: int) -> tuple[str, ...]:
    """Names of a masked child's devices: the mask renumbers them from 0 (CUDA, SYCL, ROCm)."""
    prefix = build.device_prefix
    if prefix is None or build is LlamaBackend.VULKAN:
        raise ValueError(f"{build.value} devices are not named by position")
    return tuple(f"{prefix}{i}" for i in range(count))


def describe(devices: Sequence[LlamaDevice]) -> str:
    return "; ".join(str(d) for d in devices) or "none"
