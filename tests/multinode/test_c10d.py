"""``--rdzv-backend c10d``: nodes as separate xpulaunch processes on loopback, each running
torch's elastic agent under its supervisor."""

from __future__ import annotations

import json
import re
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest

from helpers import processes_marked, wait_for
from node_helpers import EXAMPLES, HERE, Nodes, free_port, listening

pytestmark = [pytest.mark.slow, pytest.mark.torch]
TRAIN = str(EXAMPLES / "train.py")
WORKER = str(HERE / "elastic_worker.py")


def c10d(port: int, nnodes: str, *extra: str) -> list[str]:
    return ["--gpus", "none", "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}",
            "--rdzv-id", "job", "--nnodes", nnodes, *extra]  # fmt: skip


def log_text(log_dir: Path) -> str:
    return "".join(p.read_text(errors="replace") for p in sorted(log_dir.rglob("*.log")))


def test_crash_on_one_node_restarts_every_node_and_resumes(nodes: Nodes, tmp_path: Path):
    pytest.importorskip("torch")
    reference = tmp_path / "reference"
    one = nodes.start("--gpus", "none", "--nproc-per-node", "4", "--master-port", str(free_port()),
                      TRAIN, "--ckpt-dir", str(reference), "--steps", "12")  # fmt: skip
    assert nodes.finish(one)[0] == 0

    port, ckpt = free_port(), tmp_path / "elastic"
    job = ["--nproc-per-node", "2", "--max-restarts", "1", "--join-timeout", "120",
           TRAIN, "--ckpt-dir", str(ckpt), "--steps", "12", "--crash-at-step", "8"]  # fmt: skip
    node0 = nodes.start(*c10d(port, "2", *job))
    wait_for(lambda: listening(port), "node 0's rendezvous store", timeout_s=120)
    node1 = nodes.start(*c10d(port, "2", *job))
    status0, out0, err0 = nodes.finish(node0)
    status1, out1, err1 = nodes.finish(node1)
    assert (status0, status1) == (0, 0), err0[-3000:] + err1[-3000:]
    out = out0 + out1
    assert "simulated crash at step 8" in err0 + err1
    assert sorted(re.findall(r"rank (\d): resumed from step 5", out)) == ["0", "1", "2", "3"]
    assert sorted(set(re.findall(r"rank (\d)/4 local_rank", out))) == ["0", "1", "2", "3"]
    got = json.loads((ckpt / "result.json").read_text())
    assert got == json.loads((reference / "result.json").read_text())


def kill_node_1(nodes: Nodes, tmp_path: Path, nnodes: str, *job: str) -> subprocess.Popen[str]:
    """Two nodes of ``job`` up (node 1's worker in a world of 2), then ``kill -9`` of node 1's
    xpulaunch; returns node 0, still running."""
    port = free_port()
    logs = [tmp_path / "logs0", tmp_path / "logs1"]
    node0 = nodes.start(*c10d(port, nnodes, "--log-dir", str(logs[0]), *job))
    wait_for(lambda: listening(port), "node 0's rendezvous store", timeout_s=120)
    node1 = nodes.start(*c10d(port, nnodes, "--log-dir", str(logs[1]), *job))
    wait_for(lambda: "world 2" in log_text(logs[1]), "node 1's worker", timeout_s=180)
    node1.send_signal(signal.SIGKILL)
    return node0


def test_kill_9_of_one_node_fails_the_other_and_leaves_nothing(nodes: Nodes, tmp_path: Path):
    pytest.importorskip("torch")
    tag = f"tag-{tmp_path.name}"
    node0 = kill_node_1(nodes, tmp_path, "2", "--max-restarts", "0", "--join-timeout", "30",
                        WORKER, "--tag", tag)  # fmt: skip
    status, _, err = nodes.finish(node0)
    assert status != 0
    assert "worker agent failed first: it exited with code 1" in err
    assert "Traceback" not in err.split("worker agent failed first")[0].splitlines()[-1]
    wait_for(lambda: not processes_marked((tag,)), "every process of both nodes gone", 60)


def test_kill_9_of_one_node_within_min_max_lets_the_other_go_on_alone(
    nodes: Nodes, tmp_path: Path
) -> None:
    """``--nnodes 1:2``: node 0 goes on alone after ``kill -9`` of node 1's xpulaunch.

    torchrun itself does the same, and only so: node 0's gloo all-reduce fails when node 1's
    workers die, so its agent sees a failed worker group and spends a restart on a new
    rendezvous round (with ``--max-restarts 0`` it fails, as in the test above). That round
    waits until node 1's heartbeats expire (torch's keep-alive: 3 missed beats of 5 s) and then
    for the last call (torch's default 30 s) before it closes with node 0 alone, so no wait
    below is shorter than a minute and a half.
    """
    pytest.importorskip("torch")
    tag = f"tag-{tmp_path.name}"
    node0 = kill_node_1(nodes, tmp_path, "1:2", "--max-restarts", "1", "--join-timeout", "120",
                        WORKER, "--tag", tag, "--until-world", "1")  # fmt: skip
    status, out, err = nodes.finish(node0)
    assert status == 0, err[-3000:]
    assert "ELASTIC rank 0 world 2 group 0" in out
    assert "ELASTIC rank 0 done in a world of 1" in out
    # Our line for each round, torch's INFO records being off: node 1 left, a restart spent.
    assert "xpulaunch: c10d round 1: 2 nodes, this node is group rank 0, 1 worker, " in err
    assert "xpulaunch: c10d round 2: 1 node (was 2; a node left; restart 1), " in err
    wait_for(lambda: not processes_marked((tag,)), "every process of both nodes gone", 60)


