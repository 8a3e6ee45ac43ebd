"""Nodes of a static job that stay in touch: real xpulaunch processes on loopback, and raw
sockets standing in for nodes that misbehave (one that dies after its hello, one that says
nothing, a foreign program)."""

from __future__ import annotations

import json
import os
import signal
import socket
import threading
from pathlib import Path

import pytest

from helpers import wait_for
from node_helpers import HERE, Nodes, free_port, listening

STUCK = str(HERE / "stuck_worker.py")
REPORT = str(HERE / "rank_report.py")


def node(port: int, rank: int, *extra: str, nnodes: int = 2) -> list[str]:
    return ["--gpus", "none", "--nnodes", str(nnodes), "--node-rank", str(rank),
            "--master-port", str(port), *extra]  # fmt: skip


def reports(out: str) -> list[dict[str, str]]:
    return [json.loads(line.split("REPORT ", 1)[1]) for line in out.splitlines()
            if "REPORT {" in line]  # fmt: skip


def introduce(port: int, line: bytes) -> tuple[socket.socket, str]:
    """Connect to node 0 as a stranger, say ``line``, and read node 0's first answer."""
    wait_for(lambda: listening(port), "node 0 listening", timeout_s=120)
    sock = socket.create_connection(("127.0.0.1", port), timeout=60)
    sock.sendall(line)
    answer = sock.makefile("rb").readline().decode().strip()
    return sock, answer


def test_a_failure_on_node_1_restarts_node_0_whose_worker_would_wait_for_ever(
    nodes: Nodes, tmp_path: Path
) -> None:
    """NCCL does not fail a collective when a peer dies: node 0's worker here goes on
    sleeping while node 1's fails. Node 1 tells node 0, which stops its worker; both nodes
    meet again and restart, and the second run finishes."""
    port = free_port()
    job = ("--max-restarts", "1", "--backoff", "0", STUCK, "--marks", str(tmp_path))
    node0 = nodes.start(*node(port, 0, *job))
    node1 = nodes.start(*node(port, 1, *job))
    status0, out0, err0 = nodes.finish(node0)
    status1, out1, err1 = nodes.finish(node1)
    assert (status0, status1) == (0, 0), err0 + err1
    assert "node 1 failed (worker 0 exited with code 1): stopping this node's workers" in err0
    assert "REPORT rank 0 attempt 1" in out0 and "REPORT rank 1 attempt 1" in out1
    assert "restarting worker 0: node 1 failed" in err0
    assert "ready to start again" in err1


@pytest.mark.parametrize("killed", [1, 0])
def test_a_node_killed_mid_run_fails_the_other_with_one_line(
    nodes: Nodes, tmp_path: Path, killed: int
) -> None:
    """kill -9 of one node's xpulaunch while every worker waits for ever: the other node's
    only way out is hearing that the connection closed (its --join-timeout plays no part
    once the job runs)."""
    port = free_port()
    job = (STUCK, "--marks", str(tmp_path), "--forever")
    started = [nodes.start(*node(port, rank, *job)) for rank in (0, 1)]
    for rank in (0, 1):
        wait_for((tmp_path / f"up-{rank}-{rank}-0").exists, f"node {rank}'s worker", 120)
    started[killed].send_signal(signal.SIGKILL)
    nodes.finish(started[killed])
    status, _, err = nodes.finish(started[1 - killed])
    assert status == 125
    assert f"node {killed} is gone (its connection closed): stopping this node's workers" in err
    assert err.strip().splitlines()[-1] == (
        f"xpulaunch: gave up (node {killed} is gone (its connection closed); no restarts were "
        "requested), exit status 125"
    )
    assert "Traceback" not in err


def test_a_node_stopped_by_a_signal_stops_the_other(nodes: Nodes, tmp_path: Path) -> None:
    port = free_port()
    job = (STUCK, "--marks", str(tmp_path), "--forever")
    node0, node1 = (nodes.start(*node(port, rank, *job)) for rank in (0, 1))
    wait_for((tmp_path / "up-1-1-0").exists, "node 1's worker", 120)
    wait_for((tmp_path / "up-0-0-0").exists, "node 0's worker", 120)
    node1.send_signal(signal.SIGTERM)
    assert nodes.finish(node1)[0] == 128 + signal.SIGTERM
    status, _, err = nodes.finish(node0)
    assert status == 125
    assert "node 1 failed (stopped by SIGTERM): stopping this node's workers too" in err


