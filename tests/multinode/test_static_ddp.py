"""Two nodes of two gloo DDP workers each (examples/train.py) against one node of four: the
same global ranks, world size and final weights."""

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
            "--ckpt-dir", str(ckpt), "--steps", "6", "--dist-backend", "gloo"]  # fmt: skip


def test_two_nodes_train_like_one_node_of_the_same_world_size(nodes: Nodes, tmp_path: Path) -> None:
    pytest.importorskip("torch")
    one = nodes.start(*train_args(tmp_path / "one", 4, "--master-port", str(free_port())))
    status, _, err = nodes.finish(one)
    assert status == 0, err

    port = str(free_port())
    both = tmp_path / "two"
    node0 = nodes.start(*train_args(both, 2, "--nnodes", "2", "--node-rank", "0",
                                    "--master-port", port))  # fmt: skip
    node1 = nodes.start(*train_args(both, 2, "--nnodes", "2", "--node-rank", "1",
                                    "--rdzv-endpoint", f"127.0.0.1:{port}"))  # fmt: skip
    status0, out0, err0 = nodes.finish(node0)
    status1, out1, err1 = nodes.finish(node1)
    assert (status0, status1) == (0, 0), err0 + err1
    assert sorted(re.findall(r"rank (\d)/4 local_rank (\d)", out0)) == [("0", "0"), ("1", "1")]
    assert sorted(re.findall(r"rank (\d)/4 local_rank (\d)", out1)) == [("2", "0"), ("3", "1")]
    reference = json.loads((tmp_path / "one" / "result.json").read_text())
    got = json.loads((both / "result.json").read_text())
    assert got == reference
    assert got["world_size"] == 4
    digests = set(re.findall(r"done at step 6 weights (\w+)", out0 + out1))
    assert digests == {reference["weights"]}  # every rank of both nodes ended the same
