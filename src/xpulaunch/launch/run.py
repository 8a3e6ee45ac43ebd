"""The one orchestrator of a run: a :class:`~xpulaunch.launch.request.RunRequest` -> this
node's place in the job -> the probe (a forked child) -> plan and lease (atomically) -> the
nodes' meeting -> supervise until the job is over. No click, no printing: what a user should
read goes to the caller's :class:`RunUI`, and the job's own lines through the supervisor's
console.

The exit status is 0, the first failing worker's status, or 128 + N when stopped by signal N.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Protocol

from xpulaunch.core.plan import skipped_text
from xpulaunch.errors import NODES_FAILED_STATUS, UsageError, XpulaunchError
from xpulaunch.joblog.console import Reporter
from xpulaunch.joblog.logs import LogConfig, LogLayout, make_log_dir, make_run_log_dir
from xpulaunch.launch import plan as planning
from xpulaunch.launch.operations import LeaseEvents, Operations, open_events
from xpulaunch.model import Backend
from xpulaunch.nodes.settings import NodeSettings, resolve_nodes
from xpulaunch.processes import records
from xpulaunch.processes.cgroup import check_cgroup_setting
from xpulaunch.processes.program import resolve_program
from xpulaunch.processes.signals import RELAYED, forwarding
from xpulaunch.supervisor.restart import RestartMode
from xpulaunch.supervisor.spec import SupervisorSettings, WorkerSpec
from xpulaunch.supervisor.supervisor import Supervisor

if TYPE_CHECKING:
    from xpulaunch.events import Event
    from xpulaunch.joblog.event_stream import EventStream
    from xpulaunch.launch.request import RunRequest
    from xpulaunch.leases.manager import Lease
    from xpulaunch.leases.wait_queue import WaitStatus
    from xpulaunch.model import Inventory, Plan
    from xpulaunch.nodes.link import Meeting
    from xpulaunch.probing.isolated import ForkedProbe


class RunUI(Protocol):
    """What a run tells its caller before the workers speak: one-line messages, and the state
    of a wait in line for devices."""

    def say(self, text: str) -> None: ...

    def on_wait(self, status: WaitStatus) -> None: ...


def node_settings(
    request: RunRequest, env: Mapping[str, str], say: Callable[[str], None]
) -> NodeSettings:
    """Where this node stands in the job (one node unless asked otherwise). Slurm's own
    ``scontrol`` checks a host list only where it is needed."""
    if (request.nodes.nnodes or "").strip().lower() == "auto":
        from xpulaunch.nodes.slurm import checked_expander

        return resolve_nodes(request.nodes, env, checked_expander(env, say))
    return resolve_nodes(request.nodes, env)


def job_plan(
    request: RunRequest,
    nodes: NodeSettings,
    inventory: Inventory | str | None,
    env: Mapping[str, str],
    unavailable: Mapping[str, str] | None,
    *,
    must_exist: bool = True,
) -> Plan:
    """This node's plan. Under c10d it is torch's elastic agent, one worker that runs the
    planned workers through torch's rendezvous (:mod:`xpulaunch.nodes.elastic`)."""
    resolved = resolve_program(request.program, must_exist=must_exist)  # on this PATH
    port = planning.master_port_for(nodes.master_port, nodes.master_addr, nodes.nodes)
    notes = (*([resolved.note] if resolved.note else []), *request.notes)
    plan = planning.plan_launch(
        request.launch_request(resolved.argv, nodes, port),
        planning.inventory_of(inventory, env),
        env,
        unavailable=unavailable,
        notes=notes,
    )
    if nodes.elastic is None:
        return plan
    from xpulaunch.nodes.elastic import agent_plan, local_ranks_filter

    return agent_plan(
        plan,
        nodes.elastic,
        python=sys.executable,
        max_restarts=request.restart_limit,
        join_timeout_s=request.join_timeout_s,
        rdzv_conf=request.rdzv_conf,
        log_dir=request.log_dir if _agent_writes_logs(request) else None,
        local_ranks=local_ranks_filter(",".join(sorted(request.ranks))) if request.ranks else None,
    )


