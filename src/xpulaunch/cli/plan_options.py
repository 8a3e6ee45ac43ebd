"""Options shared by ``run`` and ``llama`` (contract section 1), and their conversion.

Declared as :class:`~xpulaunch.cli.spec.Opt` tables (no click import: see that module)."""

from __future__ import annotations

from xpulaunch.cli.spec import FLAG, FLOAT, Opt
from xpulaunch.core.units import parse_size
from xpulaunch.errors import UsageError

PLAN_OPTIONS = (
    Opt(
        "--gpus",
        dest="gpus",
        default="auto",
        show_default=True,
        metavar="SPEC",
        help="auto | all | N | device=ID[,ID...] | 0,2 | none. Ids are physical indices, "
        "UUIDs or PCI addresses (CARD.TILE for one Intel tile).",
    ),
    Opt(
        "--backend",
        dest="backend",
        envvar="XPULAUNCH_BACKEND",
        default="auto",
        show_default=True,
        metavar="auto|cuda|xpu|rocm|cpu",
        help="Vendor stack to use [env: XPULAUNCH_BACKEND].",
    ),
    Opt(
        "--dry-run", dest="dry_run", kind=FLAG, help="Print the plan instead of starting anything."
    ),
    Opt("--json", dest="as_json", kind=FLAG, help="With --dry-run: the plan as JSON."),
    Opt(
        "--inventory",
        dest="inventory",
        envvar="XPULAUNCH_INVENTORY",
        metavar="FILE",
        help="Use this inventory document instead of probing [env: XPULAUNCH_INVENTORY].",
    ),
    Opt(
        "--min-free-memory",
        dest="min_free_memory",
        metavar="SIZE",
        help="Only devices with at least this much free memory (e.g. 8GiB).",
    ),
    Opt(
        "--max-utilization",
        dest="max_utilization",
        kind=FLOAT,
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
