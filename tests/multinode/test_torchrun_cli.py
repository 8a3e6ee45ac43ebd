"""``xpulaunch torchrun --standalone --nproc_per_node=2 examples/train.py``, for real."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from node_helpers import EXAMPLES, Nodes

pytestmark = [pytest.mark.slow, pytest.mark.torch]


def test_torchrun_standalone_line_runs(nodes: Nodes, tmp_path: Path) -> None:
    pytest.importorskip("torch")
    job = nodes.start(
        "torchrun", "--standalone", "--nproc_per_node=2", "--gpus", "none",
        str(EXAMPLES / "train.py"), "--ckpt-dir", str(tmp_path), "--steps", "4",
    )  # fmt: skip
    status, out, err = nodes.finish(job)
    assert status == 0, err
    assert sorted(re.findall(r"rank (\d)/2 local_rank (\d)", out)) == [("0", "0"), ("1", "1")]
    assert json.loads((tmp_path / "result.json").read_text())["world_size"] == 2