def _agent_writes_logs(request: RunRequest) -> bool:
    """Under c10d, ``--log-dir`` in torchrun's layout is written by torch's agent (a run
    directory, an attempt per restart, a folder per local rank with error.json); our own
    layout stays ours (the agent's output, the workers' lines included, in
    ``attempt_N/agent.log``)."""
    return request.log_layout is LogLayout.TORCHRUN and request.log_dir is not None


def supervised(request: RunRequest, nodes: NodeSettings) -> RunRequest:
    """What our supervisor does of the request. Under c10d the workers are the agent's
    children and restarts are the agent's (ours would restart the agent too); ``--ranks``
    becomes torchrun's ``--local-ranks-filter`` of the agent, and a torchrun-layout log
    directory the agent's."""
    if nodes.elastic is None:
        return request
    log_dir = None if _agent_writes_logs(request) else request.log_dir
    return replace(request, restart=RestartMode.NO, max_restarts=None, ranks=None, log_dir=log_dir)


def dry_run(request: RunRequest, env: Mapping[str, str], say: Callable[[str], None]) -> Plan:
    """The plan a real run would make now, refusing what it would refuse (:func:`refuse_early`,
    and this host's leases, also with an ``--inventory``, as the real run reads them); reserves
    nothing. As in a real run, a plan that leases nothing (the CPU) never reads the lock
    directory."""
    nodes = node_settings(request, env, say)
    refuse_early(request, nodes, env)
    from xpulaunch.leases.manager import LeaseManager

    inventory = request.inventory or planning.probe(env)
    if isinstance(inventory, str):  # read once, as the real run does
        inventory = planning.load_inventory(inventory)
    plan = LeaseManager(request.lock_dir, env=env).preview(
        lambda held: job_plan(request, nodes, inventory, env, held, must_exist=False),
        request.share,
        shared=request.shared,
        wait=request.wait,
    )
    check_ranks(supervised(request, nodes).ranks, [w.name for w in plan.workers])
    return plan


def run(
    request: RunRequest, env: Mapping[str, str], ui: RunUI, *, probe: ForkedProbe | None = None
) -> int:
    """Lease devices and run the job until it is over; its exit status. ``probe``: one
    already forked for ``env`` (the command line forks it once parsed, so that it probes
    while the supervisor is imported); else one is forked here."""
    nodes = node_settings(request, env, ui.say)
    refuse_early(request, nodes, env)  # before anything is leased or said
    ours = supervised(request, nodes)
    # The probe runs in a forked child, outside the allocation lock (only planning runs under
    # it): NVML's memory never becomes the supervisor's, and it probes while this process
    # checks the log directory.
    probing = probe
    if probing is None and request.inventory is None:
        from xpulaunch.probing.isolated import ForkedProbe

        probing = ForkedProbe(dict(env))
    with probing or contextlib.nullcontext():
        make_log_dir(request.log_dir)  # a bad one fails in one line before anything is leased
        inventory = probing.result() if probing is not None else request.inventory
    events = open_events(request.events)
    with contextlib.ExitStack() as done:
        if events is not None:
            done.callback(events.close)
        lease_events = LeaseEvents(events, ui.on_wait)
        done.callback(lease_events.released)  # after the lease is released, before close
        plan, lease = _allocate(request, nodes, inventory, env, lease_events)
        done.enter_context(lease)
        # Checked before the summary line: a mistake prints one line, not a start and an error.
        check_ranks(ours.ranks, [w.name for w in plan.workers])
        ui.say(summary(plan))
        for warning in plan_warnings(plan):
            ui.say(warning)
        status = supervise(
            plan,
            ours,
            env,
            lease_fds=lease.fds,
            job_id=lease.job_id,
            release_leases=True,
            events=events,
            earlier_events=lease_events.got(plan, lease),
            meeting=_meeting(plan, nodes, request.join_timeout_s),
        )
    return status


def refuse_early(request: RunRequest, nodes: NodeSettings, env: Mapping[str, str]) -> None:
    """What a real run refuses before it starts anything, refused by its dry run the same way:
    the ``XPULAUNCH_CGROUP`` setting, then :func:`xpulaunch.launch.preflight.preflight` (torch
    for c10d, the ``--log-dir`` and ``--events`` paths), whose module a plain run never loads."""
    check_cgroup_setting(env)
    events_file = request.events is not None and request.events != "-"
    if nodes.elastic is not None or request.log_dir is not None or events_file:
        from xpulaunch.launch.preflight import preflight

        preflight(request, nodes)


