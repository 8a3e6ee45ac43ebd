"""Each worker's devices: which of the selected units it sees, and, for a single process
spanning several devices, the device map and memory budgets.

Which units: job-wide visibility (default) or ``--isolate``. Job-wide is the collective-safe
default: oneCCL needs every device of a communicator visible in each rank, and per-rank masks
break NCCL/oneCCL setups (oneCCL #217, torch-ccl #71, nccl-tests #300). ``--isolate`` is for
independent workers (sweeps, servers): each sees only its share, renumbered from 0.

Device maps: the names are accelerate's (``sequential``, ``balanced``, ``balanced_low_0``).
Budgets follow accelerate's own default of keeping ~10% headroom on each GPU
(``get_balanced_memory`` caps at 90%), computed here from the probe instead of from a CUDA
context on every device.
"""

from __future__ import annotations

import itertools
import json
from typing import TYPE_CHECKING

from xpulaunch.core.units import format_bytes
from xpulaunch.errors import SelectionError, UsageError
from xpulaunch.model import DeviceMap, DeviceShare, Unit

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

HEADROOM_FRACTION = 0.10


def choose_device_map(units: int, requested: DeviceMap | None) -> DeviceMap | None:
    """``sequential`` for one device, ``balanced`` for several, the request when given."""
    if units == 0:
        return None
    if requested is not None:
        return requested
    return DeviceMap.SEQUENTIAL if units == 1 else DeviceMap.BALANCED