def test_nodes_with_different_worker_counts_number_their_ranks_in_node_order(
    nodes: Nodes,
) -> None:
    """2 + 1 workers are one job of world size 3: node 1's worker is global rank 2; each
    node's LOCAL_WORLD_SIZE is its own count. Node 1's plan assumed 1 + 1 until they met."""
    port = free_port()
    node0 = nodes.start(*node(port, 0, "--nproc-per-node", "2", REPORT))
    node1 = nodes.start(*node(port, 1, "--nproc-per-node", "1", REPORT))
    status0, out0, err0 = nodes.finish(node0)
    status1, out1, err1 = nodes.finish(node1)
    assert (status0, status1) == (0, 0), err0 + err1
    got = {r["RANK"]: r for r in reports(out0) + reports(out1)}
    assert sorted(got) == ["0", "1", "2"]
    assert {r["WORLD_SIZE"] for r in got.values()} == {"3"}
    assert [got[r]["LOCAL_WORLD_SIZE"] for r in "012"] == ["2", "2", "1"]
    assert [got[r]["GROUP_RANK"] for r in "012"] == ["0", "0", "1"]
    assert got["2"]["ROLE_RANK"] == "2" and got["2"]["ROLE_WORLD_SIZE"] == "3"
    assert {r["TORCHELASTIC_RUN_ID"] for r in got.values()} == {"none"}
    assert {r["TORCH_NCCL_ASYNC_ERROR_HANDLING"] for r in got.values()} == {"1"}
    assert "node 1 is here (127.0.0.1): 1 worker;" in err0
    assert "all 2 nodes are here: 3 workers in all (node 0: 2, node 1: 1)" in err0
    assert "3 workers in all (node 0: 2, node 1: 1)" in err1


def test_a_node_that_leaves_after_its_hello_is_replaced_and_nothing_starts_without_it(
    nodes: Nodes,
) -> None:
    """A node says hello and dies (a pod restarted, a task requeued). Node 0 drops it instead
    of keeping its rank: node 2 arriving does not start the job, and node 1's replacement
    takes the rank."""
    port = free_port()
    node0 = nodes.start(*node(port, 0, "--join-timeout", "120", REPORT, nnodes=3))
    ghost, answer = introduce(port, b"xpulaunch-nodes/2 hello 1 3 1\n")
    assert answer == "here"
    ghost.close()
    node2 = nodes.start(*node(port, 2, REPORT, nnodes=3))
    node1 = nodes.start(*node(port, 1, REPORT, nnodes=3))
    results = [nodes.finish(n) for n in (node0, node1, node2)]
    assert [status for status, _, _ in results] == [0, 0, 0], [err for _, _, err in results]
    err0 = results[0][2]
    assert "node 1 left (its connection closed); waiting for it to come back" in err0
    assert err0.count("node 1 is here") == 2
    ranks = sorted(r["RANK"] for _, out, _ in results for r in reports(out))
    assert ranks == ["0", "1", "2"]


def test_a_rank_still_held_by_a_live_node_is_refused(nodes: Nodes) -> None:
    port = free_port()
    node0 = nodes.start(*node(port, 0, "--join-timeout", "120", REPORT, nnodes=3))
    holder, answer = introduce(port, b"xpulaunch-nodes/2 hello 1 3 1\n")
    assert answer == "here"
    with holder:
        status, _, err = nodes.finish(nodes.start(*node(port, 1, REPORT, nnodes=3)))
    assert status == 125
    assert err.strip().splitlines()[-1] == (
        f"xpulaunch: error: node 0 at 127.0.0.1:{port}: refused: --node-rank 1 is taken by "
        "a node still connected from 127.0.0.1"
    )
    node0.kill()
    nodes.finish(node0)


def test_a_client_that_says_nothing_does_not_hold_node_0(nodes: Nodes) -> None:
    """A connection that never finishes its hello (it drips a byte) is served beside the
    real nodes and closed after a few seconds; a node that comes meanwhile is admitted."""
    port = free_port()
    node0 = nodes.start(*node(port, 0, "--join-timeout", "120", REPORT, nnodes=3))
    wait_for(lambda: listening(port), "node 0 listening", timeout_s=120)
    with socket.create_connection(("127.0.0.1", port), timeout=60) as silent:
        silent.sendall(b"x")  # a line that never ends
        node1 = nodes.start(*node(port, 1, REPORT, nnodes=3))
        answer = silent.makefile("rb").readline().decode().strip()
    assert answer == "refused: no hello within 5 s"
    node2 = nodes.start(*node(port, 2, REPORT, nnodes=3))
    results = [nodes.finish(n) for n in (node0, node1, node2)]
    assert [status for status, _, _ in results] == [0, 0, 0], [err for _, _, err in results]
    assert "refused a connection from 127.0.0.1: no hello within 5 s" in results[0][2]


