"""``xpulaunch devices``: probe and list accelerators, or show an inventory document.

Plain aligned text, no table library; the probe is imported only when the host is probed.
"""

from __future__ import annotations

import json
import os
from typing import TYPE_CHECKING

import click

from xpulaunch.cli.commands import CONTEXT_SETTINGS
from xpulaunch.cli.terminal import aligned, terminal_safe

if TYPE_CHECKING:
    from collections.abc import Sequence

    from xpulaunch.model import Device, Inventory, Problem

_GIB = 1024**3
_FOOTER_PROBLEMS = 5
_FOOTER_WIDTH = 160
TORCH_NOTHING = "no Intel GPU here, and torch.xpu is asked only about Intel GPUs"


@click.command(context_settings=CONTEXT_SETTINGS)
@click.option("--json", "as_json", is_flag=True, help="Print the inventory document (JSON).")
@click.option(
    "--inventory",
    "inventory_file",
    type=click.Path(dir_okay=False),
    envvar="XPULAUNCH_INVENTORY",
    show_envvar=True,
    help="Show this inventory document instead of probing the host.",
)
@click.option(
    "--debug",
    is_flag=True,
    help="Show every problem in full, tools that are not installed, and each value's source.",
)
@click.option(
    "--torch",
    "use_torch",
    is_flag=True,
    help="Also ask torch.xpu, in a throw-away subprocess (slow: it imports torch).",
)
@click.option(
    "--processes",
    "show_processes",
    is_flag=True,
    help="Also list, per device, the processes using it (NVML on NVIDIA, DRM fdinfo on "
    "Intel and AMD; other users' processes need root) and whether a lease covers each.",
)
@click.option(
    "--topology",
    "show_topology",
    is_flag=True,
    help="Also print how the devices are linked, as nvidia-smi topo -m does, for every vendor "
    "(NV#, XGMI, XL#, PIX, PXB, PHB, NODE, SYS) with each device's CPU and NUMA affinity; "
    "with --json, the document's 'topology' key.",
)
def devices(
    *,
    as_json: bool,
    inventory_file: str | None,
    debug: bool,
    use_torch: bool,
    show_processes: bool,
    show_topology: bool,
) -> None:
    """Probe and list accelerators (index, name, PCI address, memory, utilisation, tiles)."""
    if inventory_file is not None:
        from xpulaunch.api import load_inventory

        inventory = load_inventory(inventory_file)
        if use_torch:
            click.echo(f"xpulaunch: note: --torch ignored: showing {inventory_file}", err=True)
    else:
        from xpulaunch.probing.nvml_start import start_nvml

        start_nvml(os.environ)  # NVML starts while the probe and the document are imported
        from xpulaunch.probing.host import probe_from_env

        inventory = probe_from_env(os.environ, use_torch=use_torch, report_missing=debug)
        if use_torch and _torch_not_asked(inventory):
            click.echo(f"xpulaunch: note: --torch: {TORCH_NOTHING}", err=True)
    if show_processes:
        from xpulaunch.cli.device_processes import with_processes

        inventory = with_processes(inventory, probed=inventory_file is None)
    if as_json:
        from xpulaunch.core.inventory import to_dict

        doc = to_dict(inventory)
        if show_topology:
            from xpulaunch.core.topology import host_node, matrix_dict

            doc["topology"] = matrix_dict(inventory.devices, only_node=host_node(inventory))
        click.echo(json.dumps(doc, indent=2))
        return
    if inventory_file is not None:
        click.echo(f"inventory: {inventory_file} (not probed)")
    click.echo(terminal_safe(render_table(inventory, debug=debug)))
    if show_processes:
        from xpulaunch.cli.device_processes import render_processes

        click.echo(terminal_safe(render_processes(inventory)))
    if show_topology:
        click.echo(terminal_safe(render_topology(inventory)))


def render_topology(inventory: Inventory) -> str:
    """The link matrix of every device, its legend, and what the document leaves unknown."""
    from xpulaunch.core.topology import LEGEND, has_topology, host_node, matrix

    if not inventory.devices:
        return "\ntopology: no accelerators"
    table = matrix(inventory.devices, only_node=host_node(inventory))
    lines = ["", "topology:", *(line.rstrip() for line in aligned(table))]
    lines += ["", f"legend: {LEGEND}"]
    unknown = [d.label() for d in inventory.devices if not has_topology(d)]
    if unknown:
        lines.append(
            f"not known for {', '.join(unknown)}: no links, PCI path or NUMA node recorded"
        )
    return "\n".join(lines)


