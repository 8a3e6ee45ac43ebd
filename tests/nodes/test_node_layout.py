"""The pure side of several nodes: their messages, global ranks from every node's worker
count, devices handed out in index order, and ``--gpus auto`` under a scheduler's
allocation."""

from __future__ import annotations

from collections.abc import Mapping

import pytest

from xpulaunch.core import inventory as inventory_doc
from xpulaunch.core.plan import (
    LaunchRequest,
    elastic_env,
    make_plan,
    skipped_text,
    to_dict,
    with_layout,
)
from xpulaunch.core.selection import allocated_by
from xpulaunch.model import Inventory, NodeGroup, Plan
from xpulaunch.nodes.protocol import (
    PROTOCOL,
    Hello,
    Message,
    Verb,
    counts_text,
    read_hello,
    read_message,
)

GIB = 1024**3


def gpus(*used_gib: float, total_gib: float = 80) -> Inventory:
    """NVIDIA GPUs 0, 1, ... with this much memory in use each."""
    devices = [
        {"vendor": "nvidia", "index": i, "name": "H100", "pci_bus_id": f"0000:{i + 1:02x}:00.0",
         "uuid": f"GPU-0000000{i}-0000-0000-0000-000000000000", "integrated": False, "tiles": 1,
         "memory_total_bytes": int(total_gib * GIB), "memory_used_bytes": int(used * GIB),
         "utilization_percent": 0, "mig_devices": []}
        for i, used in enumerate(used_gib)
    ]  # fmt: skip
    return inventory_doc.from_dict({"schema": "xpulaunch.inventory/1", "devices": devices})


def plan_of(inventory: Inventory, env: Mapping[str, str] | None = None, **request: object) -> Plan:
    req = LaunchRequest(argv=("python3", "train.py"), master_port=29500, **request)  # type: ignore[arg-type]
    return make_plan(req, inventory, env or {})


# -- messages ------------------------------------------------------------------------------


def test_a_hello_says_rank_size_workers_and_why_so_few() -> None:
    hello = Hello(1, 2, 1, "nvidia 3 busy")
    assert hello.line() == f"{PROTOCOL} hello 1 2 1 nvidia 3 busy\n"
    assert read_hello(hello.line().strip(), 2) == hello


@pytest.mark.parametrize(
    ("line", "nnodes", "refusal"),
    [
        ("GET / HTTP/1.1", 2, "not an xpulaunch node (it said 'GET / HTTP/1.1')"),
        ("", 2, "not an xpulaunch node (it said '')"),
        ("xpulaunch-preflight/1 1 2", 2, "an xpulaunch node of another version"),
        (f"{PROTOCOL} hello 1 2", 2, "a garbled hello"),
        (f"{PROTOCOL} hello x 2 1", 2, "a garbled hello"),
        (f"{PROTOCOL} hello 1 2 0", 2, "a garbled hello"),
        (f"{PROTOCOL} hi 1 2 1", 2, "a garbled hello"),
        (f"{PROTOCOL} hello 1 3 1", 2, "node 0 runs --nnodes 2, this node --nnodes 3"),
        (f"{PROTOCOL} hello 0 2 1", 2, "--node-rank 0 is out of range 1-1 for --nnodes 2"),
        (f"{PROTOCOL} hello 2 2 1", 2, "--node-rank 2 is out of range 1-1"),
    ],
)
def test_hellos_node_0_refuses_say_why_in_one_phrase(line: str, nnodes: int, refusal: str) -> None:
    answer = read_hello(line, nnodes)
    assert isinstance(answer, str) and answer.startswith(refusal)
    assert "\n" not in answer


@pytest.mark.parametrize(
    "message",
    [
        Message(Verb.HERE),
        Message(Verb.READY),
        Message(Verb.GO, counts=(2, 1, 4)),
        Message(Verb.FAIL, "worker 3 exited with code 1", node=2),
        Message(Verb.BYE, node=1, status=125),
        Message(Verb.REFUSED, "node 0 gives up: node(s) 2 did not reach node 0"),
    ],
)
def test_messages_read_back_as_written(message: Message) -> None:
    assert read_message(message.line().strip(), 3) == message


@pytest.mark.parametrize(
    "line",
    ["go 2,1", "go 2,0,1", "go 2,x,1", "fail 3 boom", "bye 1", "bye 1 -1", "here now", "hello",
     "\x00\x01", "ready 2"],
)  # fmt: skip
def test_garbled_messages_are_none(line: str) -> None:
    assert read_message(line, 3) is None


