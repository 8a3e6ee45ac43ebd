"""``RunRequest``: everything ``xpulaunch run`` was asked, as one frozen value.

The command line builds it once from click's converted values (:mod:`xpulaunch.cli.run_options`),
the Python API from keywords (:func:`xpulaunch.run`); :func:`xpulaunch.launch.run.run` is its
one reader. Values are already valid when it is built: click's parameter types check the
command line, :meth:`RunRequest.__post_init__` what the types cannot (combinations), so that a
dry run refuses exactly what a real run refuses.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING

from xpulaunch.errors import UsageError, check_plain, member_of
from xpulaunch.joblog.logs import LogLayout
from xpulaunch.model import DeviceMap, DeviceShare
from xpulaunch.nodes.settings import NodeRequest, NodeSettings
from xpulaunch.supervisor.restart import (
    DEFAULT_MAX_RESTARTS,
    RestartMode,
    RestartPolicy,
    restart_limit,
)

if TYPE_CHECKING:
    from xpulaunch.core.plan import LaunchRequest

DEFAULT_JOIN_TIMEOUT_S = 600.0  # torchrun's rendezvous join_timeout


@dataclass(frozen=True, slots=True)
class Backoff:
    """Seconds before the first restart, the cap, and the growth factor."""

    first_s: float = 1.0
    max_s: float = 30.0
    factor: float = 2.0


@dataclass(frozen=True, slots=True)
class RunRequest:
    """One launch. Field names are the options' (``--max-restarts`` is ``max_restarts``), with
    units where they have one. ``restart`` None: ``on-failure`` when ``max_restarts`` is
    given, else ``no``; ``max_restarts`` None: the default limit, -1 none (torchrun's)."""

    program: tuple[str, ...]
    # Which devices, and how many workers.
    gpus: str = "auto"
    backend: str | None = None
    nproc_per_node: int | None = 1  # None: one per selected device
    isolate: bool = False
    min_free_memory_bytes: int | None = None
    max_utilization_percent: float | None = None
    device_map: DeviceMap | None = None
    inventory: str | None = None  # an inventory document instead of probing this host
    cpu_bind: str = "none"  # none, numa or exclusive: each worker's CPUs near its devices
    gpu_ids: str | None = None  # accelerate's, in the child runtime's numbering; wins over gpus
    share: DeviceShare | None = None  # a slot of each device, not all of it (None: alone)
    topology: str = "prefer"  # prefer, require or ignore a closely linked set of devices
    extra_env: tuple[tuple[str, str], ...] = ()  # under the plan's own variables
    notes: tuple[str, ...] = ()  # added to the plan's "why"
    # Where this node stands in a job of several.
    nodes: NodeRequest = field(default_factory=NodeRequest)
    join_timeout_s: float = DEFAULT_JOIN_TIMEOUT_S
    rdzv_conf: tuple[tuple[str, str], ...] = ()  # torch's c10d settings
    # Restarts and stopping.
    restart: RestartMode | None = None
    max_restarts: int | None = None
    backoff: Backoff = field(default_factory=Backoff)
    stable_window_s: float = 60.0
    gang: bool | None = None  # None: gang restarts unless the workers are isolated
    grace_s: float = 10.0
    # What the run leaves behind and shows.
    log_dir: str | None = None
    log_layout: LogLayout = LogLayout.XPULAUNCH
    log_run_id: str | None = None  # torchrun's layout: the run's directory name
    ranks: frozenset[str] | None = None  # workers shown on the console; None: all
    color: bool | None = None  # None: on a terminal unless NO_COLOR
    hang_timeout_s: float | None = None
    heartbeat: bool = False
    max_runtime_s: float | None = None
    events: str | None = None  # a file, or "-" for standard output
    metrics_port: int | None = None
    metrics_host: str = "127.0.0.1"
    metrics_interval_s: float = 10.0
    # Device leases.
    lock_dir: str | None = None
    shared: bool = False
    wait: bool = False
    wait_timeout_s: float | None = None
    cwd: str | None = None

    def __post_init__(self) -> None:
        check_program(self.program)
        for each in fields(self):
            check_plain(each.name, getattr(self, each.name), str(each.type))
        # A Python caller's words (restart="always", log_layout="torchrun") become members:
        # the readers compare with `is`, so a plain "always" would silently restart nothing.
        if self.restart is not None:
            object.__setattr__(self, "restart", member_of(RestartMode, "restart", self.restart))
        object.__setattr__(self, "log_layout", member_of(LogLayout, "log_layout", self.log_layout))
        if self.device_map is not None:
            object.__setattr__(
                self, "device_map", member_of(DeviceMap, "device_map", self.device_map)
            )
        if self.topology != "prefer":  # refused before any probe
            from xpulaunch.core.plan import check_topology

            check_topology(self.topology)
        if self.heartbeat and self.hang_timeout_s is None:
            raise UsageError("--heartbeat needs --hang-timeout SECONDS (how long without a beat)")
        if self.max_restarts is not None and self.max_restarts < -1:
            raise UsageError(
                f"--max-restarts {self.max_restarts}: expected a count >= 0, or -1 for no limit"
            )
        if self.rdzv_conf and (self.nodes.rdzv_backend or "static") != "c10d":
            conf = ",".join(f"{k}={v}" for k, v in self.rdzv_conf)
            raise UsageError(
                f"--rdzv-conf {conf}: only with --rdzv-backend c10d (torch's rendezvous settings)"
            )

    @property
    def restart_mode(self) -> RestartMode:
        if self.restart is not None:
            return self.restart
        return RestartMode.ON_FAILURE if self.max_restarts not in (None, 0) else RestartMode.NO

    @property
    def restart_count(self) -> int | None:
        """The restart limit; None: no limit (``--restart always`` alone has none, as in
        docker)."""
        if self.max_restarts == -1:
            return None
        if self.max_restarts is None:
            return None if self.restart_mode is RestartMode.ALWAYS else DEFAULT_MAX_RESTARTS
        return self.max_restarts

    @property
    def restart_limit(self) -> int | None:
        """What workers see as ``TORCHELASTIC_MAX_RESTARTS``: 0 when they are not restarted."""
        return restart_limit(self.restart_mode, self.restart_count)

    def launch_request(
        self, argv: tuple[str, ...], nodes: NodeSettings, master_port: int
    ) -> LaunchRequest:
        """What the pure planner reads of this run on this node: the resolved ``argv`` of
        every worker, and the master's port (chosen by the caller: a free one, on one node)."""
        from xpulaunch.core.plan import LaunchRequest  # planning, after the probe is forked

        return LaunchRequest(
            argv=argv,
            gpus=self.gpus,
            backend=self.backend,
            nproc_per_node=self.nproc_per_node,
            isolate=self.isolate,
            min_free_memory_bytes=self.min_free_memory_bytes,
            max_utilization_percent=self.max_utilization_percent,
            device_map=self.device_map,
            master_addr=nodes.master_addr,
            master_port=master_port,
            max_restarts=self.restart_limit,
            extra_env=tuple(sorted(dict(self.extra_env).items())),
            nodes=nodes.nodes,
            gpu_ids=self.gpu_ids,
            cpu_bind=self.cpu_bind,
            share=self.share,
            run_id=self.nodes.rdzv_id or self.log_run_id or "none",
            topology=self.topology,
        )

    def policy(self, isolate: bool) -> RestartPolicy:
        return RestartPolicy(
            mode=self.restart_mode,
            max_restarts=self.restart_count,
            backoff_initial_s=self.backoff.first_s,
            backoff_factor=self.backoff.factor,
            backoff_max_s=self.backoff.max_s,
            stable_window_s=self.stable_window_s,
            gang=not isolate if self.gang is None else self.gang,
        )


def check_program(program: object) -> None:
    """``program`` is an argv: a list or tuple of strings, not empty (a Python caller's
    ``"train.py"`` would otherwise run as the letters ``t``, ``r``, ...)."""
    if isinstance(program, str | bytes) or not isinstance(program, list | tuple):
        raise UsageError("expected the argv as a list of strings", option="program", value=program)
    if not program:
        raise UsageError("no PROGRAM given")
    if not all(isinstance(arg, str) for arg in program):
        raise UsageError("expected strings only", option="program", value=program)
