"""Two nodes of two gloo DDP workers each (examples/train.py) against one node of four: the
same global ranks, world size and final weights, after a crash on node 1 that every node's
supervisor answers with a restart of its gang (the workers of node 0 fail on the broken
collective), resuming from the checkpoint."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from node_helpers import EXAMPLES, Nodes, free_port

pytestmark = [pytest.mark.slow, pytest.mark.torch]
TRAIN = str(EXAMPLES / "train.py")


def train_args(ckpt: Path, nproc: int, *node: str) -> list[str]:
    return ["--gpus", "none", "--nproc-per-node", str(nproc), *node, TRAIN,
            "--ckpt-dir", str(ckpt), "--steps", "12", "--dist-backend", "gloo"]  # fmt: skip


CRASH = ("--max-restarts", "1", "--backoff", "0")


def test_two_nodes_train_like_one_node_of_the_same_world_size(nodes: Nodes, tmp_path: Path) -> None:
    pytest.importorskip("torch")
    one = nodes.start(*train_args(tmp_path / "one", 4, "--master-port", str(free_port())))
    status, _, err = nodes.finish(one)
    assert status == 0, err

    port = str(free_port())
    both = tmp_path / "two"
    node0 = nodes.start(*train_args(both, 2, *CRASH, "--nnodes", "2", "--node-rank", "0",
                                    "--master-port", port), "--crash-at-step", "8")  # fmt: skip
    node1 = nodes.start(*train_args(both, 2, *CRASH, "--nnodes", "2", "--node-rank", "1",
                                    "--rdzv-endpoint", f"127.0.0.1:{port}"),
                        "--crash-at-step", "8")  # fmt: skip
    status0, out0, err0 = nodes.finish(node0)
    status1, out1, err1 = nodes.finish(node1)
    assert (status0, status1) == (0, 0), err0 + err1
    assert sorted(set(re.findall(r"rank (\d)/4 local_rank (\d)", out0))) == [("0", "0"), ("1", "1")]
    assert sorted(set(re.findall(r"rank (\d)/4 local_rank (\d)", out1))) == [("2", "0"), ("3", "1")]
    assert "rank 3: simulated crash at step 8" in err1
    assert "restarting all workers" in err0 and "restarting all workers" in err1
    resumed = re.findall(r"rank (\d): resumed from step 5", out0 + out1)
    assert sorted(resumed) == ["0", "1", "2", "3"]
    reference = json.loads((tmp_path / "one" / "result.json").read_text())
    got = json.loads((both / "result.json").read_text())
    assert got == reference
    assert got["world_size"] == 4
    digests = set(re.findall(r"done at step 12 weights (\w+)", out0 + out1))
    assert digests == {reference["weights"]}  # every rank of both nodes ended the same


def test_nodes_of_different_sizes_train_like_one_node_of_their_sum(
    nodes: Nodes, tmp_path: Path
) -> None:
    """2 + 1 workers: one gloo job of world size 3 (ranks in node order), ending with the
    weights of one node of 3 workers."""
    pytest.importorskip("torch")
    one = nodes.start(*train_args(tmp_path / "one", 3, "--master-port", str(free_port())))
    status, _, err = nodes.finish(one)
    assert status == 0, err
    port, both = str(free_port()), tmp_path / "two"
    node0 = nodes.start(*train_args(both, 2, "--nnodes", "2", "--node-rank", "0",
                                    "--master-port", port))  # fmt: skip
    node1 = nodes.start(*train_args(both, 1, "--nnodes", "2", "--node-rank", "1",
                                    "--master-port", port))  # fmt: skip
    status0, out0, err0 = nodes.finish(node0)
    status1, out1, err1 = nodes.finish(node1)
    assert (status0, status1) == (0, 0), err0 + err1
    assert sorted(set(re.findall(r"rank (\d)/3 local_rank (\d)", out0))) == [("0", "0"), ("1", "1")]
    assert sorted(set(re.findall(r"rank (\d)/3 local_rank (\d)", out1))) == [("2", "0")]
    got = json.loads((both / "result.json").read_text())
    assert got == json.loads((tmp_path / "one" / "result.json").read_text())
    assert got["world_size"] == 3
