"""The options of ``run`` (and of ``torchrun``, which shares them; ``llama`` shares the
planning and lease options); :func:`to_request`, which turns click's converted values into a
:class:`~xpulaunch.launch.request.RunRequest`; and :func:`launch`, the one way both commands go
from those values to a printed plan or a supervised job.

Names follow torchrun where it has one (``--max-restarts``, ``--log-dir``,
``--local-ranks-filter``) and docker for the restart mode (``--restart on-failure``).
``--max-restarts N`` alone means ``--restart on-failure``, as in torchrun.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import click

from xpulaunch.cli.commands import completer
from xpulaunch.cli.params import (
    ANY_PORT,
    HOST,
    PORT,
    POSITIVE_SECONDS,
    SECONDS,
    BackoffType,
    Count,
    Integer,
    Names,
    Percent,
    Seconds,
    Size,
)
from xpulaunch.cli.waiting import LOCK_DIR, WaitReporter
from xpulaunch.errors import UsageError
from xpulaunch.joblog.logs import LogLayout
from xpulaunch.launch.request import DEFAULT_JOIN_TIMEOUT_S, RunRequest
from xpulaunch.model import MAX_SLOTS, CpuBind, DeviceMap, DeviceShare, Plan
from xpulaunch.nodes.settings import RDZV_CONF_KEYS, NodeRequest, parse_rdzv_conf
from xpulaunch.supervisor.restart import DEFAULT_MAX_RESTARTS, RestartMode


@dataclass(frozen=True)
class Spec:
    """One option: its declarations and click's keywords. ``torchrun``: the option is also
    torchrun's, so ``xpulaunch torchrun`` adds its underscore spelling and its ``PET_*``
    variable (read before ours, as torchrun reads it)."""

    decls: tuple[str, ...]
    kwargs: dict[str, Any] = field(default_factory=dict)
    torchrun: str | None = None  # torchrun's dash spelling, when torchrun has the option

    def option(self, *, as_torchrun: bool = False) -> click.Option:
        decls, kwargs = list(self.decls), dict(self.kwargs)
        if as_torchrun and self.torchrun:
            dest = self.torchrun[2:].replace("-", "_")
            if "_" in dest:  # torchrun's underscore spelling too
                decls.insert(1, "--" + dest)
            pet = "PET_" + dest.upper()
            ours = kwargs.get("envvar")
            kwargs["envvar"] = [pet, ours] if ours else pet
        if kwargs.get("envvar"):
            kwargs.setdefault("show_envvar", True)
        return click.Option(decls, **kwargs)


def _spec(*decls: str, torchrun: bool | str = False, **kwargs: Any) -> Spec:
    long = next(d for d in decls if d.startswith("--"))
    return Spec(
        decls, kwargs, (torchrun if isinstance(torchrun, str) else long) if torchrun else None
    )


# core.topology.TopologyMode's words (that module is imported only when N devices are chosen).
TOPOLOGY_MODES = ("prefer", "require", "ignore")

RUN_ONLY = (
    _spec(
        "--nproc-per-node",
        type=Count(),
        default="1",
        show_default=True,
        metavar="N|auto",
        torchrun=True,
        help="Worker processes; auto = one per selected device.",
    ),
    _spec("--isolate", is_flag=True, help="Each worker sees only its own devices."),
    _spec(
        "--cpu-bind",
        type=click.Choice([m.value for m in CpuBind]),
        default="none",
        show_default=True,
        envvar="XPULAUNCH_CPU_BIND",
        help="Bind each rank to the CPUs of its devices' NUMA node (numa), or to its own "
        "share of that node's cores, SMT siblings together (exclusive); OMP_NUM_THREADS "
        "follows.",
    ),
    _spec(
        "--device-map",
        type=click.Choice([m.value for m in DeviceMap]),
        help="Device map exported as XPULAUNCH_DEVICE_MAP (default: sequential for one "
        "device, balanced for one worker over several; several workers each get their "
        "own device's).",
    ),
    _spec(
        "--master-addr",
        type=HOST,
        torchrun=True,
        help="Node 0's address for the workers' rendezvous [default: 127.0.0.1, or "
        "MASTER_ADDR / the cluster's with several nodes]",
    ),
    _spec("--master-port", type=PORT, torchrun=True, help="Default: a free port."),
)

SUPERVISION = (
    _spec(
        "--restart",
        type=click.Choice([m.value for m in RestartMode]),
        envvar="XPULAUNCH_RESTART",
        help="When workers are started again. Default: no, or on-failure when "
        "--max-restarts is given.",
    ),
    _spec(
        "--max-restarts",
        type=Integer(-1),
        envvar="XPULAUNCH_MAX_RESTARTS",
        metavar="N",
        torchrun=True,
        help=f"Restarts allowed inside the stability window (-1: no limit; default "
        f"{DEFAULT_MAX_RESTARTS} with --restart).",
    ),
    _spec(
        "--backoff",
        type=BackoffType(),
        default="1:30:2",
        show_default=True,
        envvar="XPULAUNCH_BACKOFF",
        metavar="FIRST[:MAX[:FACTOR]]",
        help="Seconds before the first restart, the cap, and the growth factor; 0 restarts "
        "at once.",
    ),
    _spec(
        "--stable-window",
        type=SECONDS,
        default=60.0,
        show_default=True,
        envvar="XPULAUNCH_STABLE_WINDOW",
        metavar="SECONDS",
        help="A run that lasted this long resets the restart count.",
    ),
    _spec(
        "--gang/--no-gang",
        default=None,
        help="Restart all workers when one fails (default without --isolate) or each on "
        "its own (default with --isolate).",
    ),
    _spec(
        "--grace",
        type=SECONDS,
        default=10.0,
        show_default=True,
        envvar="XPULAUNCH_GRACE",
        metavar="SECONDS",
        help="After the stop signal, wait this long before SIGKILL.",
    ),
    _spec(
        "--log-dir",
        type=click.Path(file_okay=False),
        envvar="XPULAUNCH_LOG_DIR",
        torchrun=True,
        help="Write every worker's output of every attempt under DIR (see --log-layout).",
    ),
    _spec(
        "--log-layout",
        type=click.Choice([m.value for m in LogLayout]),
        default="xpulaunch",
        show_default=True,
        envvar="XPULAUNCH_LOG_LAYOUT",
        help="--log-dir as DIR/attempt_N/WORKER.log (time-stamped lines), or as torchrun "
        "writes it: DIR/RUNID_XXXXXXXX/attempt_N/LOCAL_RANK/{stdout,stderr}.log, error.json.",
    ),
    # Set by xpulaunch torchrun: its --rdzv-id, or the --standalone uuid.
    _spec(
        "--log-run-id",
        hidden=True,
        help="The run id that starts the run's directory name in torchrun's layout.",
    ),
    _spec(
        "--ranks",
        "--local-ranks-filter",
        "ranks",
        type=Names(),
        metavar="LIST",
        torchrun="--local-ranks-filter",
        help="Show only these workers on the console, e.g. 0,2 (log files keep all).",
    ),
    _spec("--no-color", is_flag=True, help="No colour in worker prefixes (also NO_COLOR=1)."),
)

OPERATIONS = (
    _spec(
        "--hang-timeout",
        type=POSITIVE_SECONDS,
        envvar="XPULAUNCH_HANG_TIMEOUT",
        metavar="SECONDS",
        help="A worker that prints nothing (with --heartbeat: does not call "
        "xpulaunch.heartbeat()) for this long is failed: stacks dumped with py-spy when "
        "installed, then the restart policy applies.",
    ),
    _spec(
        "--heartbeat",
        is_flag=True,
        help="With --hang-timeout: watch XPULAUNCH_HEARTBEAT_FILE, touched by "
        "xpulaunch.heartbeat(), instead of the output.",
    ),
    _spec(
        "--max-runtime",
        type=POSITIVE_SECONDS,
        envvar="XPULAUNCH_MAX_RUNTIME",
        metavar="SECONDS",
        help="Stop the job after this long (exit status 124).",
    ),
    _spec(
        "--events",
        metavar="FILE|-",
        envvar="XPULAUNCH_EVENTS",
        help="Append every supervisor event to FILE as JSON lines (-: standard output, "
        "and the workers' standard output goes to standard error).",
    ),
    _spec(
        "--metrics-port",
        type=ANY_PORT,
        envvar="XPULAUNCH_METRICS_PORT",
        metavar="PORT",
        help="Serve Prometheus metrics on http://HOST:PORT/metrics (0: a free port).",
    ),
    _spec(
        "--metrics-host",
        type=HOST,
        default="127.0.0.1",
        show_default=True,
        envvar="XPULAUNCH_METRICS_HOST",
        help="Address the metrics endpoint listens on.",
    ),
    # Below a tenth of a second the probe loop would keep a core busy.
    _spec(
        "--metrics-interval",
        type=Seconds(minimum=0.1),
        default=10.0,
        show_default=True,
        metavar="SECONDS",
        help="How often device memory and utilisation are probed again for the metrics.",
    ),
)

MULTINODE = (
    _spec(
        "--nnodes",
        envvar="XPULAUNCH_NNODES",
        metavar="N|MIN:MAX|auto",
        torchrun=True,
        help="Nodes in the job, one xpulaunch on each (default 1); auto: from Slurm, "
        "Kubeflow PyTorchJob or MPI variables; MIN:MAX with --rdzv-backend c10d.",
    ),
    _spec(
        "--node-rank",
        type=Integer(0),
        envvar="XPULAUNCH_NODE_RANK",
        torchrun=True,
        help="This node's rank, 0 to nnodes - 1 (default 0). Global RANK = node_rank * "
        "nproc-per-node + LOCAL_RANK.",
    ),
    _spec(
        "--rdzv-backend",
        metavar="static|c10d",
        torchrun=True,
        help="Rendezvous: static (MASTER_ADDR/MASTER_PORT, torch's env://; the default) or "
        "c10d (torch's elastic rendezvous and agent; --nnodes MIN:MAX allowed).",
    ),
    _spec(
        "--rdzv-id",
        metavar="ID",
        torchrun=True,
        help="The job's id on a c10d rendezvous (the same on every node).",
    ),
    _spec(
        "--rdzv-endpoint",
        metavar="HOST:PORT",
        torchrun=True,
        help="static: node 0's address (instead of --master-addr/--master-port); c10d: "
        "where the rendezvous store is (the first node there hosts it).",
    ),
    _spec(
        "--join-timeout",
        type=SECONDS,
        default=DEFAULT_JOIN_TIMEOUT_S,
        show_default=True,
        envvar="XPULAUNCH_JOIN_TIMEOUT",
        metavar="SECONDS",
        help="How long nodes wait for each other before starting workers; 0 skips the check.",
    ),
    _spec(
        "--rdzv-conf",
        envvar="XPULAUNCH_RDZV_CONF",
        metavar="KEY=VALUE[,...]",
        torchrun=True,
        help="c10d: torch's rendezvous settings, e.g. last_call_timeout=5 (whole seconds); "
        "keys: " + ", ".join(RDZV_CONF_KEYS) + ". join_timeout here replaces "
        "--join-timeout.",
    ),
)

LEASES = (
    _spec("--lock-dir", **LOCK_DIR),
    _spec(
        "--shared",
        is_flag=True,
        help="Use devices named in --gpus even when another job has leased them, and lease "
        "nothing: other jobs may then get these devices too.",
    ),
    _spec(
        "--wait",
        is_flag=True,
        help="When the devices are leased by other jobs, queue until they are free (first "
        "come, first served) instead of failing.",
    ),
    _spec(
        "--wait-timeout",
        type=SECONDS,
        metavar="SECONDS",
        help="Give up waiting after SECONDS (implies --wait).",
    ),
)

ACCELERATE = (
    _spec(
        "--accelerate-config",
        envvar="XPULAUNCH_ACCELERATE_CONFIG",
        metavar="FILE|default",
        help="Start the job as `accelerate launch` would with this config file (default: "
        "accelerate's own default file); our options given explicitly win.",
    ),
)

SHARE = (
    _spec(
        "--slots-per-gpu",
        type=Integer(1, MAX_SLOTS),
        envvar="XPULAUNCH_SLOTS_PER_GPU",
        metavar="K",
        help="Share each device with other small jobs, at most K on it; this job's share "
        "(XPULAUNCH_MAX_MEMORY) is 1/K of its memory.",
    ),
    _spec(
        "--gpu-memory",
        type=Size(),
        envvar="XPULAUNCH_GPU_MEMORY",
        metavar="SIZE",
        help="Share each device with other small jobs while their budgets fit its memory; "
        "this job's budget on each (e.g. 10GiB).",
    ),
)

RUN_SPECS = (*RUN_ONLY, *SUPERVISION, *OPERATIONS, *MULTINODE, *LEASES, *SHARE, *ACCELERATE)


def plan_parameters() -> list[click.Parameter]:
    """A fresh list of the shared planning options (click parameters are not shared between
    commands)."""
    return [
        click.Option(
            ["--gpus"],
            default="auto",
            show_default=True,
            metavar="SPEC",
            shell_complete=completer("complete_gpus"),
            help="auto | all | N | device=ID[,ID...] | 0,2 | none. Ids are physical indices, "
            "UUIDs, PCI addresses, CARD.TILE for one Intel tile, MIG-UUID, or vendor:ID "
            "(nvidia:0) on hosts with several vendors.",
        ),
        click.Option(
            ["--backend"],
            envvar="XPULAUNCH_BACKEND",
            default="auto",
            show_default=True,
            metavar="auto|cuda|xpu|rocm|cpu",
            show_envvar=True,
            help="Vendor stack to use.",
        ),
        click.Option(["--dry-run"], is_flag=True, help="Print the plan; start nothing."),
        click.Option(["--json", "as_json"], is_flag=True, help="With --dry-run: the plan as JSON."),
        click.Option(
            ["--inventory"],
            envvar="XPULAUNCH_INVENTORY",
            metavar="FILE",
            show_envvar=True,
            shell_complete=completer("complete_file"),
            help="Use this inventory document instead of probing this host.",
        ),
        click.Option(
            ["--min-free-memory"],
            type=Size(),
            metavar="SIZE",
            help="Only devices with at least this much free memory (e.g. 8GiB).",
        ),
        click.Option(
            ["--max-utilization"],
            type=Percent(),
            metavar="PERCENT",
            help="Only devices at most this busy.",
        ),
        click.Option(
            ["--topology"],
            type=click.Choice(TOPOLOGY_MODES),
            default="prefer",
            show_default=True,
            envvar="XPULAUNCH_TOPOLOGY",
            show_envvar=True,
            help="For N devices: prefer a set in one NVLink/XGMI/Xe Link group, then under one "
            "PCIe switch, then on one NUMA node; require: refuse when no free set shares the "
            "closest level the host has; ignore: most free memory only.",
        ),
    ]


def run_parameters(*, as_torchrun: bool = False) -> list[click.Parameter]:
    """A fresh list of ``run``'s options (click parameters are not shared between commands)."""
    return [*plan_parameters(), *(spec.option(as_torchrun=as_torchrun) for spec in RUN_SPECS)]


