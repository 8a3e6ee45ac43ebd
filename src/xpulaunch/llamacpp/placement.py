"""Where llama replicas go: one isolated worker per replica from the shared planner and, for
``--gpus auto`` with an estimate of the model's need, the fewest free devices per replica that
hold it (:mod:`.fit` says why). Pure.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace

from xpulaunch.core.plan import LaunchRequest, make_plan
from xpulaunch.core.selection import GpuMode, parse_gpus
from xpulaunch.core.units import format_bytes
from xpulaunch.errors import SelectionError
from xpulaunch.llamacpp.fit import Estimate, holds
from xpulaunch.model import Inventory, Plan, Unit


@dataclass(frozen=True, slots=True)
class Placed:
    plan: Plan
    fits: bool | None
    notes: tuple[str, ...]


def plan_replicas(
    launch: LaunchRequest,
    replicas: int,
    inventory: Inventory,
    parent_env: Mapping[str, str],
    *,
    unavailable: Mapping[str, str] | None,
    estimate: Estimate | None,
    margin_bytes: int,
) -> Placed:
    """Select once, check there is a device per replica, then place one worker each; for
    ``auto`` with an estimate, on the fewest free devices per replica that hold it."""
    selected = make_plan(launch, inventory, parent_env, unavailable=unavailable).devices
    if selected and len(selected) < replicas:
        raise SelectionError(
            f"each replica needs its own device, and gpus {launch.gpus} selected "
            f"{len(selected)} ({', '.join(u.label() for u in selected)}); select {replicas} "
            "devices or more, use fewer replicas, or none for the CPU",
            option="replicas",
            value=replicas,
        )

    def place(gpus: str) -> Plan:
        each = replace(launch, gpus=gpus, nproc_per_node=replicas)
        return make_plan(each, inventory, parent_env, unavailable=unavailable)

    if not selected or estimate is None:
        return Placed(place(launch.gpus), None, ())
    if parse_gpus(launch.gpus).mode is GpuMode.AUTO:
        for per_replica in range(1, len(selected) // replicas + 1):
            plan = place(str(per_replica * replicas))
            if _fits(plan, estimate, margin_bytes) is True:
                note = _fewest_note(per_replica, replicas, margin_bytes)
                return Placed(plan, True, (note,))
    plan = place(launch.gpus)
    fits = _fits(plan, estimate, margin_bytes)
    return Placed(plan, fits, _misfit_notes(fits, launch.gpus))


def _fits(plan: Plan, estimate: Estimate, margin_bytes: int) -> bool | None:
    """Whether every replica's devices hold the estimate; unknown free memory counts as the
    device's total (the most it could have free), and None when that is unknown too."""
    verdicts = [
        holds([_room(plan.devices[i]) for i in worker.units], estimate, margin_bytes)
        for worker in plan.workers
    ]
    if any(v is False for v in verdicts):
        return False
    return None if any(v is None for v in verdicts) else True


def _room(unit: Unit) -> int | None:
    free = unit.memory_free_bytes
    return free if free is not None else unit.memory_total_bytes


def _fewest_note(per_replica: int, replicas: int, margin_bytes: int) -> str:
    each = " per replica" if replicas > 1 else ""
    return (
        f"gpus auto: the fewest free devices that hold the model: {per_replica}{each} "
        f"(keeping {format_bytes(margin_bytes)} free on each)"
    )


def _misfit_notes(fits: bool | None, gpus: str) -> tuple[str, ...]:
    if fits is None:
        return (f"gpus {gpus}: free memory unknown, so whether the model fits is not known",)
    if fits:
        return ()
    return (
        f"warning: gpus {gpus}: the model does not fit in the free memory of the chosen "
        "devices; a build with --fit keeps the rest on the CPU, one without may fail "
        "to load (out of memory)",
    )


def sizing_notes(
    estimate: Estimate | None, fit: bool | None, fit_mib: int | None, on_devices: bool
) -> list[str]:
    """The estimate, and how the replicas are sized (llama.cpp's fit, or every layer)."""
    notes = [estimate.describe()] if estimate else []
    if not on_devices:
        return notes
    if fit_mib is not None:
        notes.append(
            "llama-server has --fit: llama.cpp sets the layers it offloads and their split "
            f"itself when it starts, keeping {fit_mib} MiB free on each device (--fit-target)"
        )
    elif fit is None:
        notes.append("could not ask llama-server whether it has --fit: -ngl 999 as before")
    else:
        notes.append("llama-server without --fit (or --fit off): every layer on the GPUs")
    return notes
