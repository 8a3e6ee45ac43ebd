"""What one source saw of one device, and how several sources' views become one Device.

Each source (sysfs, NVML, nvidia-smi, xpu-smi, ...) yields :class:`Observation`\\ s in which every
field may be ``None`` (not seen). Observations are joined on PCI address, else UUID - never on
an index, because every layer numbers devices differently (rocm-smi's ``cardN`` is not DRM's,
the NVML index is not the CUDA index unless ``CUDA_DEVICE_ORDER=PCI_BUS_ID``).
The first source to report a field wins; later sources only fill gaps, and a disagreement about
identity is recorded as a problem.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from xpulaunch.model import Device, MigDevice, Problem, Vendor

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping, Sequence

_FILLABLE = (
    "pci_bus_id",
    "uuid",
    "index",
    "name",
    "integrated",
    "tiles",
    "memory_total_bytes",
    "memory_used_bytes",
    "utilization_percent",
    "mig_devices",
)


@dataclass(frozen=True, slots=True)
class Observation:
    vendor: Vendor
    sources: tuple[str, ...]
    pci_bus_id: str | None = None
    uuid: str | None = None
    index: int | None = None  # the vendor's own index, where the source has one (NVML)
    name: str | None = None
    integrated: bool | None = None
    tiles: int | None = None
    memory_total_bytes: int | None = None
    memory_used_bytes: int | None = None
    utilization_percent: float | None = None
    mig_devices: tuple[MigDevice, ...] | None = None
    extra: Mapping[str, object] = field(default_factory=dict)

    @property
    def key(self) -> str:
        return self.pci_bus_id or self.uuid or f"{self.vendor.value}:{self.index}"


def merge(
    base: Sequence[Observation], more: Iterable[Observation]
) -> tuple[list[Observation], list[Problem]]:
    """Join ``more`` into ``base`` by PCI address, else UUID; unmatched ones are appended."""
    merged = list(base)
    problems: list[Problem] = []
    for obs in more:
        at = _find(merged, obs)
        if at is None:
            merged.append(obs)
            continue
        problems.extend(_conflicts(merged[at], obs))
        merged[at] = fill(merged[at], obs)
    return merged, problems


def fill(first: Observation, then: Observation) -> Observation:
    """``first`` with its unknown fields taken from ``then``."""
    changes: dict[str, object] = {
        name: getattr(then, name)
        for name in _FILLABLE
        if getattr(first, name) is None and getattr(then, name) is not None
    }
    sources = first.sources + tuple(s for s in then.sources if s not in first.sources)
    extra = {**then.extra, **first.extra}
    return replace(first, sources=sources, extra=extra, **changes)  # type: ignore[arg-type]


def _find(merged: Sequence[Observation], obs: Observation) -> int | None:
    for i, seen in enumerate(merged):
        if obs.pci_bus_id is not None and seen.pci_bus_id == obs.pci_bus_id:
            return i
    for i, seen in enumerate(merged):
        if obs.uuid is not None and seen.uuid == obs.uuid:
            return i
    return None


def _conflicts(seen: Observation, obs: Observation) -> list[Problem]:
    problems = []
    for name in ("pci_bus_id", "uuid"):
        old, new = getattr(seen, name), getattr(obs, name)
        if old is not None and new is not None and old != new:
            why = f"reports {name} {new!r} where {'/'.join(seen.sources)} reported {old!r}"
            problems.append(Problem("/".join(obs.sources), f"{why}; kept {old!r}", seen.key))
    return problems


def to_devices(observations: Sequence[Observation], order: str) -> list[Device]:
    """Number one vendor's devices and build the final :class:`Device` values.

    ``order`` is the contract's physical index (section 2): ``"vendor"`` keeps the index the
    source reported (NVML) when every device has a distinct one, else PCI order; ``"discrete"``
    puts discrete cards before integrated ones, then PCI order (Intel); ``"pci"`` is PCI order.
    """
    indices = [o.index for o in observations]
    if order == "vendor" and None not in indices and len(set(indices)) == len(indices):
        ranked = sorted(observations, key=lambda o: o.index or 0)
        numbers = [o.index or 0 for o in ranked]
    else:
        discrete_first = order == "discrete"
        ranked = sorted(
            observations,
            key=lambda o: (
                discrete_first and bool(o.integrated),
                o.pci_bus_id or "~",
                o.uuid or "",
            ),
        )
        numbers = list(range(len(ranked)))
    return [_device(o, n) for o, n in zip(ranked, numbers, strict=True)]


def _device(obs: Observation, index: int) -> Device:
    return Device(
        vendor=obs.vendor,
        index=index,
        name=obs.name,
        pci_bus_id=obs.pci_bus_id,
        uuid=obs.uuid,
        integrated=bool(obs.integrated),
        tiles=obs.tiles or 1,
        memory_total_bytes=obs.memory_total_bytes,
        memory_used_bytes=obs.memory_used_bytes,
        utilization_percent=obs.utilization_percent,
        mig_devices=obs.mig_devices or (),
        extra={**obs.extra, "sources": list(obs.sources)},
    )
