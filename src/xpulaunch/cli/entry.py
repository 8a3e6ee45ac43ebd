"""The ``xpulaunch`` executable and ``python -m xpulaunch``.

Before anything else of ours is imported, a command line that runs torch's c10d agent starts
the agent's interpreter early (:mod:`xpulaunch.proc.prestart`); then :mod:`xpulaunch.cli.main`
runs the command.
"""

from __future__ import annotations

import os
import sys

from xpulaunch.proc import prestart


def console_main() -> None:
    if prestart.wanted(sys.argv[1:], os.environ):
        prestart.start()  # in the forked child this runs the agent and never returns
    from xpulaunch.cli.main import console_main as run_command

    run_command()