def test_the_join_timeout_holds_against_a_silent_client(nodes: Nodes) -> None:
    port = free_port()
    node0 = nodes.start(*node(port, 0, "--join-timeout", "3", REPORT))
    wait_for(lambda: listening(port), "node 0 listening", timeout_s=120)
    with socket.create_connection(("127.0.0.1", port), timeout=60) as silent:
        status, _, err = nodes.finish(node0)
        answer = silent.makefile("rb").readline().decode().strip()
    assert status == 125
    complaint = f"node(s) 1 did not reach node 0 on port {port} within 3 s"
    assert answer.startswith(f"refused: node 0 gives up: {complaint}")
    assert err.strip().splitlines()[-1].startswith(f"xpulaunch: error: {complaint}")


@pytest.mark.parametrize(
    ("said", "refusal"),
    [
        (b"GET / HTTP/1.0\r\n", "refused: not an xpulaunch node (it said 'GET / HTTP/1.0')"),
        (b"xpulaunch-preflight/1 1 2\n", "refused: an xpulaunch node of another version "
         "('xpulaunch-preflight/1'; node 0 speaks xpulaunch-nodes/2); run the same xpulaunch "
         "version on every node"),
        (b"xpulaunch-nodes/2 hello one 2 1\n", "refused: a garbled hello ("),
        (b"xpulaunch-nodes/2 hello 1 3 1\n", "refused: node 0 runs --nnodes 2, this node "
         "--nnodes 3"),
    ],
)  # fmt: skip
def test_foreign_and_garbled_peers_are_refused_in_one_line(
    nodes: Nodes, said: bytes, refusal: str
) -> None:
    port = free_port()
    node0 = nodes.start(*node(port, 0, "--join-timeout", "120", REPORT))
    stranger, answer = introduce(port, said)
    stranger.close()
    assert answer.startswith(refusal)
    node1 = nodes.start(*node(port, 1, REPORT))
    status0, _, err0 = nodes.finish(node0)
    assert (status0, nodes.finish(node1)[0]) == (0, 0), err0
    assert f"refused a connection from 127.0.0.1: {refusal.removeprefix('refused: ')}" in err0


def test_a_foreign_program_on_the_port_fails_node_1_at_once(nodes: Nodes) -> None:
    """A listener that answers, but not as node 0 (an ssh server, say), is named in one line
    at once; a silent one might be the old round's store and is asked again instead."""
    port = free_port()
    with socket.create_server(("127.0.0.1", port)) as server:
        server.settimeout(120)

        def banner() -> None:
            conn, _ = server.accept()
            with conn:
                conn.sendall(b"SSH-2.0-OpenSSH_9.6\r\n")
                conn.recv(64)

        answering = threading.Thread(target=banner)
        answering.start()
        status, out, err = nodes.finish(nodes.start(*node(port, 1, "--join-timeout", "120",
                                                           REPORT)))  # fmt: skip
        answering.join(60)
    assert status == 125
    assert err.strip().splitlines()[-1] == (
        f"xpulaunch: error: node 0 at 127.0.0.1:{port}: the port answers, but not as an "
        "xpulaunch node 0 (it said 'SSH-2.0-OpenSSH_9.6')"
    )
    assert "REPORT" not in out


def test_sigusr1_reaches_every_node_worker_and_the_job_goes_on(
    nodes: Nodes, tmp_path: Path
) -> None:
    """Slurm signals every task of a step; each node's xpulaunch sends it on to its workers."""
    script = tmp_path / "usr1.py"
    script.write_text(USR1_WORKER)
    port = free_port()
    started = [nodes.start(*node(port, rank, str(script), str(tmp_path))) for rank in (0, 1)]
    for rank in (0, 1):
        wait_for((tmp_path / f"ready-{rank}").exists, f"node {rank}'s worker", 120)
    for process in started:
        os.kill(process.pid, signal.SIGUSR1)
    for process in started:
        status, out, err = nodes.finish(process)
        assert status == 0, err
        assert "got SIGUSR1; checkpointing" in out
        assert "SIGUSR1: sent on to the workers (0); the job goes on" in err


USR1_WORKER = """
import os, signal, sys, time
from pathlib import Path
got = []
signal.signal(signal.SIGUSR1, lambda *a: got.append(1))
Path(sys.argv[1], "ready-" + os.environ["GROUP_RANK"]).touch()
for _ in range(1200):
    if got:
        print("got SIGUSR1; checkpointing", flush=True)
        break
    time.sleep(0.05)
"""
