"""``agent_plan``: this node's plan as one torchrun agent (pure; no torch, no processes)."""

from __future__ import annotations

import pytest

from xpulaunch.core.elastic import AGENT_NAME, DISABLE_SHARED_STORE, agent_plan
from xpulaunch.core.nodes import ElasticSpec
from xpulaunch.errors import UsageError
from xpulaunch.model import Backend, Plan, WorkerPlan

PY = "/usr/bin/python3"


def node_plan(nproc: int = 2, *, isolate: bool = False) -> Plan:
    workers = tuple(
        WorkerPlan(str(i), i, i, (PY, "train.py", "--lr", "1"),
                   {"RANK": str(i), "LOCAL_RANK": str(i), "OMP_NUM_THREADS": "1"})
        for i in range(nproc)
    )  # fmt: skip
    return Plan(Backend.CPU, (), workers, None, isolate=isolate)


def spec(nnodes: str) -> ElasticSpec:
    low, _, high = nnodes.partition(":")
    return ElasticSpec(int(low), int(high or low), "10.0.0.1:29400", "job")


def agent(nnodes: str, max_restarts: int | None, *, isolate: bool = False) -> WorkerPlan:
    plan = agent_plan(node_plan(isolate=isolate), spec(nnodes), python=PY,
                      max_restarts=max_restarts, join_timeout_s=30)  # fmt: skip
    assert len(plan.workers) == 1
    return plan.workers[0]


def test_one_agent_runs_the_nodes_workers_with_torchruns_options() -> None:
    got = agent("1:2", 3)
    assert got.name == AGENT_NAME
    assert got.argv == (
        PY, "-m", "torch.distributed.run", "--nnodes", "1:2", "--nproc-per-node", "2",
        "--rdzv-backend", "c10d", "--rdzv-endpoint", "10.0.0.1:29400", "--rdzv-id", "job",
        "--max-restarts", "3", "--rdzv-conf", "join_timeout=30", "train.py", "--lr", "1",
    )  # fmt: skip
    assert "RANK" not in got.env and "LOCAL_RANK" not in got.env  # the agent's to set
    assert got.env["OMP_NUM_THREADS"] == "1"


@pytest.mark.parametrize(
    ("nnodes", "max_restarts", "fresh_store"),
    [
        ("2", 0, False),  # one round: torch's default, the agent's store
        ("2:2", 0, False),
        ("2", 1, True),  # a restart is a second round
        ("2", None, True),  # unlimited restarts
        ("1:2", 0, True),  # a node joining below MAX starts a new round without a restart
        ("2:3", 0, True),
    ],
)
def test_a_fresh_worker_store_per_round_only_where_a_second_round_can_come(
    nnodes: str, max_restarts: int | None, fresh_store: bool
) -> None:
    env = agent(nnodes, max_restarts).env
    assert (env.get(DISABLE_SHARED_STORE) == "1") is fresh_store


def test_isolate_is_refused_in_one_line() -> None:
    with pytest.raises(UsageError, match="--isolate with --rdzv-backend c10d"):
        agent("2", 0, isolate=True)