def lease_parameters() -> list[click.Parameter]:
    return [spec.option() for spec in LEASES]


def to_request(program: tuple[str, ...], values: Mapping[str, Any]) -> RunRequest:
    """``run``'s converted values (click's keyword arguments) -> the request."""
    conf = values["rdzv_conf"]
    settings = dict(parse_rdzv_conf(conf or ""))
    join_timeout_s = _join_timeout(values["join_timeout"], settings.pop("join_timeout", None))
    restart = values["restart"]
    return RunRequest(
        program=program,
        gpus=values["gpus"],
        backend=values["backend"],
        nproc_per_node=values["nproc_per_node"],
        isolate=values["isolate"],
        cpu_bind=values["cpu_bind"],
        gpu_ids=values.get("gpu_ids"),
        min_free_memory_bytes=values["min_free_memory"],
        max_utilization_percent=values["max_utilization"],
        device_map=DeviceMap(values["device_map"]) if values["device_map"] else None,
        inventory=values["inventory"] or None,
        extra_env=tuple(values.get("extra_env", ())),
        notes=tuple(values.get("notes", ())),
        nodes=NodeRequest(
            nnodes=values["nnodes"],
            node_rank=values["node_rank"],
            master_addr=values["master_addr"],
            master_port=values["master_port"],
            rdzv_backend=values["rdzv_backend"],
            rdzv_endpoint=values["rdzv_endpoint"],
            rdzv_id=values["rdzv_id"],
        ),
        join_timeout_s=join_timeout_s,
        rdzv_conf=tuple(settings.items()) if conf else (),
        restart=RestartMode(restart) if restart else None,
        max_restarts=values["max_restarts"],
        backoff=values["backoff"],
        stable_window_s=values["stable_window"],
        gang=values["gang"],
        grace_s=values["grace"],
        log_dir=str(values["log_dir"]) if values["log_dir"] else None,
        log_layout=LogLayout(values["log_layout"]),
        log_run_id=values["log_run_id"],
        ranks=values["ranks"],
        color=False if values["no_color"] else None,
        hang_timeout_s=values["hang_timeout"],
        heartbeat=values["heartbeat"],
        max_runtime_s=values["max_runtime"],
        events=values["events"] or None,
        metrics_port=values["metrics_port"],
        metrics_host=values["metrics_host"],
        metrics_interval_s=values["metrics_interval"],
        lock_dir=str(values["lock_dir"]) if values["lock_dir"] else None,
        shared=values["shared"],
        wait=values["wait"] or values["wait_timeout"] is not None,
        wait_timeout_s=values["wait_timeout"],
        share=_share(values["slots_per_gpu"], values["gpu_memory"]),
        topology=values.get("topology") or "prefer",
        cwd=os.getcwd(),
    )