def test_a_reason_from_a_worker_cannot_break_the_line() -> None:
    message = Message(Verb.FAIL, "boom\nfail 0 injected" + "x" * 400, node=1)
    line = message.line()
    assert line.count("\n") == 1 and len(line) < 200
    assert read_message(line.strip(), 2) is not None


def test_counts_text_names_each_node_only_when_they_differ() -> None:
    assert counts_text((2, 2)) == "4 workers in all"
    assert counts_text((2, 1)) == "3 workers in all (node 0: 2, node 1: 1)"
    assert counts_text((1,)) == "1 worker in all"


# -- ranks from every node's count -------------------------------------------------------


@pytest.mark.parametrize(
    ("counts", "node_rank", "ranks", "world"),
    [
        ((2, 1), 0, ["0", "1"], "3"),
        ((2, 1, 3), 2, ["3", "4", "5"], "6"),
        ((1, 2), 1, ["1", "2"], "3"),
        ((), 1, ["2", "3"], "4"),  # before the meeting: every node assumed to run 2
    ],
)
def test_global_ranks_are_prefix_sums_of_the_counts(
    counts: tuple[int, ...], node_rank: int, ranks: list[str], world: str
) -> None:
    nproc = len(ranks)
    nodes = NodeGroup(nnodes=max(len(counts), 2), node_rank=node_rank, counts=counts)
    plan = plan_of(gpus(), gpus="none", nproc_per_node=nproc, nodes=nodes)
    assert [w.env["RANK"] for w in plan.workers] == ranks
    assert [w.rank for w in plan.workers] == [int(r) for r in ranks]
    assert {w.env["WORLD_SIZE"] for w in plan.workers} == {world}
    assert {w.env["ROLE_WORLD_SIZE"] for w in plan.workers} == {world}
    assert {w.env["LOCAL_WORLD_SIZE"] for w in plan.workers} == {str(nproc)}


def test_the_plan_made_before_the_meeting_says_what_it_assumed_and_is_patched_after() -> None:
    nodes = NodeGroup(nnodes=2, node_rank=1)
    before = plan_of(gpus(), gpus="none", nproc_per_node=1, nodes=nodes)
    assert any("global rank 1 of 2 if every node runs 1" in n for n in before.notes)
    after = with_layout(before, (2, 1), {})
    assert after.nodes.counts == (2, 1)
    (worker,) = after.workers
    assert (worker.rank, worker.env["RANK"], worker.env["WORLD_SIZE"]) == (2, "2", "3")
    assert worker.env["ROLE_RANK"] == "2" and worker.env["LOCAL_WORLD_SIZE"] == "1"
    assert any(n.startswith("node 1 of 2: global rank 2 of 3 (2 + 1 workers)") for n in after.notes)
    assert not any("if every node runs" in n for n in after.notes)
    assert to_dict(after)["nodes"]["workers_per_node"] == [2, 1]


def test_with_layout_keeps_the_env_a_diff_against_the_parent() -> None:
    plan = plan_of(gpus(), gpus="none", nproc_per_node=1, nodes=NodeGroup(nnodes=2, node_rank=1))
    after = with_layout(plan, (1, 1), {"RANK": "1", "WORLD_SIZE": "2"})
    assert "RANK" not in after.workers[0].env and "WORLD_SIZE" not in after.workers[0].env