def _allocate(
    request: RunRequest,
    nodes: NodeSettings,
    inventory: Inventory | str | None,
    env: Mapping[str, str],
    lease_events: LeaseEvents,
) -> tuple[Plan, Lease]:
    """Plan and lease atomically, waiting in line when asked to."""
    from xpulaunch.leases.manager import LeaseManager

    if isinstance(inventory, str):  # read once, not at every try of a wait in line
        inventory = planning.load_inventory(inventory)
    return LeaseManager(request.lock_dir, env=env).allocate(
        lambda unavailable: job_plan(request, nodes, inventory, env, unavailable),
        shared=request.shared,
        wait=request.wait,
        wait_timeout_s=request.wait_timeout_s,
        on_wait=lease_events.on_wait,
        command=["xpulaunch", *request.program],
        share=request.share,
    )


def _meeting(plan: Plan, nodes: NodeSettings, timeout_s: float) -> Meeting | None:
    """With several static nodes, how they meet (bounded) before the workers start and
    before every restart (:mod:`xpulaunch.nodes.member`). None for one node, and for c10d,
    whose plan is one agent on one node as far as our supervisor sees."""
    if plan.nodes.nnodes < 2:
        return None
    from xpulaunch.nodes.link import Meeting

    port = nodes.master_port
    assert port is not None  # several static nodes always name the master's port
    return Meeting(
        plan.nodes.nnodes,
        plan.nodes.node_rank,
        nodes.master_addr,
        port,
        timeout_s,
        nproc=len(plan.workers),
        note=skipped_text(plan.notes),
    )


def summary(plan: Plan) -> str:
    """One line before the workers start: where they run, and why on the CPU; on a node of
    several, which node, and which devices it skipped (``node 1 of 2: nvidia on nvidia 2;
    1 worker (nvidia 3 busy)``: the reason a node runs fewer workers than the others)."""
    workers = f"{len(plan.workers)} worker{'s' if len(plan.workers) != 1 else ''}"
    node = ""
    if plan.nodes.nnodes > 1:
        node = f"node {plan.nodes.node_rank} of {plan.nodes.nnodes}: "
        skipped = skipped_text(plan.notes)
        workers += f" ({skipped})" if skipped else ""
    if plan.devices:
        where = ", ".join(u.label() for u in plan.devices)
        return f"{node}{plan.backend.value} on {where}; {workers}"
    why = next((n for n in plan.notes if "CPU" in n), "running on the CPU")
    return f"{node}cpu: {why}; {workers}"


def plan_warnings(plan: Plan) -> list[str]:
    """The plan's warnings (a busy GPU used because a scheduler allocated it, a known
    driver issue), for the console before the workers start."""
    return [note for note in plan.notes if note.startswith("warning: ")]