def launch(
    program: tuple[str, ...], values: dict[str, Any], *, dry_run: bool, as_json: bool
) -> int:
    """``run``'s converted values (also ``torchrun``'s, mapped) -> a plan printed, or a job."""
    env = dict(os.environ)
    with accelerate_applied(values, env):
        return _launch(program, values, env, dry_run=dry_run, as_json=as_json)


def _launch(
    program: tuple[str, ...],
    values: dict[str, Any],
    env: dict[str, str],
    *,
    dry_run: bool,
    as_json: bool,
) -> int:
    request = to_request(program, values)
    if dry_run:
        from xpulaunch.cli.render import print_plan

        print_plan(dry_run_plan(request, env), as_json, heartbeat=request.heartbeat)
        return 0
    if as_json:
        raise UsageError("--json goes with --dry-run")
    probe = None
    if request.inventory is None:  # probes while the supervisor is imported below
        from xpulaunch.probing.isolated import ForkedProbe

        probe = ForkedProbe(env)
    with probe or contextlib.nullcontext():
        from xpulaunch.launch.run import run as launch_job

        with WaitReporter() as ui:
            return launch_job(request, env, ui, probe=probe)


@contextlib.contextmanager
def accelerate_applied(values: dict[str, Any], env: dict[str, str]) -> Iterator[None]:
    """With ``--accelerate-config``, its settings fill run's options (the nodes' too) first,
    and an error about the devices the file names says so, naming the file."""
    if not values.get("accelerate_config"):
        yield
        return
    from xpulaunch.cli.accelerate import apply_accelerate_config, devices_named_by_file

    apply_accelerate_config(values, env)
    with devices_named_by_file(values):
        yield


