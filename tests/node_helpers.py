"""Nodes of a multi-node job, each a separate ``python -m xpulaunch`` on loopback."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).parent / "multinode"
EXAMPLES = Path(__file__).parents[1] / "examples"
NODE_TIMEOUT_S = 240  # four torch imports on a loaded two-core machine, with room to spare


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


def listening(port: int) -> bool:
    """Something on this host answers on ``port`` (node 0's agent hosts the c10d store there
    once it does)."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return True
    except OSError:
        return False


class Nodes:
    """Starts ``xpulaunch`` processes and makes sure none outlives the test."""

    def __init__(self, tmp_path: Path) -> None:
        self.tmp_path = tmp_path
        self.started: list[subprocess.Popen[str]] = []
        self.finished: dict[subprocess.Popen[str], tuple[int, str, str]] = {}  # status, out, err

    def start(self, *args: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
        """``xpulaunch ARGS``; ``env``: variables added to this process's."""
        env = {**os.environ, "XDG_RUNTIME_DIR": str(self.tmp_path), "NO_COLOR": "1", **(env or {})}
        process = subprocess.Popen(
            [sys.executable, "-m", "xpulaunch", *args],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
        )  # fmt: skip
        self.started.append(process)
        return process

    def finish(self, process: subprocess.Popen[str]) -> tuple[int, str, str]:
        """Wait for a node: its exit status and output. A node that does not finish in time
        fails the test with every node's output (then all are killed): what each node's
        agent and workers said is what tells a hang in one node from a failure in another."""
        try:
            out, err = process.communicate(timeout=NODE_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            raise AssertionError(self._report(process)) from None
        self.finished[process] = (process.returncode, out, err)
        return process.returncode, out, err

    def _report(self, stuck: subprocess.Popen[str]) -> str:
        lines = [f"node {self.started.index(stuck)} did not finish in {NODE_TIMEOUT_S} s"]
        for index, process in enumerate(self.started):
            if process not in self.finished:
                process.kill()
                out, err = process.communicate()
                self.finished[process] = (process.returncode, out, err)
            status, out, err = self.finished[process]
            lines.append(f"--- node {index}, exit status {status}; stdout (end):\n{out[-3000:]}")
            lines.append(f"--- node {index}, stderr (end):\n{err[-6000:]}")
        return "\n".join(lines)

    def stop_all(self) -> None:
        for process in self.started:
            if process.poll() is None:
                process.kill()
                process.communicate()
