"""``--rdzv-backend c10d``: this node's plan turned into one torchrun elastic agent.

torch's own agent (``python -m torch.distributed.run``) is the per-node engine of an elastic
job: it runs the c10d rendezvous rounds, starts this node's workers with the ranks of each
round, restarts every node's workers when one fails, and admits nodes joining up to MAX. We
plan the devices, hold the leases, set the visibility variables, and supervise the agent as
the job's one process (its workers inherit the job marker, so cleanup finds them). The rank
variables are the agent's to set, so they leave the plan. The agent runs through
:mod:`xpulaunch.integrations.torch_agent`, which adds a line of ours for every rendezvous
round. docs/DECISIONS.md says why.
"""

from __future__ import annotations

import dataclasses
import math

from xpulaunch.errors import UsageError
from xpulaunch.model import MAX_RESTARTS_VAR, Plan, WorkerPlan
from xpulaunch.nodes.settings import ElasticSpec

AGENT_NAME = "agent"
# What the agent writes into each worker, per round.
AGENT_VARS = frozenset(
    {
        "RANK",
        "LOCAL_RANK",
        "WORLD_SIZE",
        "LOCAL_WORLD_SIZE",
        "GROUP_RANK",
        "GROUP_WORLD_SIZE",
        "ROLE_NAME",
        "ROLE_RANK",
        "ROLE_WORLD_SIZE",
        "MASTER_ADDR",
        "MASTER_PORT",
        MAX_RESTARTS_VAR,
        "TORCHELASTIC_RUN_ID",
    }
)
# torch's switch (dynamic_rendezvous.py) from the agent's store to one per round.
DISABLE_SHARED_STORE = "TORCH_DISABLE_SHARE_RDZV_TCP_STORE"
# torchrun's --max-restarts has no "unlimited"; this many is as good as none.
UNLIMITED_RESTARTS = 1_000_000
# torch's agent, with a line of ours for every rendezvous round (it imports torch; we never do).
AGENT_MODULE = "xpulaunch.integrations.torch_agent"
# torchrun's Std.ALL for --redirects and --tee: both streams of every worker in its files,
# and on the console too.
ALL_STREAMS = "3"


def agent_plan(
    plan: Plan,
    spec: ElasticSpec,
    *,
    python: str,
    max_restarts: int | None,
    join_timeout_s: float,
    rdzv_conf: tuple[tuple[str, str], ...] = (),
    log_dir: str | None = None,
    local_ranks: str | None = None,
) -> Plan:
    """``plan`` (this node's workers) as one torchrun agent running them under ``spec``.

    ``rdzv_conf``: torch's rendezvous settings (:func:`parse_rdzv_conf`) besides the join
    timeout; ``log_dir``: where the agent writes torchrun's log layout; ``local_ranks``: the
    workers its console shows (:func:`local_ranks_filter`)."""
    if plan.isolate:
        raise UsageError(
            "--isolate with --rdzv-backend c10d: torch's agent gives every worker the same "
            "devices; drop --isolate"
        )
    first = plan.workers[0]
    env = {name: value for name, value in first.env.items() if name not in AGENT_VARS}
    notes: tuple[str, ...] = ()
    device_map = plan.device_map
    if len(plan.workers) > 1 and plan.devices:
        # The agent gives its workers one environment, so no worker's own device map (each
        # is for the device its LOCAL_RANK picks): none, rather than rank 0's for every rank.
        env.update(XPULAUNCH_DEVICE_MAP=None, XPULAUNCH_MAX_MEMORY=None)
        device_map = None
        notes = (
            "no device map: torch's agent starts the workers with one environment; place "
            "each worker's model on the device its LOCAL_RANK picks",
        )
    if may_restart(spec, max_restarts):
        env[DISABLE_SHARED_STORE] = "1"
    agent = WorkerPlan(
        name=AGENT_NAME,
        rank=0,
        local_rank=0,
        argv=agent_argv(
            first.argv,
            len(plan.workers),
            spec,
            python=python,
            max_restarts=max_restarts,
            join_timeout_s=join_timeout_s,
            rdzv_conf=rdzv_conf,
            log_dir=log_dir,
            local_ranks=local_ranks,
        ),
        env=env,
        units=tuple(range(len(plan.devices))),
    )
    note = (
        f"c10d rendezvous at {spec.endpoint} (run id {spec.run_id}), {spec.min_nodes}:"
        f"{spec.max_nodes} nodes: torch's elastic agent runs this node's {len(plan.workers)} "
        "worker(s) and sets their ranks at every round"
    )
    return dataclasses.replace(
        plan, workers=(agent,), device_map=device_map, notes=(*plan.notes, *notes, note)
    )


