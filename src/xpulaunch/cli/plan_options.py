"""Options shared by ``run`` and ``llama`` (contract section 1), and their conversion."""

from __future__ import annotations

import click

from xpulaunch.cli.options import option_group
from xpulaunch.core.units import parse_size
from xpulaunch.errors import UsageError

plan_options = option_group(
    click.option(
        "--gpus",
        default="auto",
        show_default=True,
        metavar="SPEC",
        help="auto | all | N | device=ID[,ID...] | 0,2 | none. Ids are physical indices, "
        "UUIDs or PCI addresses (CARD.TILE for one Intel tile).",
    ),
    click.option(
        "--backend",
        envvar="XPULAUNCH_BACKEND",
        default="auto",
        show_default=True,
        metavar="auto|cuda|xpu|rocm|cpu",
        help="Vendor stack to use [env: XPULAUNCH_BACKEND].",
    ),
    click.option("--dry-run", is_flag=True, help="Print the plan instead of starting anything."),
    click.option("--json", "as_json", is_flag=True, help="With --dry-run: the plan as JSON."),
    click.option(
        "--inventory",
        envvar="XPULAUNCH_INVENTORY",
        metavar="FILE",
        help="Use this inventory document instead of probing [env: XPULAUNCH_INVENTORY].",
    ),
    click.option(
        "--min-free-memory",
        metavar="SIZE",
        help="Only devices with at least this much free memory (e.g. 8GiB).",
    ),
    click.option(
        "--max-utilization",
        type=float,
        metavar="PERCENT",
        help="Only devices at most this busy.",
    ),
)


def size_option(value: str | None, option: str) -> int | None:
    return None if value is None else parse_size(value, option=option)


def percent_option(value: float | None, option: str) -> float | None:
    if value is not None and not 0 <= value <= 100:
        raise UsageError(f"{option} {value:g}: must be a percentage from 0 to 100")
    return value
