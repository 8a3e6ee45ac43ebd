"""The c10d agent that the command line starts before it plans (xpulaunch.proc.prestart),
through ``python -m xpulaunch`` with torch's real agent: it is the process the supervisor
runs, and nothing of it outlives bad input or a killed supervisor."""

from __future__ import annotations

import json
import signal
import uuid
from pathlib import Path

import pytest

from helpers import processes_marked, wait_for
from node_helpers import Nodes, free_port

pytestmark = [pytest.mark.slow, pytest.mark.torch]
FRESH_AGENT = "-m xpulaunch.integrations.torch_agent"
# The worker: its agent's command line and two of its variables, then it sleeps if asked.
WORKER = """import json, os, sys, time
agent = open(f"/proc/{os.getppid()}/cmdline").read().replace("\\0", " ")
report = {"agent": agent, "job": os.environ.get("XPULAUNCH_JOB_ID"), "rank": os.environ["RANK"]}
open(sys.argv[1] + os.environ["RANK"], "w").write(json.dumps(report))
time.sleep(float(sys.argv[2]))
"""


def one_node(port: int, worker: Path, out: Path, sleep_s: float = 0) -> list[str]:
    return ["--gpus", "none", "--nproc-per-node", "2", "--nnodes", "1", "--rdzv-backend",
            "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}", str(worker), str(out),
            str(sleep_s)]  # fmt: skip


@pytest.mark.parametrize("prestart", ["1", "0"])
def test_the_supervised_agent_is_the_one_started_early(
    nodes: Nodes, tmp_path: Path, prestart: str
) -> None:
    worker = tmp_path / "worker.py"
    worker.write_text(WORKER)
    out = tmp_path / "rank"
    node = nodes.start(*one_node(free_port(), worker, out), env={"XPULAUNCH_PRESTART": prestart})
    status, _, err = nodes.finish(node)
    assert status == 0, err
    reports = [json.loads((tmp_path / f"rank{rank}").read_text()) for rank in (0, 1)]
    for report in reports:
        assert report["job"]  # the workers carry the job's marker either way
        if prestart == "1":  # the child forked by the command line, which it adopted
            assert FRESH_AGENT not in report["agent"], report
            assert "--rdzv-backend c10d" in report["agent"], report
        else:
            assert FRESH_AGENT in report["agent"], report


def test_bad_input_ends_the_early_agent(nodes: Nodes, tmp_path: Path) -> None:
    tag = f"xpl-prestart-{uuid.uuid4().hex}"
    worker = tmp_path / "worker.py"
    worker.write_text(WORKER)
    args = [*one_node(free_port(), worker, tmp_path / "rank"), "--rdzv-conf", "no_such_key=1"]
    node = nodes.start(*args, env={"PRESTART_TEST_TAG": tag})
    status, _, err = nodes.finish(node)
    assert status == 2
    assert err.count("\n") == 1 and "no_such_key" in err, err
    assert not processes_marked((tag,))  # ended and reaped before the command line exited


def test_kill_9_of_the_supervisor_leaves_nothing(nodes: Nodes, tmp_path: Path) -> None:
    tag = f"xpl-prestart-{uuid.uuid4().hex}"
    worker = tmp_path / "worker.py"
    worker.write_text(WORKER)
    out = tmp_path / "rank"
    node = nodes.start(*one_node(free_port(), worker, out, 300), env={"PRESTART_TEST_TAG": tag})
    wait_for(lambda: (tmp_path / "rank0").exists() and (tmp_path / "rank1").exists(),
             "both workers running", 120)  # fmt: skip
    assert FRESH_AGENT not in json.loads((tmp_path / "rank0").read_text())["agent"]
    node.send_signal(signal.SIGKILL)
    node.communicate(timeout=30)
    wait_for(lambda: not processes_marked((tag,)), "the agent and its workers gone", 60)