def may_restart(spec: ElasticSpec, max_restarts: int | None) -> bool:
    """Whether the agent may start this node's workers a second time: a restart, or a node
    joining below MAX (torch restarts every node into that round without spending one).

    Only then do the workers need a fresh TCPStore per round from their rank 0 instead of the
    agent's store, which outlives the rounds: with it, a gloo worker of a restarted round read
    the addresses that the dead workers of the last round had published, and failed to
    connect. With MIN == MAX and no restarts there is one round (a node that comes to a full
    job waits in torch's redundancy list; a node that dies fails the others' next collective,
    which ends the job), so it keeps torch's default, the agent's store, up before any worker
    starts: a worker's own store is up only once its rank 0 has imported torch, and a rank
    that connects earlier is refused and waits out the TCPStore client's retry delay.
    """
    return max_restarts != 0 or spec.min_nodes != spec.max_nodes


def agent_argv(
    program: tuple[str, ...],
    nproc: int,
    spec: ElasticSpec,
    *,
    python: str,
    max_restarts: int | None,
    join_timeout_s: float,
    rdzv_conf: tuple[tuple[str, str], ...] = (),
    log_dir: str | None = None,
    local_ranks: str | None = None,
) -> tuple[str, ...]:
    """torchrun's agent (through :data:`AGENT_MODULE`) with the job's options, then the
    program. ``join_timeout_s`` is rounded up to whole seconds, which torch reads."""
    restarts = UNLIMITED_RESTARTS if max_restarts is None else max_restarts
    options = [
        python,
        "-m",
        AGENT_MODULE,
        "--nnodes",
        f"{spec.min_nodes}:{spec.max_nodes}",
        "--nproc-per-node",
        str(nproc),
        "--rdzv-backend",
        "c10d",
        "--rdzv-endpoint",
        spec.endpoint,
        "--rdzv-id",
        spec.run_id,
        "--max-restarts",
        str(restarts),
    ]
    settings = [f"{key}={value}" for key, value in rdzv_conf if key != "join_timeout"]
    if join_timeout_s > 0:
        settings.insert(0, f"join_timeout={math.ceil(join_timeout_s)}")
    if settings:
        options += ["--rdzv-conf", ",".join(settings)]
    if log_dir is not None:  # torchrun's layout, by the agent; the console still shows all
        options += ["--log-dir", log_dir, "--redirects", ALL_STREAMS, "--tee", ALL_STREAMS]
    if local_ranks is not None:
        options += ["--local-ranks-filter", local_ranks]
    script = program[2:] if program[1:2] == ("-u",) else program[1:]  # the agent adds -u
    if program[0] == python and script and not script[0].startswith("-"):
        return (*options, *script)  # a script run by this Python: the agent's default
    return (*options, "--no-python", *program)


def local_ranks_filter(text: str, option: str = "--ranks") -> str:
    """``--ranks 0,2`` as torchrun's ``--local-ranks-filter``: the agent's workers are named
    by local rank, and only the agent can filter its workers' console lines."""
    ranks = [part.strip() for part in text.split(",") if part.strip()]
    if not ranks or not all(rank.isascii() and rank.isdigit() for rank in ranks):
        raise UsageError(
            f"{option} {text}: with --rdzv-backend c10d, expected local ranks such as 0,2"
        )
    return ",".join(ranks)