def _torch_not_asked(inventory: Inventory) -> bool:
    """torch.xpu only fills in Intel cards (probing/intel.py): on a host with none it is not
    asked (unless the PCI bus could not be read: then it answers, with a problem)."""
    asked = any(p.source == "torch.xpu" for p in inventory.problems)
    return not asked and not any(d.vendor == "intel" for d in inventory.devices)


def render_table(inventory: Inventory, *, debug: bool = False) -> str:
    """The device table plus a footer of problems. Unknown values print as ``?`` or ``-``."""
    lines = []
    if inventory.devices:
        header = ("IDX", "VENDOR", "NAME", "PCI", "MEMORY USED / TOTAL", "UTIL", "TILES")
        # Every vendor numbers its GPUs from 0: on a mixed host the id names the vendor too.
        qualify = len({d.vendor for d in inventory.devices}) > 1
        table = aligned([header, *(_row(d, qualify=qualify) for d in inventory.devices)])
        lines.append(table[0].rstrip())
        # A MIG instance's row: its UUID (to give --gpus) under IDX to PCI, its memory in the
        # MEMORY column; the UUID is wider than most names, so it is not a cell of the table.
        memory_at = table[0].index(header[4])
        for device, line in zip(inventory.devices, table[1:], strict=True):
            lines.append(line.rstrip())
            for mig in device.mig_devices:
                memory = _memory(mig.memory_used_bytes, mig.memory_total_bytes)
                lines.append(f"{'  ' + mig.uuid:<{memory_at - 2}}  {memory}")
    else:
        lines.append("No accelerators found.")
    from xpulaunch.core.known_issues import issues_of

    warnings = [w for d in inventory.devices for w in issues_of(d)]
    lines += ["", "warnings:", *(f"  - {w}" for w in warnings)] if warnings else []
    if debug:
        lines += _source_lines(inventory.devices)
    lines += _problem_lines(inventory.problems, debug=debug)
    return "\n".join(lines)


def _row(d: Device, *, qualify: bool) -> tuple[str, str, str, str, str, str, str]:
    name = d.name or _fallback_name(d)
    if d.integrated:
        name += " (integrated)"
    util = "-" if d.utilization_percent is None else f"{d.utilization_percent:.0f}%"
    ident = f"{d.vendor.value}:{d.index}" if qualify else str(d.index)
    return (
        ident,
        d.vendor.value,
        name,
        d.pci_bus_id or "-",
        _memory(d.memory_used_bytes, d.memory_total_bytes),
        util,
        str(d.tiles),
    )


def _fallback_name(d: Device) -> str:
    pci_id = d.extra.get("pci_device_id")
    return f"{d.vendor.value} GPU [{pci_id}]" if isinstance(pci_id, str) else "-"


def _memory(used: int | None, total: int | None) -> str:
    if used is None and total is None:
        return "-"
    used_text = "?" if used is None else f"{used / _GIB:.1f}"
    total_text = "?" if total is None else f"{total / _GIB:.1f}"
    return f"{used_text} / {total_text} GiB"


def _source_lines(devices: Sequence[Device]) -> list[str]:
    lines = []
    for d in devices:
        sources = d.extra.get("sources")
        details = [f"{k}={v}" for k, v in d.extra.items() if k != "sources"]
        if isinstance(sources, list):
            details.insert(0, "from " + ", ".join(str(s) for s in sources))
        if details:  # an inventory file records none: no line of its own, empty
            lines.append(f"  {d.label()}: " + "; ".join(details))
    return ["", "sources:", *lines] if lines else []


def _problem_lines(problems: Sequence[Problem], *, debug: bool) -> list[str]:
    if not problems:
        return []
    count = len(problems)
    lines = ["", f"{count} problem{'s' if count != 1 else ''}:"]
    shown = problems if debug else problems[:_FOOTER_PROBLEMS]
    for problem in shown:
        text = str(problem)
        if not debug and len(text) > _FOOTER_WIDTH:
            text = text[: _FOOTER_WIDTH - 3] + "..."
        lines.append(f"  - {text}")
    if not debug:
        more = count - len(shown)
        tail = f"and {more} more; " if more else ""
        lines.append(f"  ({tail}'xpulaunch devices --debug' shows every problem in full)")
    return lines