def worker_memory(
    units: Sequence[Unit],
    requested: DeviceMap | None,
    *,
    local_rank: int,
    workers: int,
    isolate: bool,
    share: DeviceShare | None = None,
) -> tuple[DeviceMap | None, str | None]:
    """One worker's ``XPULAUNCH_DEVICE_MAP`` and ``XPULAUNCH_MAX_MEMORY`` (None, None on the
    CPU). ``units``: the devices it sees. A lone worker, or an isolated one, spans them all.
    Several workers that each see every device (DDP) each work on the one their LOCAL_RANK
    picks (modulo the device count): a ``sequential`` map on that device alone, its budget
    split among the workers that pick it. Giving each rank the whole job's map would load one
    copy of the model per rank spread over every device, promising each budget once per rank.
    """
    if not units:
        return None, None
    if isolate or workers < 2:
        return choose_device_map(len(units), requested), max_memory_json(units, share)
    ordinal = local_rank % len(units)
    sharers = len(range(ordinal, workers, len(units)))
    budget = _budgets(units, share)
    mine = {key: value // sharers for key, value in budget.items() if key == str(ordinal)}
    return choose_device_map(1, requested), json.dumps(mine, separators=(",", ":"))


def job_device_map(
    units: int, requested: DeviceMap | None, *, workers: int, isolate: bool
) -> DeviceMap | None:
    """The map the plan header names: the one every worker gets (:func:`worker_memory`); None
    when there are no devices, or isolated workers of uneven shares get different maps."""
    if units == 0:
        return None
    if not isolate:
        return choose_device_map(units if workers < 2 else 1, requested)
    shares = {len(share) for share in place(units, workers, isolate=True)}
    maps = {choose_device_map(count, requested) for count in shares}
    return maps.pop() if len(maps) == 1 else None


def max_memory(units: Sequence[Unit]) -> dict[str, int]:
    """accelerate ``max_memory`` keyed by the child's ordinals: ``{"0": bytes, ...}``.

    Uses known free memory, else the total; a device with neither is left out (accelerate then
    measures it itself).
    """
    budget: dict[str, int] = {}
    for ordinal, unit in enumerate(units):
        base = unit.memory_total_bytes if unit.memory_free_bytes is None else unit.memory_free_bytes
        if base is not None:
            budget[str(ordinal)] = int(base * (1 - HEADROOM_FRACTION))
    return budget


def max_memory_json(units: Sequence[Unit], share: DeviceShare | None = None) -> str:
    """``XPULAUNCH_MAX_MEMORY``: :func:`max_memory`, or for a job sharing its devices its
    share of each, the whole budget (other jobs' use of the device is already counted by the
    share itself); a device whose share is unknown (K slots of a device of unknown memory) is
    left out."""
    return json.dumps(_budgets(units, share), separators=(",", ":"))


def _budgets(units: Sequence[Unit], share: DeviceShare | None) -> dict[str, int]:
    if share is None:
        return max_memory(units)
    claims = {str(i): share.claim_bytes(u.memory_total_bytes) for i, u in enumerate(units)}
    return {ordinal: claim for ordinal, claim in claims.items() if claim is not None}


def format_share(claim_bytes: int | None) -> str:
    return "unknown" if claim_bytes is None else format_bytes(claim_bytes)


def parse_max_memory(text: str) -> dict[int, int]:
    """``XPULAUNCH_MAX_MEMORY`` (``{"0": bytes, ...}``) -> ``{0: bytes, ...}``, the int
    device keys accelerate's ``max_memory`` takes."""
    try:
        raw = json.loads(text)
        return {int(key): int(value) for key, value in raw.items()}
    except (ValueError, TypeError, AttributeError) as exc:
        raise UsageError(
            "expected a JSON object of device ordinal to bytes, as xpulaunch writes it",
            option="XPULAUNCH_MAX_MEMORY",
            value=text,
        ) from exc


def fitted_budgets(
    probed: Mapping[int, int], override: Mapping[int | str, int] | None, device_count: int
) -> dict[int | str, int]:
    """The budgets to pass on: ``override`` where given, each checked against what the probe
    saw free on that device (``probed`` holds the budgets with headroom already taken off; a
    device the probe had no figure for is not checked); keys that are not devices (``"cpu"``,
    ``"disk"``) pass through for offloading."""
    budgets: dict[int | str, int] = {key: value for key, value in probed.items()}
    for key, value in (override or {}).items():
        if isinstance(key, int) and not 0 <= key < device_count:
            known = ", ".join(str(k) for k in range(device_count)) or "none"
            raise UsageError(
                f"device {key} is not one of this process's devices ({known})",
                option="max_memory",
                value=dict(override or {}),
            )
        if isinstance(key, int) and key in probed and value > probed[key] / (1 - HEADROOM_FRACTION):
            seen = int(probed[key] / (1 - HEADROOM_FRACTION))
            raise UsageError(
                f"device {key}: {value} bytes is more than the {seen} bytes the probe saw "
                "free on it",
                option="max_memory",
                value=dict(override or {}),
            )
        budgets[key] = value
    return budgets


# A bound far above any node (8 GPUs x tiles x a few workers each), far below what makes
# planning itself run out of memory (a plan of 10**8 workers).
MAX_WORKERS = 4096


def worker_count(nproc_per_node: int | None, units: int) -> int:
    """``None`` means ``auto``: one worker per unit (one on the CPU)."""
    if nproc_per_node is None:
        return max(units, 1)
    if not 1 <= nproc_per_node <= MAX_WORKERS:
        raise UsageError(
            f"must be from 1 to {MAX_WORKERS}, or auto",
            option="nproc_per_node",
            value=nproc_per_node,
        )
    return nproc_per_node


def place(units: int, workers: int, *, isolate: bool) -> tuple[tuple[int, ...], ...]:
    """Positions of the selected units each worker sees.

    >>> place(4, 2, isolate=True)
    ((0, 1), (2, 3))
    >>> place(2, 2, isolate=False)
    ((0, 1), (0, 1))
    """
    everything = tuple(range(units))
    if not isolate or units == 0:
        return tuple(everything for _ in range(workers))
    if workers > units:
        raise SelectionError(
            f"{workers} isolated workers need at least {workers} devices; {units} selected "
            f"(select {workers} devices or use fewer workers)",
            option="isolate",
            value=True,
        )
    return split_evenly(everything, workers)


def split_evenly(items: Sequence[int], parts: int) -> tuple[tuple[int, ...], ...]:
    """Consecutive shares; the first ``len % parts`` shares get one more."""
    size, extra = divmod(len(items), parts)
    bounds = [i * size + min(i, extra) for i in range(parts + 1)]
    return tuple(tuple(items[start:end]) for start, end in itertools.pairwise(bounds))
