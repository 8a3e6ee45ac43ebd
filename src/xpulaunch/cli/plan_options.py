"""The options shared by ``run`` and ``llama``: which devices, for which vendor, and whether to
plan only."""

from __future__ import annotations

import click

from xpulaunch.cli.params import Percent, Size


def plan_parameters() -> list[click.Parameter]:
    """A fresh list of the shared planning options (click parameters are not shared between
    commands)."""
    return [
        click.Option(
            ["--gpus"], default="auto", show_default=True, metavar="SPEC",
            help="auto | all | N | device=ID[,ID...] | 0,2 | none. Ids are physical indices, "
            "UUIDs, PCI addresses, CARD.TILE for one Intel tile, MIG-UUID, or vendor:ID "
            "(nvidia:0) on hosts with several vendors.",
        ),
        click.Option(
            ["--backend"], envvar="XPULAUNCH_BACKEND", default="auto", show_default=True,
            metavar="auto|cuda|xpu|rocm|cpu", show_envvar=True, help="Vendor stack to use.",
        ),
        click.Option(["--dry-run"], is_flag=True, help="Print the plan; start nothing."),
        click.Option(["--json", "as_json"], is_flag=True, help="With --dry-run: the plan as JSON."),
        click.Option(
            ["--inventory"], envvar="XPULAUNCH_INVENTORY", metavar="FILE", show_envvar=True,
            help="Use this inventory document instead of probing this host.",
        ),
        click.Option(
            ["--min-free-memory"], type=Size(), metavar="SIZE",
            help="Only devices with at least this much free memory (e.g. 8GiB).",
        ),
        click.Option(
            ["--max-utilization"], type=Percent(), metavar="PERCENT",
            help="Only devices at most this busy.",
        ),
    ]  # fmt: skip