# Node 1's worker fails once node 0's is up; node 0's sleeps, blind to its peer's death as an
# NCCL rank waiting in a collective is.
BLIND_WORKER = """
import os, sys, time
from pathlib import Path
marks = Path(sys.argv[1])
if os.environ.get("FAIL_HERE"):
    while not (marks / "up").exists():
        time.sleep(0.1)
    sys.exit(3)
(marks / "up").touch()
time.sleep(3600)
"""


def test_a_node_that_gives_up_stops_the_workers_of_the_others(nodes: Nodes, tmp_path: Path):
    """torchrun's agents leave such workers running for ever; here node 1's agent, giving up
    (no restarts left), tells node 0's, which stops its workers and ends too."""
    pytest.importorskip("torch")
    port, worker, marks = free_port(), tmp_path / "blind.py", tmp_path / "marks"
    worker.write_text(BLIND_WORKER)
    marks.mkdir()
    job = ["--max-restarts", "0", str(worker), str(marks)]
    node0 = nodes.start(*c10d(port, "2", *job))
    wait_for(lambda: listening(port), "node 0's rendezvous store", timeout_s=120)
    node1 = nodes.start(*c10d(port, "2", *job), env={"FAIL_HERE": "1"})
    status1, _, err1 = nodes.finish(node1)
    status0, _, err0 = nodes.finish(node0)
    assert (status0, status1) == (1, 1), err0[-3000:] + err1[-3000:]
    assert "xpulaunch: c10d: the node of group rank " in err0
    assert "gave up (its workers failed, with no restarts left); stopping this node's" in err0


@pytest.mark.parametrize("pace", [("--every", "0.2"), ("--every", "0.005", "--fail-fast")])
def test_a_third_node_joins_at_the_next_round(
    nodes: Nodes, tmp_path: Path, pace: tuple[str, ...]
) -> None:
    """A node joining below MAX is admitted without failing or spending a restart, also when
    the workers all-reduce without pause and exit at once on an error (``pace``). Then the
    first agent to see the newcomer stops its workers for the next round, and the other
    node's worker fails before its agent has seen it: torch's agent alone counts that as a
    restart and, with none, ends the job (7 of 14 runs failed so before ``admit_joiners``)."""
    pytest.importorskip("torch")
    port = free_port()
    logs = [tmp_path / f"logs{i}" for i in range(3)]
    job = ["--join-timeout", "120", WORKER, "--until-world", "3", *pace]
    started = [nodes.start(*c10d(port, "2:3", "--log-dir", str(logs[0]), *job))]
    wait_for(lambda: listening(port), "node 0's rendezvous store", timeout_s=120)
    started.append(nodes.start(*c10d(port, "2:3", "--log-dir", str(logs[1]), *job)))
    wait_for(lambda: "world 2" in log_text(logs[0]), "a first round of two nodes", 180)
    started.append(nodes.start(*c10d(port, "2:3", "--log-dir", str(logs[2]), *job)))
    results = [nodes.finish(node) for node in started]
    assert [status for status, _, _ in results] == [0, 0, 0], results[0][2][-3000:]
    out = "".join(out for _, out, _ in results)
    assert sorted(re.findall(r"ELASTIC rank (\d) done in a world of 3", out)) == ["0", "1", "2"]
    for _, _, err in results[:2]:  # no restart is spent on a node that joins below MAX
        assert re.search(r"c10d round \d+: 3 nodes \(was 2; a node joined\), this node is", err)


def test_a_rendezvous_setting_reaches_torch(nodes: Nodes, tmp_path: Path) -> None:
    """``--rdzv-conf last_call_timeout=1``: a lone node of ``--nnodes 1:2`` starts its round
    after a second of last call instead of torch's default 30 s (a generous bound below)."""
    pytest.importorskip("torch")
    port = free_port()
    node = nodes.start(*c10d(port, "1:2", "--rdzv-conf", "last_call_timeout=1", WORKER,
                             "--until-world", "1"))  # fmt: skip
    wait_for(lambda: listening(port) or node.poll() is not None, "the store", timeout_s=120)
    started = time.monotonic()
    status, out, err = nodes.finish(node)
    assert status == 0, err[-3000:]
    assert time.monotonic() - started < 20, "the round waited out torch's default last call"
    assert "ELASTIC rank 0 done in a world of 1" in out
    assert "xpulaunch: c10d round 1: 1 node, this node is group rank 0, 1 worker, " in err


def test_a_foreign_program_on_the_endpoint_fails_in_one_line_in_time(nodes: Nodes) -> None:
    """A program that accepts connections on the endpoint but is no c10d store keeps torch's
    store client (and torchrun) waiting for ever: the agent is given --join-timeout plus a
    margin for its first round, then the node fails naming the endpoint."""
    pytest.importorskip("torch")
    port = free_port()
    with socket.create_server(("127.0.0.1", port)):  # accepts, never answers
        node = nodes.start(*c10d(port, "1:2", "--join-timeout", "1", WORKER, "--until-world", "1"))
        status, out, err = nodes.finish(node)
    assert status == 125
    assert (
        f"xpulaunch: error: c10d: no rendezvous round within 16 s: 127.0.0.1:{port} answers, "
        "but not as torch's c10d store (is another program holding that port?)"
    ) in err
    assert "ELASTIC" not in out