def test_torchruns_run_id_and_nccl_error_handling_unless_the_parent_has_them() -> None:
    assert elastic_env("job7", {}) == {
        "TORCHELASTIC_RUN_ID": "job7", "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1",
    }  # fmt: skip
    assert elastic_env("job7", {"TORCH_NCCL_ASYNC_ERROR_HANDLING": "3"}) == {
        "TORCHELASTIC_RUN_ID": "job7"
    }
    (worker,) = plan_of(gpus(), gpus="none", run_id="abc").workers
    assert worker.env["TORCHELASTIC_RUN_ID"] == "abc"
    assert worker.env["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "1"
    (worker,) = plan_of(gpus(), {"TORCHELASTIC_RUN_ID": "outer"}, gpus="none").workers
    assert "TORCHELASTIC_RUN_ID" not in worker.env  # the parent's value goes through


def test_llama_style_workers_get_no_torchrun_variables() -> None:
    (worker,) = plan_of(gpus(), gpus="none", distributed=False).workers
    assert "TORCHELASTIC_RUN_ID" not in worker.env


# -- devices in index order ----------------------------------------------------------------


def test_a_count_is_chosen_by_free_memory_and_handed_out_in_index_order() -> None:
    # Free memory ranks GPU 2 first, then 0, then 3, then 1 (none of them busy).
    plan = plan_of(gpus(2, 6, 0, 4), gpus="2", nproc_per_node=None)
    assert [u.device.index for u in plan.devices] == [0, 2]
    assert [w.env["CUDA_VISIBLE_DEVICES"] for w in plan.workers] == [
        "GPU-00000000-0000-0000-0000-000000000000,GPU-00000002-0000-0000-0000-000000000000"
    ] * 2
    assert any("handed out in index order" in n for n in plan.notes)
    chosen = [n for n in plan.notes if ": chosen, " in n]
    assert [n.split()[1] for n in chosen] == ["2", "0"]  # the notes keep the choice's order
    assert "chosen, 80.0 GiB free of 80.0 GiB" in chosen[0]


def test_auto_hands_out_every_free_device_in_index_order() -> None:
    plan = plan_of(gpus(1, 0, 70, 2), gpus="auto", nproc_per_node=None)
    assert [u.device.index for u in plan.devices] == [0, 1, 3]
    assert skipped_text(plan.notes) == "nvidia 2 busy"


# -- --gpus auto under a scheduler's allocation --------------------------------------------


@pytest.mark.parametrize(
    ("env", "who"),
    [
        ({"SLURM_JOB_ID": "7", "SLURM_STEP_GPUS": "0,1"}, "Slurm (SLURM_STEP_GPUS=0,1)"),
        ({"SLURM_JOB_ID": "7", "SLURM_JOB_GPUS": "2"}, "Slurm (SLURM_JOB_GPUS=2)"),
        ({"SLURM_JOB_ID": "7", "CUDA_VISIBLE_DEVICES": "0"}, "Slurm (CUDA_VISIBLE_DEVICES=0)"),
        ({"SLURM_JOB_ID": "7"}, None),
        ({"SLURM_STEP_GPUS": "0"}, None),  # not in a Slurm job after all
        ({"KUBERNETES_SERVICE_HOST": "10.0.0.1", "NVIDIA_VISIBLE_DEVICES": "GPU-1"},
         "Kubernetes (NVIDIA_VISIBLE_DEVICES=GPU-1)"),
        ({"KUBERNETES_SERVICE_HOST": "10.0.0.1", "NVIDIA_VISIBLE_DEVICES": "all"}, None),
        ({"NVIDIA_VISIBLE_DEVICES": "GPU-1"}, None),
    ],
)  # fmt: skip
def test_who_allocated_the_gpus(env: dict[str, str], who: str | None) -> None:
    assert allocated_by(env) == who


SLURM = {"SLURM_JOB_ID": "7", "SLURM_STEP_GPUS": "0,1,2"}


def test_auto_under_slurm_takes_a_busy_allocated_gpu_with_a_warning() -> None:
    plan = plan_of(gpus(0, 70, 0), SLURM, gpus="auto", nproc_per_node=None)
    assert [u.device.index for u in plan.devices] == [0, 1, 2]
    assert len(plan.workers) == 3
    warnings = [n for n in plan.notes if n.startswith("warning: ")]
    assert warnings == [
        "warning: nvidia 1 (0000:02:00.0) is busy, 70.0 GiB of 80.0 GiB in use; used anyway, "
        "as Slurm allocated it"
    ]


def test_auto_under_slurm_still_skips_what_another_job_of_ours_leases() -> None:
    inventory = gpus(0, 0, 0)
    held = {inventory.devices[1].key: "job 42"}
    req = LaunchRequest(argv=("python3",), gpus="auto", nproc_per_node=None, master_port=1)
    plan = make_plan(req, inventory, SLURM, unavailable=held)
    assert [u.device.index for u in plan.devices] == [0, 2]
    assert "nvidia 1 (0000:02:00.0): skipped, leased by job 42" in plan.notes


def test_a_bar_of_the_users_own_keeps_auto_as_it_is() -> None:
    plan = plan_of(gpus(0, 70, 0), SLURM, gpus="auto", min_free_memory_bytes=20 * GIB)
    assert [u.device.index for u in plan.devices] == [0, 2]
