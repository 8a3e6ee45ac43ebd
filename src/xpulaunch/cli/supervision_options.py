"""What shapes supervision in ``run``: restarts, stopping, logs and the console.

:meth:`xpulaunch.launch.run.RunOptions.from_cli` says what the values mean. ``llama`` has its
own variants of some of these, with other defaults (a server is restarted by default).
"""

from __future__ import annotations

import click

from xpulaunch.cli.bounds import SECONDS
from xpulaunch.cli.options import option_group
from xpulaunch.launch.options import DEFAULT_MAX_RESTARTS

supervision_options = option_group(
    click.option(
        "--restart",
        type=click.Choice(["no", "on-failure", "always"]),
        envvar="XPULAUNCH_RESTART",
        help="When workers are started again. Default: no, or on-failure when "
        "--max-restarts is given.",
    ),
    click.option(
        "--max-restarts",
        type=click.IntRange(min=-1),
        envvar="XPULAUNCH_MAX_RESTARTS",
        metavar="N",
        help=f"Restarts allowed inside the stability window (-1: no limit; default "
        f"{DEFAULT_MAX_RESTARTS} with --restart).",
    ),
    click.option(
        "--backoff",
        default="1:30:2",
        show_default=True,
        envvar="XPULAUNCH_BACKOFF",
        metavar="FIRST[:MAX[:FACTOR]]",
        help="Seconds before the first restart, the cap, and the growth factor; 0 restarts "
        "at once.",
    ),
    click.option(
        "--stable-window",
        type=SECONDS,
        default=60.0,
        show_default=True,
        envvar="XPULAUNCH_STABLE_WINDOW",
        metavar="SECONDS",
        help="A run that lasted this long resets the restart count.",
    ),
    click.option(
        "--gang/--no-gang",
        default=None,
        help="Restart all workers when one fails (default without --isolate) or each on "
        "its own (default with --isolate).",
    ),
    click.option(
        "--grace",
        type=SECONDS,
        default=10.0,
        show_default=True,
        envvar="XPULAUNCH_GRACE",
        metavar="SECONDS",
        help="After the stop signal, wait this long before SIGKILL.",
    ),
    click.option(
        "--log-dir",
        type=click.Path(file_okay=False),
        envvar="XPULAUNCH_LOG_DIR",
        help="Write every worker's output of every attempt under DIR (see --log-layout).",
    ),
    click.option(
        "--log-layout",
        type=click.Choice(["xpulaunch", "torchrun"]),
        default="xpulaunch",
        show_default=True,
        envvar="XPULAUNCH_LOG_LAYOUT",
        help="--log-dir as DIR/attempt_N/WORKER.log (time-stamped lines), or as torchrun "
        "writes it: DIR/RUNID_XXXXXXXX/attempt_N/LOCAL_RANK/{stdout,stderr}.log, error.json.",
    ),
    click.option(
        "--log-run-id",
        hidden=True,  # set by xpulaunch torchrun: its --rdzv-id, or the --standalone uuid
        help="The run id that starts the run's directory name in torchrun's layout.",
    ),
    click.option(
        "--ranks",
        "--local-ranks-filter",
        "ranks",
        metavar="LIST",
        help="Show only these workers on the console, e.g. 0,2 (log files keep all).",
    ),
    click.option(
        "--no-color",
        is_flag=True,
        help="No colour in worker prefixes (also NO_COLOR=1).",
    ),
)
