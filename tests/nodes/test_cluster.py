"""``--nnodes auto``: recorded scheduler environments -> this node's place in the job."""

from __future__ import annotations

import pytest

from xpulaunch.errors import UsageError
from xpulaunch.model import NodeGroup
from xpulaunch.nodes.cluster import ClusterJob, find_cluster, slurm_port
from xpulaunch.nodes.settings import NO_CLUSTER, NodeRequest, resolve_nodes


def detect(env: dict[str, str]) -> ClusterJob:
    """The job found in ``env`` (the tests below each set one up)."""
    found = find_cluster(env)
    assert found is not None
    return found


# What `srun --nodes=4 --ntasks-per-node=1 env` prints on the third node (job 48213),
# cut to the variables read.
SLURM_SRUN = {
    "SLURM_JOB_ID": "48213",
    "SLURM_NNODES": "4",
    "SLURM_JOB_NODELIST": "gpu-a[1-2],gpu-b[07-08]",
    "SLURM_STEP_ID": "0",
    "SLURM_STEP_NUM_NODES": "4",
    "SLURM_STEP_NUM_TASKS": "4",
    "SLURM_STEP_NODELIST": "gpu-a[1-2],gpu-b[07-08]",
    "SLURM_NODEID": "2",
    "SLURM_PROCID": "2",
    "SLURM_STEP_GPUS": "0,1",
    "CUDA_VISIBLE_DEVICES": "0,1",
}
# A Kubeflow PyTorchJob worker pod (training-operator), replicas: 1 master + 2 workers.
KUBEFLOW = {
    "PET_NNODES": "3",
    "PET_NODE_RANK": "1",
    "PET_MASTER_ADDR": "job-master-0",
    "PET_MASTER_PORT": "23456",
    "MASTER_ADDR": "job-master-0",
    "MASTER_PORT": "23456",
    "WORLD_SIZE": "3",
    "RANK": "1",
}
OPENMPI = {"OMPI_COMM_WORLD_SIZE": "2", "OMPI_COMM_WORLD_RANK": "1", "MASTER_ADDR": "head"}
PMI = {"PMI_SIZE": "2", "PMI_RANK": "0"}


def test_slurm_srun_one_task_per_node() -> None:
    assert detect(SLURM_SRUN) == ClusterJob(
        source="slurm",
        nnodes=4,
        node_rank=2,
        master_addr="gpu-a1",
        master_port=slurm_port(48213),
        hosts=("gpu-a1", "gpu-a2", "gpu-b07", "gpu-b08"),
    )


def test_slurm_master_variables_win() -> None:
    job = detect({**SLURM_SRUN, "MASTER_ADDR": "ib-a1", "MASTER_PORT": "29400"})
    assert (job.master_addr, job.master_port) == ("ib-a1", 29400)


def test_slurm_port_is_the_same_for_every_node_and_in_range() -> None:
    assert slurm_port(48213) == 28213
    assert all(20000 <= slurm_port(j) < 30000 for j in (0, 9999, 10000, 123456789))


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"SLURM_STEP_NUM_TASKS": "8"}, "srun --ntasks-per-node=1"),
        ({"SLURM_STEP_NODELIST": "gpu-a[1-3]"}, "names 3 host(s)"),
        ({"SLURM_NODEID": "4"}, "node 4 of 4"),
        ({"SLURM_NODEID": "two"}, "SLURM_NODEID='two'"),
    ],
)
def test_slurm_mistakes_are_one_line(change: dict[str, str], message: str) -> None:
    with pytest.raises(UsageError) as caught:
        detect({**SLURM_SRUN, **change})
    assert message in str(caught.value)


def test_slurm_batch_script_of_several_nodes_is_refused() -> None:
    batch = {k: v for k, v in SLURM_SRUN.items() if not k.startswith("SLURM_STEP")}
    with pytest.raises(UsageError, match="batch script"):
        detect(batch)


def test_slurm_single_node_batch_script_is_one_node() -> None:
    job = detect({"SLURM_JOB_ID": "7", "SLURM_NNODES": "1", "SLURM_NODEID": "0",
                          "SLURM_JOB_NODELIST": "gpu-a1"})  # fmt: skip
    assert (job.nnodes, job.node_rank, job.master_addr) == (1, 0, "gpu-a1")


