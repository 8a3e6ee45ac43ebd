"""``--rdzv-backend c10d``: this node's plan turned into one torchrun elastic agent.

torch's own agent (``python -m torch.distributed.run``) is the per-node engine of an elastic
job: it runs the c10d rendezvous rounds, starts this node's workers with the ranks of each
round, restarts every node's workers when one fails, and admits nodes joining up to MAX. We
plan the devices, hold the leases, set the visibility variables, and supervise the agent as
the job's one process (its workers inherit the job marker, so cleanup finds them). The rank
variables are the agent's to set, so they leave the plan. docs/DECISIONS.md says why.
"""

from __future__ import annotations

import dataclasses

from xpulaunch.core.nodes import ElasticSpec
from xpulaunch.errors import UsageError
from xpulaunch.model import MAX_RESTARTS_VAR, Plan, WorkerPlan

AGENT_NAME = "agent"
# What the agent writes into each worker, per round.
AGENT_VARS = frozenset({
    "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE",
    "ROLE_NAME", "ROLE_RANK", "ROLE_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", MAX_RESTARTS_VAR,
})  # fmt: skip
# torch's switch (dynamic_rendezvous.py) from the agent's store to one per round.
DISABLE_SHARED_STORE = "TORCH_DISABLE_SHARE_RDZV_TCP_STORE"
# torchrun's --max-restarts has no "unlimited"; this many is as good as none.
UNLIMITED_RESTARTS = 1_000_000


def agent_plan(
    plan: Plan,
    spec: ElasticSpec,
    *,
    python: str,
    max_restarts: int | None,
    join_timeout_s: float,
) -> Plan:
    """``plan`` (this node's workers) as one torchrun agent running them under ``spec``."""
    if plan.isolate:
        raise UsageError(
            "--isolate with --rdzv-backend c10d: torch's agent gives every worker the same "
            "devices; drop --isolate"
        )
    first = plan.workers[0]
    env = {name: value for name, value in first.env.items() if name not in AGENT_VARS}
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
        ),
        env=env,
        units=tuple(range(len(plan.devices))),
    )
    note = (
        f"c10d rendezvous at {spec.endpoint} (run id {spec.run_id}), {spec.min_nodes}:"
        f"{spec.max_nodes} nodes: torch's elastic agent runs this node's {len(plan.workers)} "
        "worker(s) and sets their ranks at every round"
    )
    return dataclasses.replace(plan, workers=(agent,), notes=(*plan.notes, note))


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
) -> tuple[str, ...]:
    """``python -m torch.distributed.run`` with the job's options, then the program."""
    restarts = UNLIMITED_RESTARTS if max_restarts is None else max_restarts
    options = [
        python, "-m", "torch.distributed.run",
        "--nnodes", f"{spec.min_nodes}:{spec.max_nodes}",
        "--nproc-per-node", str(nproc),
        "--rdzv-backend", "c10d",
        "--rdzv-endpoint", spec.endpoint,
        "--rdzv-id", spec.run_id,
        "--max-restarts", str(restarts),
    ]  # fmt: skip
    if join_timeout_s > 0:
        options += ["--rdzv-conf", f"join_timeout={join_timeout_s:g}"]
    if program[0] == python and len(program) > 1 and not program[1].startswith("-"):
        return (*options, *program[1:])  # a script run by this Python: the agent's default
    return (*options, "--no-python", *program)
