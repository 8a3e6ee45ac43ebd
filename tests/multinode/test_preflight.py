"""The pre-flight of a static multi-node job, with real xpulaunch processes on loopback."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from node_helpers import HERE, Nodes, free_port

REPORT = str(HERE / "rank_report.py")


def node_args(port: int, nnodes: int, rank: int, *extra: str) -> list[str]:
    return ["--gpus", "none", "--nproc-per-node", "2", "--nnodes", str(nnodes),
            "--node-rank", str(rank), "--master-port", str(port), *extra, REPORT]  # fmt: skip


def reports(out: str) -> list[dict[str, str]]:
    return [
        json.loads(line.split("REPORT ", 1)[1]) for line in out.splitlines() if "REPORT" in line
    ]


def test_two_nodes_meet_and_get_global_ranks(nodes: Nodes) -> None:
    port = free_port()
    node0 = nodes.start(*node_args(port, 2, 0))
    node1 = nodes.start(*node_args(port, 2, 1))
    status0, out0, err0 = nodes.finish(node0)
    status1, out1, err1 = nodes.finish(node1)
    assert (status0, status1) == (0, 0), err0 + err1
    assert "waiting for 1 of 2 nodes on port" in err0
    assert "node 1 is here" in err0
    assert "reaching node 0 at 127.0.0.1:" in err1
    got = sorted(reports(out0) + reports(out1), key=lambda r: int(r["RANK"]))
    assert [(r["RANK"], r["LOCAL_RANK"], r["GROUP_RANK"]) for r in got] == [
        ("0", "0", "0"), ("1", "1", "0"), ("2", "0", "1"), ("3", "1", "1"),
    ]  # fmt: skip
    for report in got:
        assert report["WORLD_SIZE"] == report["ROLE_WORLD_SIZE"] == "4"
        assert report["ROLE_RANK"] == report["RANK"]
        assert report["LOCAL_WORLD_SIZE"] == report["GROUP_WORLD_SIZE"] == "2"
        assert report["ROLE_NAME"] == "default"
        assert (report["MASTER_ADDR"], report["MASTER_PORT"]) == ("127.0.0.1", str(port))


def test_wrong_address_is_a_one_line_error_and_nothing_starts(nodes: Nodes) -> None:
    port = free_port()  # nobody listens there
    node1 = nodes.start(*node_args(port, 2, 1, "--join-timeout", "2"))
    status, out, err = nodes.finish(node1)
    assert status != 0
    assert f"cannot reach node 0 at 127.0.0.1:{port} within 2 s" in err
    assert "Traceback" not in err
    assert "REPORT" not in out


def test_node_0_alone_says_who_is_missing(nodes: Nodes) -> None:
    node0 = nodes.start(*node_args(free_port(), 3, 0, "--join-timeout", "2"))
    status, out, err = nodes.finish(node0)
    assert status == 125  # the nodes' own status: not 126/127, which are the program's
    assert "waiting for 2 of 3 nodes" in err
    assert "node(s) 1, 2 did not reach node 0" in err
    assert err.strip().splitlines()[-1].startswith("xpulaunch: error:")
    assert "REPORT" not in out


def test_a_node_that_disagrees_on_the_size_is_refused(nodes: Nodes) -> None:
    port = free_port()
    node0 = nodes.start(*node_args(port, 2, 0, "--join-timeout", "20"))
    stray = nodes.start(*node_args(port, 3, 1, "--join-timeout", "20"))
    status, _, err = nodes.finish(stray)
    assert status == 125
    assert "refused: node 0 runs --nnodes 2, this node --nnodes 3" in err
    node0.kill()
    _, _, err0 = nodes.finish(node0)
    assert "refused a connection from 127.0.0.1: node 0 runs --nnodes 2" in err0


SLURM_STEP = {
    "SLURM_JOB_ID": "48213", "SLURM_NNODES": "2", "SLURM_STEP_ID": "0",
    "SLURM_STEP_NUM_NODES": "2", "SLURM_STEP_NUM_TASKS": "2", "SLURM_NODEID": "1",
    "SLURM_STEP_NODELIST": "gpu-a[1-2]", "SLURM_JOB_NODELIST": "gpu-a[1-2]",
}  # fmt: skip


def fake_scontrol(bin_dir: Path, hosts: str) -> Path:
    """An ``scontrol`` that records its arguments and prints ``hosts``, one per line."""
    bin_dir.mkdir()
    calls = bin_dir / "calls"
    script = bin_dir / "scontrol"
    script.write_text(f'#!/bin/sh\necho "$@" >> {calls}\nfor h in {hosts}; do echo $h; done\n')
    script.chmod(0o755)
    return calls


def dry_run_plan(env: dict[str, str]) -> tuple[dict[str, Any], str]:
    done = subprocess.run(
        [sys.executable, "-m", "xpulaunch", "--dry-run", "--json", "--gpus", "none",
         "--nnodes", "auto", REPORT],
        capture_output=True, text=True, timeout=120, check=False, env={**os.environ, **env},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout), done.stderr


@pytest.mark.parametrize(
    ("printed", "master", "warned"),
    [("gpu-a1 gpu-a2", "gpu-a1", False), ("ib-a1 ib-a2", "ib-a1", True)],
)
def test_slurm_hosts_cross_checked_with_scontrol(
    tmp_path: Path, printed: str, master: str, warned: bool
) -> None:
    calls = fake_scontrol(tmp_path / "bin", printed)
    path = f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}"
    plan, err = dry_run_plan({**SLURM_STEP, "PATH": path})
    assert calls.read_text().split() == ["show", "hostnames", "gpu-a[1-2]"]
    assert plan["nodes"] == {"nnodes": 2, "node_rank": 1, "source": "slurm",
                             "hosts": printed.split(), "workers_per_node": []}  # fmt: skip
    assert plan["workers"][0]["env"]["MASTER_ADDR"] == master
    assert plan["workers"][0]["env"]["MASTER_PORT"] == "28213"
    assert plan["workers"][0]["rank"] == 1
    assert ("using it" in err) is warned


def test_slurm_without_scontrol_uses_our_parser(tmp_path: Path) -> None:
    plan, _ = dry_run_plan({**SLURM_STEP, "PATH": os.path.dirname(sys.executable)})
    assert plan["nodes"]["hosts"] == ["gpu-a1", "gpu-a2"]
    assert plan["workers"][0]["env"]["GROUP_RANK"] == "1"


ROUND = str(HERE / "round_worker.py")


def round_args(port: int, rank: int, log: Path, *extra: str) -> list[str]:
    return ["--gpus", "none", "--nproc-per-node", "2", "--nnodes", "2", "--node-rank", str(rank),
            "--master-port", str(port), "--backoff", "0", *extra,
            ROUND, "--log", str(log), "--slow", "3"]  # fmt: skip


def test_nodes_meet_again_before_a_restart(nodes: Nodes, tmp_path: Path) -> None:
    """Node 1's workers fail at once, node 0's only 3 s later (node 0 hears of node 1's
    failure and stops them first): node 1 must not start its new workers before node 0's old
    ones are gone (it would join the old round's store)."""
    port, log = free_port(), tmp_path / "rounds.log"
    node0 = nodes.start(*round_args(port, 0, log, "--max-restarts", "1"))
    node1 = nodes.start(*round_args(port, 1, log, "--max-restarts", "1"))
    status0, out0, err0 = nodes.finish(node0)
    status1, out1, err1 = nodes.finish(node1)
    assert (status0, status1) == (0, 0), err0 + err1
    assert err0.count("all 2 nodes are here") == err1.count("all 2 nodes are here") == 2
    assert err1.count("reaching node 0 at") == 1  # the restart's meeting: on the kept connection
    assert err1.count("ready to start again") == 1
    assert sorted(re.findall(r"REPORT rank (\d) attempt 1", out0 + out1)) == ["0", "1", "2", "3"]
    events = [line.split() for line in log.read_text().splitlines()]
    first_ended = [float(e[4]) for e in events if e[:2] == ["end", "0"]]
    second_started = [float(e[4]) for e in events if e[:2] == ["start", "1"]]
    assert len(first_ended) == len(second_started) == 4
    assert max(first_ended) <= min(second_started)


@pytest.mark.parametrize(
    ("quitter", "statuses", "complaint"),
    [
        # Node 1's workers fail first; node 0's are stopped for it: node 0's own status, 125.
        (1, (3, 125), "node 1 ended (exit status 3); the job cannot start again without it"),
        (0, (125, 3), "node 0 ended (exit status 125); the job cannot start again without it"),
    ],
)
def test_a_node_that_does_not_come_back_fails_the_other(
    nodes: Nodes, tmp_path: Path, quitter: int, statuses: tuple[int, int], complaint: str
) -> None:
    """The node that gives up (no restarts left) says so as it ends; the other one, meeting
    for its restart, fails at once with one line naming it, instead of waiting
    --join-timeout for it (200 s here: the complaint can only come from the node's bye) or
    restarting alone."""
    port, log = free_port(), tmp_path / "rounds.log"
    stayer = 1 - quitter
    started = {
        quitter: nodes.start(*round_args(port, quitter, log, "--max-restarts", "0")),
        stayer: nodes.start(*round_args(port, stayer, log, "--max-restarts", "1",
                                        "--join-timeout", "200")),
    }  # fmt: skip
    assert nodes.finish(started[quitter])[0] == statuses[0]
    status, out, err = nodes.finish(started[stayer])
    assert status == statuses[1]
    assert complaint in err
    assert "gave up" in err and "Traceback" not in err
    assert "REPORT" not in out
    assert not [line for line in log.read_text().splitlines() if line.startswith("start 1")]


def test_a_port_that_answers_but_not_as_node_0_is_tried_again(nodes: Nodes) -> None:
    """Like the old round's TCPStore, still listening on node 0's port when node 1 comes back
    for a restart: it accepts the connection and never says ``here``. Node 1 hangs up and
    tries again until node 0 itself listens there."""
    port = free_port()
    with socket.create_server(("127.0.0.1", port)) as store:
        store.settimeout(120)
        node1 = nodes.start(*node_args(port, 2, 1, "--join-timeout", "120"))
        conn, _ = store.accept()
        with conn:
            conn.settimeout(120)
            assert conn.recv(64).startswith(b"xpulaunch-nodes/2 hello 1 2 2")
    node0 = nodes.start(*node_args(port, 2, 0))
    status1, out1, err1 = nodes.finish(node1)
    status0, out0, err0 = nodes.finish(node0)
    assert (status0, status1) == (0, 0), err0 + err1
    assert len(reports(out0) + reports(out1)) == 4