def test_kubeflow_pytorchjob() -> None:
    assert detect(KUBEFLOW) == ClusterJob("kubeflow", 3, 1, "job-master-0", 23456)


def test_kubeflow_elastic_size_is_refused() -> None:
    with pytest.raises(UsageError, match="PET_NNODES=1:3"):
        detect({**KUBEFLOW, "PET_NNODES": "1:3"})


def test_openmpi_and_pmi() -> None:
    assert detect(OPENMPI) == ClusterJob("openmpi", 2, 1, "head", None)
    assert detect(PMI) == ClusterJob("pmi", 2, 0, None, None)


def test_nothing_detected_is_one_node_that_says_so() -> None:
    assert find_cluster({"HOME": "/root"}) is None
    got = resolve_nodes(NodeRequest(nnodes="auto"), {"HOME": "/root"})
    assert (got.nodes.nnodes, got.nodes.node_rank, got.nodes.source) == (1, 0, NO_CLUSTER)


def test_resolve_auto_uses_the_cluster_and_the_command_line_wins() -> None:
    got = resolve_nodes(NodeRequest(nnodes="auto"), SLURM_SRUN)
    assert got.nodes == NodeGroup(4, 2, "slurm", ("gpu-a1", "gpu-a2", "gpu-b07", "gpu-b08"))
    assert (got.master_addr, got.master_port) == ("gpu-a1", 28213)
    mine = resolve_nodes(NodeRequest(nnodes="auto", master_addr="10.0.0.1"), SLURM_SRUN)
    assert mine.master_addr == "10.0.0.1"


def test_resolve_auto_without_a_cluster_is_this_one_node() -> None:
    got = resolve_nodes(NodeRequest(nnodes="auto"), {"HOME": "/root", "MASTER_PORT": "9"})
    assert (got.nodes, got.master_addr, got.master_port) == (
        NodeGroup(source="none"),
        "127.0.0.1",
        None,
    )


def test_resolve_auto_mpi_needs_an_address() -> None:
    with pytest.raises(UsageError, match="openmpi names no node 0 address"):
        resolve_nodes(NodeRequest(nnodes="auto"), {**OPENMPI, "MASTER_ADDR": ""})
    assert resolve_nodes(NodeRequest(nnodes="auto"), OPENMPI).master_port == 29500


@pytest.mark.parametrize(
    ("request_", "env", "expected"),
    [
        (NodeRequest(), {"MASTER_PORT": "1"}, (NodeGroup(), "127.0.0.1", None)),
        (NodeRequest(nnodes="2", node_rank=1), {}, (NodeGroup(2, 1), "127.0.0.1", 29500)),
        (NodeRequest(nnodes="2:2"), {"MASTER_ADDR": "h0"}, (NodeGroup(2, 0), "h0", 29500)),
        (NodeRequest(nnodes="2", rdzv_endpoint="h0:1234"), {}, (NodeGroup(2, 0), "h0", 1234)),
        (
            NodeRequest(nnodes="3", node_rank=2, master_port=7),
            {},
            (NodeGroup(3, 2), "127.0.0.1", 7),
        ),
    ],
)
def test_resolve_static(
    request_: NodeRequest, env: dict[str, str], expected: tuple[NodeGroup, str, int | None]
) -> None:
    got = resolve_nodes(request_, env)
    assert (got.nodes, got.master_addr, got.master_port) == expected


@pytest.mark.parametrize(
    ("request_", "message"),
    [
        (NodeRequest(nnodes="2", node_rank=2), "--node-rank 2: expected 0 to 1"),
        (NodeRequest(nnodes="0"), "--nnodes '0'"),
        (NodeRequest(nnodes="two"), "expected N, MIN:MAX or auto"),
        (NodeRequest(nnodes="1:3"), "needs --rdzv-backend c10d"),
        (NodeRequest(nnodes="auto", node_rank=1), "comes from the cluster"),
        (NodeRequest(rdzv_backend="etcd"), "--rdzv-backend etcd"),
        (NodeRequest(rdzv_endpoint="nohost"), "expected HOST:PORT"),
        (NodeRequest(rdzv_endpoint="h:1", master_port=2), "not both"),
    ],
)
def test_resolve_mistakes(request_: NodeRequest, message: str) -> None:
    with pytest.raises(UsageError) as caught:
        resolve_nodes(request_, {})
    assert message in str(caught.value)
