"""``--cpu-bind none|numa|exclusive``: run each rank on the CPUs near its devices.

One decorator for any command that plans workers on devices (``run``; see
:mod:`xpulaunch.core.cpu_bind` for the rules). The value goes to ``api.plan(cpu_bind=...)``.
"""

from __future__ import annotations

import click

from xpulaunch.cli.options import option_group
from xpulaunch.core.cpu_bind import CpuBind

cpu_bind_option = option_group(
    click.option(
        "--cpu-bind",
        envvar="XPULAUNCH_CPU_BIND",
        type=click.Choice([m.value for m in CpuBind]),
        default=CpuBind.NONE.value,
        show_default=True,
        help="Bind each rank to the CPUs of its devices' NUMA node (numa), or to its own share "
        "of that node's cores, SMT siblings together (exclusive); OMP_NUM_THREADS follows "
        "[env: XPULAUNCH_CPU_BIND].",
    ),
)
