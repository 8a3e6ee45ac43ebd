"""``xpulaunch llama [OPTIONS] [-- LLAMA_SERVER_ARGS...]``"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import click

from xpulaunch.cli.commands import CONTEXT_SETTINGS
from xpulaunch.cli.llama_options import llama_binary_options, load_or_probe
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
from xpulaunch.core.restart import RestartMode, RestartPolicy
from xpulaunch.errors import UsageError
from xpulaunch.joblog.logs import LogConfig
from xpulaunch.llamacpp.devices import parse_llama_backend
from xpulaunch.llamacpp.plan import LlamaPlan, LlamaRequest, Replica
from xpulaunch.llamacpp.serve import Prepared, cuda_settle, plan_prepared, prepare_llama
from xpulaunch.llamacpp.server import HealthOptions, LlamaServer
from xpulaunch.model import Inventory, Plan
from xpulaunch.processes.signals import forwarding

if TYPE_CHECKING:
    from xpulaunch.launch.request import Backoff
    from xpulaunch.leases import Lease, LeaseManager


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
def llama(server_args: tuple[str, ...], dry_run: bool, as_json: bool, **options: Any) -> int:
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
    parent_env = dict(os.environ)
    # The model and the binary first (asking the binary which build it is takes a while, and
    # is not done under the lease lock): a bad one is said before the host is probed or a
    # lock directory is read.
    prepared = prepare_llama(_request(server_args, options), parent_env, dry_run=dry_run)
    path = options["inventory"]
    inventory = load_or_probe(path, parent_env)
    if dry_run:
        # This host's leases, also for an --inventory: the real run reads them the same way.
        planner = _planner(prepared, inventory, parent_env, [])
        wait = options["wait"] or options["wait_timeout"] is not None
        plan = _leases(options).preview(planner, shared=options["shared"], wait=wait)
        print_plan(plan, as_json, servers=True)
        return 0
    return _lease_and_serve(prepared, inventory, parent_env, options)


# The planning and lease options are run's (ready-made parameters), listed first.
llama.params[:0] = [*plan_parameters(), *lease_parameters()]


def _planner(
    prepared: Prepared, inventory: Inventory, parent_env: dict[str, str], planned: list[LlamaPlan]
) -> Callable[[Mapping[str, str]], Plan]:
    """The lease manager's ``plan_fn``; the whole plan of its last call goes to ``planned``."""

    def plan_fn(unavailable: Mapping[str, str]) -> Plan:
        planned[:] = [plan_prepared(prepared, inventory, parent_env, unavailable=unavailable)]
        return planned[0].plan

    return plan_fn


def _leases(options: dict[str, Any]) -> LeaseManager:
    from xpulaunch.leases import LeaseManager

    return LeaseManager(options["lock_dir"])


def _lease_and_serve(
    prepared: Prepared,
    inventory: Inventory,
    parent_env: dict[str, str],
    options: dict[str, Any],
) -> int:
    """Plan under the lease lock (waiting in line if asked), then serve until stopped."""
    planned: list[LlamaPlan] = []
    plan_fn = _planner(prepared, inventory, parent_env, planned)
    with WaitReporter() as reporter:
        command = ["xpulaunch", "llama", "-m", str(prepared.request.model)]
        wait = options["wait"] or options["wait_timeout"] is not None
        _, lease = _leases(options).allocate(
            plan_fn, shared=options["shared"], wait=wait, wait_timeout_s=options["wait_timeout"],
            on_wait=reporter.on_wait, command=command,
        )  # fmt: skip
    with lease:
        return _serve(planned[0], parent_env, options, lease)


def _request(server_args: tuple[str, ...], options: dict[str, Any]) -> LlamaRequest:
    return LlamaRequest(
        model=options["model"],
        replicas=options["replicas"],
        host=options["host"],
        port=options["port"],
        binary=options["binary"] or "llama-server",
        llama_backend=parse_llama_backend(options["llama_backend"]),
        passthrough=server_args if options["metrics_port"] is None else (*server_args, "--metrics"),
        gpus=options["gpus"],
        backend=options["backend"],
        min_free_memory_bytes=options["min_free_memory"],
        max_utilization_percent=options["max_utilization"],
    )


def _serve(
    plan: LlamaPlan, parent_env: dict[str, str], options: dict[str, Any], lease: Lease
) -> int:
    backoff: Backoff = options["backoff"]
    policy = RestartPolicy(
        mode=RestartMode(options["restart"]),
        max_restarts=None if options["max_restarts"] == -1 else options["max_restarts"],
        backoff_initial_s=backoff.first_s, backoff_max_s=backoff.max_s,
        backoff_factor=backoff.factor, gang=False,
    )  # fmt: skip
    health = HealthOptions(
        ready_timeout_s=options["ready_timeout"],
        interval_s=options["health_interval"],
        timeout_s=options["health_timeout"],
        failure_threshold=options["health_failures"],
    )
    logs = LogConfig(log_dir=options["log_dir"], color=False if options["no_color"] else None)
    from xpulaunch.llamacpp.metrics import JobCounters, serving_metrics  # only for a server

    counters = JobCounters()
    server = LlamaServer(
        plan, parent_env, health=health, policy=policy, grace_s=options["grace"],
        logs=logs, on_ready=_ready_printer(plan), settle=cuda_settle(plan), lease_fds=lease.fds,
        job_id=lease.job_id, on_event=counters.on_event,
    )  # fmt: skip
    metrics = serving_metrics(server, plan, str(options["model"]), host=options["metrics_host"],
                              port=options["metrics_port"], counters=counters)  # fmt: skip
    with metrics, forwarding(server.send_stop_signal):
        server.start()
        status = server.wait()
    return 1 if status is None else status


def _ready_printer(plan: LlamaPlan) -> Callable[[Replica], None]:
    """Say where each ready replica runs, physically: llama.cpp's own names (``CUDA0``) are
    renumbered inside each replica's mask, so two replicas on two GPUs both say ``CUDA0``."""
    physical = {
        worker.name: ", ".join(plan.plan.devices[i].label() for i in worker.units)
        for worker in plan.plan.workers
    }

    def print_ready(replica: Replica) -> None:
        names = ",".join(replica.devices) or "CPU"
        where = physical.get(replica.name)
        shown = f"{names} = {where}" if where else names
        click.echo(f"xpulaunch: llama-server {replica.name} ready at {replica.url} ({shown})")

    return print_ready
