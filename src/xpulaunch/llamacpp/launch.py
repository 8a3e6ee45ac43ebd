"""The one orchestrator of llama-server replicas, for ``xpulaunch llama``, :func:`serve_llama`
and the model router alike: a request -> the binary and the model asked (outside the lease
lock: that takes seconds on a GPU host) -> plan and lease atomically -> the one
:class:`~xpulaunch.llamacpp.server.LlamaServer`, started. No click, no printing: what a user
should read goes to the caller's :class:`LlamaUI`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Protocol

from xpulaunch.joblog.logs import LogConfig
from xpulaunch.llamacpp.plan import LlamaPlan, LlamaRequest, Replica
from xpulaunch.llamacpp.prepare import Prepared, cuda_settle, plan_prepared, prepare_llama
from xpulaunch.llamacpp.server import DEFAULT_POLICY, HealthOptions, LlamaServer
from xpulaunch.supervisor.restart import RestartPolicy

if TYPE_CHECKING:
    from xpulaunch.leases.manager import Lease, LeaseManager
    from xpulaunch.leases.wait_queue import WaitStatus
    from xpulaunch.model import Inventory, Plan


@dataclass(frozen=True, slots=True)
class LeaseOptions:
    """How the replicas' devices are leased: ``run``'s lease options."""

    lock_dir: str | None = None
    shared: bool = False
    wait: bool = False
    wait_timeout_s: float | None = None


@dataclass(frozen=True, slots=True)
class LlamaRunRequest:
    """Everything ``xpulaunch llama`` was asked, as one frozen value (the command line builds
    it once, :func:`xpulaunch.cli.llama_options.to_llama_request`). ``inventory``: an
    inventory document instead of probing this host (its plan ignores this host's leases)."""

    llama: LlamaRequest
    inventory: str | None = None
    health: HealthOptions = field(default_factory=HealthOptions)
    policy: RestartPolicy = DEFAULT_POLICY
    grace_s: float = 10.0
    logs: LogConfig = field(default_factory=LogConfig)
    leases: LeaseOptions = field(default_factory=LeaseOptions)
    metrics_host: str = "127.0.0.1"
    metrics_port: int | None = None


class LlamaUI(Protocol):
    """What a serve tells its caller: the state of a wait in line for devices, and each
    replica once it is ready (again, after a restart: on the supervisor's thread)."""

    def on_wait(self, status: WaitStatus) -> None: ...

    def on_ready(self, plan: LlamaPlan, replica: Replica) -> None: ...


def lease_plan(
    prepared: Prepared,
    inventory: Inventory,
    parent_env: Mapping[str, str],
    leases: LeaseManager,
    *,
    command: list[str],
    options: LeaseOptions = LeaseOptions(),
    on_wait: Callable[[WaitStatus], None] | None = None,
    avoid: Mapping[str, str] | None = None,
) -> tuple[LlamaPlan, Lease]:
    """Plan every replica with the devices others lease excluded (and those ``avoid`` names,
    unit key -> why), and lease the plan's devices, atomically (waiting in line when asked
    to)."""
    avoided = dict(avoid or {})
    return leases.allocate(
        lambda unavailable: plan_prepared(
            prepared, inventory, parent_env, unavailable={**unavailable, **avoided}
        ),
        plan_of=_plan_of,
        shared=options.shared,
        wait=options.wait or options.wait_timeout_s is not None,
        wait_timeout_s=options.wait_timeout_s,
        on_wait=on_wait,
        command=command,
        share=prepared.request.share,
    )


def preview(
    prepared: Prepared,
    inventory: Inventory,
    parent_env: Mapping[str, str],
    leases: LeaseManager,
    options: LeaseOptions = LeaseOptions(),
) -> LlamaPlan:
    """The plan :func:`lease_plan` would make now, reserving nothing (a dry run); with
    ``wait``, the plan it would wait for."""
    return leases.preview(
        lambda unavailable: plan_prepared(prepared, inventory, parent_env, unavailable=unavailable),
        prepared.request.share,
        plan_of=_plan_of,
        noted=_noted,
        shared=options.shared,
        wait=options.wait or options.wait_timeout_s is not None,
    )


def _plan_of(planned: LlamaPlan) -> Plan:
    return planned.plan


def _noted(planned: LlamaPlan, note: str) -> LlamaPlan:
    return replace(planned, plan=replace(planned.plan, notes=(*planned.plan.notes, note)))


def server_for(
    plan: LlamaPlan,
    lease: Lease,
    parent_env: Mapping[str, str],
    *,
    owns_lease: bool,
    **options: Any,
) -> LlamaServer:
    """The replicas of ``plan`` under the lease's descriptors (the one place a
    :class:`LlamaServer` is made). ``owns_lease``: the server releases the lease when it
    stops (otherwise its caller does). ``options`` go to :class:`LlamaServer`; on CUDA a
    restart waits for a dead replica's memory to be freed unless ``settle`` says otherwise."""
    options.setdefault("settle", cuda_settle(plan))
    return LlamaServer(
        plan,
        parent_env,
        lease_fds=lease.fds,
        job_id=lease.job_id,
        lease=lease if owns_lease else None,
        **options,
    )


def lease_and_start(
    prepared: Prepared,
    inventory: Inventory,
    parent_env: Mapping[str, str],
    leases: LeaseManager,
    *,
    command: list[str],
    options: LeaseOptions = LeaseOptions(),
    on_wait: Callable[[WaitStatus], None] | None = None,
    **server_options: Any,
) -> LlamaServer:
    """:func:`lease_plan`, then :func:`server_for` (which owns the lease), started: every
    replica answers ``/health`` when this returns. A failed start leaves nothing running and
    nothing leased."""
    plan, lease = lease_plan(
        prepared, inventory, parent_env, leases, command=command, options=options, on_wait=on_wait
    )
    try:
        server = server_for(plan, lease, parent_env, owns_lease=True, **server_options)
        server.start()
    except BaseException:
        lease.release()  # start() stopped what it had started
        raise
    return server


def dry_run(request: LlamaRunRequest, parent_env: Mapping[str, str]) -> LlamaPlan:
    """The plan ``xpulaunch llama`` would make now, refusing what it would refuse: with this
    host's leases, also for an ``--inventory``, as the real run reads them."""
    prepared = prepare_llama(request.llama, parent_env, dry_run=True)
    inventory = load_or_probe(request.inventory, parent_env)
    return preview(prepared, inventory, parent_env, _leases(request, parent_env), request.leases)


def run(request: LlamaRunRequest, parent_env: Mapping[str, str], ui: LlamaUI) -> int:
    """Lease devices and serve until stopped (a signal is passed on to the replicas); the
    exit status."""
    from xpulaunch.llamacpp.metrics import JobCounters, serving_metrics
    from xpulaunch.processes.signals import forwarding

    # The model and the binary first: a bad one is said before the host is probed or a lock
    # directory is read.
    prepared = prepare_llama(request.llama, parent_env)
    inventory = load_or_probe(request.inventory, parent_env)
    command = ["xpulaunch", "llama", "-m", str(request.llama.model)]
    plan, lease = lease_plan(
        prepared,
        inventory,
        parent_env,
        _leases(request, parent_env),
        command=command,
        options=request.leases,
        on_wait=ui.on_wait,
    )
    with lease:
        counters = JobCounters()
        server = server_for(
            plan,
            lease,
            parent_env,
            owns_lease=False,
            health=request.health,
            policy=request.policy,
            grace_s=request.grace_s,
            logs=request.logs,
            on_ready=lambda replica: ui.on_ready(plan, replica),
            on_event=counters.on_event,
        )
        metrics = serving_metrics(
            server,
            plan,
            str(request.llama.model),
            host=request.metrics_host,
            port=request.metrics_port,
            counters=counters,
        )
        with metrics, forwarding(server.send_stop_signal):
            server.start()
            status = server.wait()
    return 1 if status is None else status


def _leases(request: LlamaRunRequest, parent_env: Mapping[str, str]) -> LeaseManager:
    from xpulaunch.leases.manager import LeaseManager

    return LeaseManager(request.leases.lock_dir, env=parent_env)


def load_or_probe(path: str | None, parent_env: Mapping[str, str]) -> Inventory:
    """The ``--inventory`` file's devices, else this host's."""
    if path:
        from xpulaunch.launch.plan import load_inventory

        return load_inventory(path)
    # Forked, before any thread starts: NVML's memory never becomes the long-lived server's.
    from xpulaunch.probing.isolated import probe_isolated

    return probe_isolated(parent_env)