def dry_run_plan(request: RunRequest, env: Mapping[str, str]) -> Plan:
    """The plan a real run would make now (warnings said on stderr); reserves nothing."""
    from xpulaunch.launch.run import dry_run

    return dry_run(request, env, _warn)


def _warn(text: str) -> None:
    click.echo(f"xpulaunch: {text}", err=True)


def _share(slots: int | None, memory_bytes: int | None) -> DeviceShare | None:
    """None unless the job asks to share its devices (K = 1 alone is a device to oneself)."""
    if memory_bytes == 0:
        raise UsageError("--gpu-memory 0: a budget must be more than 0 bytes")
    if memory_bytes is None and (slots is None or slots == 1):
        return None
    return DeviceShare(slots=slots if slots and slots > 1 else None, memory_bytes=memory_bytes)


def _join_timeout(option: float, setting: str | None) -> float:
    """``--rdzv-conf join_timeout=S`` is torchrun's spelling of ``--join-timeout S``: it
    replaces the default; beside a ``--join-timeout`` given (also by variable or config file)
    with another value it is refused, as neither would be sure to win."""
    if setting is None:
        return option
    source = click.get_current_context().get_parameter_source("join_timeout")
    if source not in (None, click.core.ParameterSource.DEFAULT) and float(setting) != option:
        raise UsageError(
            f"--rdzv-conf join_timeout={setting} and --join-timeout {option:g}: give one of them"
        )
    return float(setting)