def supervise(
    plan: Plan,
    request: RunRequest,
    env: Mapping[str, str],
    *,
    lease_fds: tuple[int, ...] = (),
    job_id: str | None = None,
    release_leases: bool = False,
    events: EventStream | None = None,
    earlier_events: Sequence[Event] = (),
    meeting: Meeting | None = None,
) -> int:
    """Run every worker of ``plan`` as ``request`` says (its supervision fields; the plan is
    made); block until the job is over.

    ``lease_fds`` go to every worker and the guardian; with ``release_leases`` they are
    unlocked as soon as every process of the job is gone; ``job_id`` (the lease's) becomes
    the workers' ``XPULAUNCH_JOB_ID``.
    ``events``: an open stream (the caller's, left open); ``earlier_events`` (the lease's,
    already written there) reach the summary and metrics. ``meeting``: this node's part in a
    static job of several nodes; the nodes meet before the first start and before every gang
    restart."""
    specs = specs_for_plan(plan, env, cwd=request.cwd, lease_fds=lease_fds)
    check_ranks(request.ranks, [s.name for s in specs])
    policy = request.policy(plan.isolate)
    # Waiting for GPU memory and for the other nodes matters only before a restart.
    restarts = policy.mode is not RestartMode.NO
    gpus = None
    if restarts and plan.backend is Backend.CUDA:
        from xpulaunch.launch.gpu_settle import gpu_settle

        gpus = gpu_settle(plan)
    log_dir = make_run_log_dir(
        make_log_dir(request.log_dir), request.log_layout, request.log_run_id
    )
    settings = SupervisorSettings(
        policy=policy,
        grace_s=request.grace_s,
        logs=LogConfig(
            log_dir=log_dir,
            layout=request.log_layout,
            console_names=request.ranks,
            color=_colour(request.color, env),
        ),
        lease_fds=lease_fds,
        release_leases=release_leases,
        record_dir=records.runtime_dir(env),
        job_id=job_id,
        hang_timeout_s=request.hang_timeout_s,
        heartbeat=request.heartbeat,
        max_runtime_s=request.max_runtime_s,
    )
    reporter = Reporter()
    listeners: list[Callable[[Event], None]] = [reporter.on_event]

    def say(text: str) -> None:  # the nodes speak once the supervisor below exists
        supervisor.message(text)

    def fail(why: str, status: int) -> None:  # another node failed: so do this node's workers
        supervisor.fail(why, status)

    def on_event(event: Event) -> None:  # the listeners grow once the operations exist
        for listen in listeners:
            listen(event)

    node = None
    if meeting is not None:  # a static job of several nodes (xpulaunch.nodes.job)
        from xpulaunch.nodes.job import NodeJob

        # Another node's failure fails this node's workers only when they restart as one gang
        # (with --isolate they are independent, on every node).
        node = NodeJob(meeting, say, fail if policy.gang else None)
        specs = node.ranked(specs, plan)
    settle = node.settle(gpus) if node is not None and restarts and policy.gang else gpus
    supervisor = Supervisor(specs, settings, on_event=on_event, settle=settle)
    reporter.supervisor = supervisor
    status: int | None = NODES_FAILED_STATUS  # what the other nodes hear if this one fails
    try:
        if node is not None:
            plan = node.meet(plan, env)
            listeners.append(node.on_event)
        with Operations(plan, replace(request, log_dir=log_dir), supervisor, events) as ops:
            listeners.extend(ops.listeners)
            for event in earlier_events:
                ops.replay(event)
            # A signal handler must take no lock (it may interrupt code holding one on this
            # same thread), so it only posts; the loop reports it as an event.
            with (
                forwarding(supervisor.send_stop_signal),
                forwarding(supervisor.send_signal, RELAYED),
            ):
                supervisor.start()
                status = supervisor.wait()
    except XpulaunchError as exc:
        status = exc.exit_code
        raise
    finally:
        if node is not None:
            node.close(1 if status is None else status)
    for note in gpus.notes if gpus is not None else ():
        supervisor.message(note)
    return 1 if status is None else status


def specs_for_plan(
    plan: Plan,
    parent_env: Mapping[str, str],
    *,
    cwd: str | None = None,
    lease_fds: tuple[int, ...] = (),
) -> list[WorkerSpec]:
    """One spec per planned worker: its complete environment, and its program resolved and
    checked with that environment's ``PATH`` before anything starts (a one-line
    :class:`~xpulaunch.errors.LaunchError` otherwise)."""
    specs = []
    for worker in plan.workers:
        env = worker.child_env(parent_env)
        argv = resolve_program(worker.argv, env=env, cwd=cwd, python_scripts=False).argv
        specs.append(WorkerSpec(worker.name, argv, env, cwd=cwd, pass_fds=lease_fds))
    return specs


def check_ranks(ranks: frozenset[str] | None, names: list[str]) -> None:
    """``--ranks`` names only workers that exist (a one-line UsageError otherwise)."""
    unknown = sorted((ranks or frozenset()) - set(names))
    if unknown:
        raise UsageError(
            f"--ranks {','.join(unknown)}: no such worker; the workers are {','.join(names)}"
        )


def _colour(choice: bool | None, parent_env: Mapping[str, str]) -> bool:
    if choice is not None:
        return choice
    return not parent_env.get("NO_COLOR") and _isatty(sys.stdout) and _isatty(sys.stderr)


def _isatty(stream: object) -> bool:
    """A closed stream (a daemon started with ``>&-``) is None: not a terminal."""
    isatty = getattr(stream, "isatty", None)
    try:
        return bool(isatty()) if isatty is not None else False
    except ValueError:  # closed
        return False
