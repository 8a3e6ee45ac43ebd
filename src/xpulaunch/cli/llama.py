"""``xpulaunch llama [OPTIONS] [-- LLAMA_SERVER_ARGS...]``: parse -> :class:`LlamaRunRequest`
-> :mod:`xpulaunch.llamacpp.launch` -> what it says, printed."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

import click

from xpulaunch.cli.commands import CONTEXT_SETTINGS
from xpulaunch.cli.llama_options import llama_binary_options, to_llama_request
from xpulaunch.cli.params import (
    ANY_PORT,
    HOST,
    POSITIVE_SECONDS,
    SECONDS,
    BackoffType,
    Integer,
)
from xpulaunch.cli.render import print_plan
from xpulaunch.cli.run_options import lease_parameters, plan_parameters
from xpulaunch.cli.waiting import WaitReporter
from xpulaunch.errors import UsageError
from xpulaunch.llamacpp import launch

if TYPE_CHECKING:
    from xpulaunch.llamacpp.plan import LlamaPlan, Replica


@click.command(context_settings=CONTEXT_SETTINGS)
@click.option("-m", "--model", metavar="PATH", help="The .gguf model every replica serves.")
@click.option(
    "--replicas",
    type=Integer(1, 1024),
    default=1,
    show_default=True,
    help="Servers to start, each on its own devices and port.",
)
@click.option(
    "--port",
    type=Integer(1, 65535),
    help="Port of the first replica (the next ones count up). Default: free ports.",
)
@click.option("--host", type=HOST, default="127.0.0.1", show_default=True, help="Address to bind.")
@llama_binary_options
@click.option(
    "--ready-timeout",
    type=POSITIVE_SECONDS,
    default=600.0,
    show_default=True,
    metavar="SECONDS",
    help="How long one start may take to answer /health with 200.",
)
@click.option(
    "--health-interval",
    type=POSITIVE_SECONDS,
    default=2.0,
    show_default=True,
    metavar="SECONDS",
    help="Seconds between liveness checks of a ready server.",
)
@click.option(
    "--health-timeout",
    type=POSITIVE_SECONDS,
    default=2.0,
    show_default=True,
    metavar="SECONDS",
    help="A /health answer slower than this is a failed check.",
)
@click.option(
    "--health-failures",
    type=Integer(1),
    default=3,
    show_default=True,
    metavar="N",
    help="Failed checks in a row before a server is restarted.",
)
@click.option(
    "--restart",
    type=click.Choice(["no", "on-failure", "always"]),
    default="always",
    show_default=True,
    envvar="XPULAUNCH_RESTART",
    help="When a replica that was ready once is started again (exits and failed "
    "health checks both count).",
)
@click.option(
    "--max-restarts",
    type=Integer(-1),
    default=3,
    show_default=True,
    envvar="XPULAUNCH_MAX_RESTARTS",
    metavar="N",
    help="Restarts of one replica within 60 s of stable running (-1: no limit).",
)
@click.option(
    "--backoff",
    type=BackoffType(),
    default="1:30:2",
    show_default=True,
    envvar="XPULAUNCH_BACKOFF",
    metavar="FIRST[:MAX[:FACTOR]]",
    help="Seconds before the first restart, the cap, and the growth factor.",
)
@click.option(
    "--grace",
    type=SECONDS,
    default=10.0,
    show_default=True,
    envvar="XPULAUNCH_GRACE",
    metavar="SECONDS",
    help="After SIGTERM, wait this long before SIGKILL.",
)
@click.option(
    "--log-dir",
    type=click.Path(file_okay=False),
    envvar="XPULAUNCH_LOG_DIR",
    help="Write DIR/attempt_N/REPLICA.log for every replica and attempt.",
)
@click.option("--no-color", is_flag=True, help="No colour in replica prefixes (also NO_COLOR=1).")
@click.option(
    "--metrics-port",
    type=ANY_PORT,
    envvar="XPULAUNCH_METRICS_PORT",
    metavar="PORT",
    help="Serve Prometheus metrics on http://HOST:PORT/metrics: the supervisor's, and "
    "each replica's own (llama-server --metrics) labelled with model and replica.",
)
@click.option(
    "--metrics-host",
    type=HOST,
    default="127.0.0.1",
    show_default=True,
    envvar="XPULAUNCH_METRICS_HOST",
    help="Address the metrics endpoint listens on.",
)
@click.argument("server_args", nargs=-1, type=click.UNPROCESSED)
def llama(server_args: tuple[str, ...], dry_run: bool, as_json: bool, **values: Any) -> int:
    """Start llama.cpp's llama-server pinned to selected devices, wait until every replica
    answers /health, print their URLs and keep them running (restarted when they exit or
    stop answering). Arguments after -- go to llama-server and win over ours.

    \b
    xpulaunch llama -m model.gguf --gpus 2                one server split over 2 GPUs
    xpulaunch llama -m model.gguf --gpus 2 --replicas 2   two servers, one GPU each
    xpulaunch llama -m model.gguf -- -c 8192 -ngl 20      llama-server's own options
    xpulaunch llama serve --config models.toml            several models behind one port
    """
    if as_json and not dry_run:
        raise UsageError("--json goes with --dry-run")
    request = to_llama_request(server_args, values)
    env = dict(os.environ)
    if dry_run:
        print_plan(launch.dry_run(request, env).plan, as_json, servers=True)
        return 0
    with WaitReporter() as reporter:
        return launch.run(request, env, _Console(reporter))


# The planning and lease options are run's (ready-made parameters), listed first.
llama.params[:0] = [*plan_parameters(), *lease_parameters()]


class _Console:
    """Where ``xpulaunch llama`` says what happens: the wait line, and each ready replica."""

    def __init__(self, reporter: WaitReporter) -> None:
        self.on_wait = reporter.on_wait

    def on_ready(self, plan: LlamaPlan, replica: Replica) -> None:
        """Say where each ready replica runs, physically: llama.cpp's own names (``CUDA0``)
        are renumbered inside each replica's mask, so two replicas on two GPUs both say
        ``CUDA0``."""
        worker = next((w for w in plan.plan.workers if w.name == replica.name), None)
        where = ", ".join(plan.plan.devices[i].label() for i in worker.units) if worker else ""
        names = ",".join(replica.devices) or "CPU"
        shown = f"{names} = {where}" if where else names
        click.echo(f"xpulaunch: llama-server {replica.name} ready at {replica.url} ({shown})")
