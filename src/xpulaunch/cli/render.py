"""Plans as ``--dry-run`` prints them: readable text, or the plan document (``--json``)."""

from __future__ import annotations

import json
import shlex

import click

from xpulaunch.cli.terminal import terminal_safe
from xpulaunch.core.units import format_bytes
from xpulaunch.model import HEARTBEAT_FILE_VAR, SET_AT_START, Plan, Unit


def print_plan(
    plan: Plan, as_json: bool, *, servers: bool = False, heartbeat: bool = False
) -> None:
    """``servers``: the plan's workers are llama-server replicas, and are called so.
    ``heartbeat``: the run has ``--heartbeat`` (its workers get ``XPULAUNCH_HEARTBEAT_FILE``)."""
    if as_json:
        from xpulaunch.core.plan import to_dict

        click.echo(json.dumps(to_dict(plan), indent=2))
    else:
        click.echo(terminal_safe(plan_text(plan, servers=servers, heartbeat=heartbeat)))


def plan_text(plan: Plan, *, servers: bool = False, heartbeat: bool = False) -> str:
    """A readable plan: devices and memory, why, and each worker's (or server's) environment."""
    lines = [f"backend: {plan.backend.value}"]
    if plan.hierarchy is not None:
        lines.append(f"level zero hierarchy: {plan.hierarchy.value}")
    lines.append("devices:" if plan.devices else "devices: none (CPU)")
    lines += [f"  {_unit_line(u)}" for u in plan.devices]
    if plan.device_map is not None:
        lines.append(f"device map: {plan.device_map.value}{_map_scope(plan)}")
    if servers:
        lines.append("servers:")
    else:
        lines.append("workers:" + ("  (--isolate)" if plan.isolate else ""))
    for worker in plan.workers:
        role = f"replica {worker.rank}" if servers else f"rank {worker.rank}"
        lines.append(f"  [{worker.name}] {role}: {shlex.join(worker.argv)}")
        for name, value in worker.env.items():
            shown = "(removed)" if value is None else _quote(value)
            lines.append(f"      {name}={shown}")
    started = [n for n in SET_AT_START if heartbeat or n != HEARTBEAT_FILE_VAR]
    lines.append(f"  set at start: {', '.join(started)}")
    lines.append("why:")
    lines += [f"  - {note}" for note in plan.notes]
    return "\n".join(lines)


def _map_scope(plan: Plan) -> str:
    """Whose map it is: with several workers, each has its own (XPULAUNCH_MAX_MEMORY names
    only its devices)."""
    if len(plan.workers) < 2:
        return ""
    if plan.isolate:
        return " (each worker over its own devices)"
    return " (each worker on the device its LOCAL_RANK picks)"


def _unit_line(unit: Unit) -> str:
    device = unit.device
    memory = (
        f"{format_bytes(unit.memory_free_bytes)} free of {format_bytes(unit.memory_total_bytes)}"
    )
    where = device.pci_bus_id or device.uuid or "-"
    tile = f" tile {unit.tile}" if unit.tile is not None else ""
    tile += f" {unit.mig.uuid}" if unit.mig is not None else ""
    name = device.name or "unknown"
    return f"{device.vendor.value} {device.index}{tile}  {name}  {where}  {memory}"


def _quote(value: str) -> str:
    return json.dumps(value) if (not value or any(c.isspace() for c in value)) else value
