"""Where a 2-node c10d start's time goes, xpulaunch against torchrun (diagnostic).

    python bench/c10d_timeline.py [--rounds 3]

Three ways: xpulaunch, torchrun, and xpulaunch with ``XPULAUNCH_PRESTART=0`` (torch's agent
started after our plan). Both nodes of each way start together with ``LOGLEVEL=INFO``, so that
torch's agent stamps its own steps (glog lines with wall-clock times). Per node, seconds after
the start: the agent's first line (``Starting elastic_operator``: imports and arguments done),
its join, the end of its rendezvous round, and its workers' start. Prints a line per round
as it goes, then the medians.
"""

from __future__ import annotations

import argparse
import datetime
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

from bench_multinode import TRAIN, free_port, torchrun_nodes, xpulaunch_nodes

# torch's log lines: glog's "I1124 04:53:31.727000 PID file:line] message" (local time).
STAMP = re.compile(r"[IWE]\d{4} (\d\d:\d\d:\d\d\.\d{6}) ")
STEPS = {
    "agent up": "Starting elastic_operator",
    "joining": "Rendezvous'ing worker group",
    "round complete": "Rendezvous complete for workers",
    "workers started": "Starting worker group",
}


def when(line: str) -> float | None:
    found = STAMP.search(line)
    if found is None:
        return None
    today = datetime.date.today().isoformat()
    moment = datetime.datetime.fromisoformat(f"{today} {found.group(1)}")
    return moment.timestamp()


def one_round(way: str, tmp: Path) -> list[dict[str, float]]:
    port = free_port()
    make = torchrun_nodes if way == "torchrun" else xpulaunch_nodes
    env = {**os.environ, "LOGLEVEL": "INFO", "CUDA_VISIBLE_DEVICES": "", "NO_COLOR": "1"}
    if way == "xpulaunch-late":  # torch's agent started after our plan
        env["XPULAUNCH_PRESTART"] = "0"
    start = time.time()
    ckpt = tmp / f"ckpt-{way}-{start}"
    nodes = [subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True) for argv in make("c10d", port, ckpt)]  # fmt: skip
    found = []
    for node in nodes:
        out, _ = node.communicate(timeout=300)
        seen: dict[str, float] = {}
        for line in out.splitlines():
            for name, text in STEPS.items():
                stamp = when(line) if text in line else None
                if stamp is not None and name not in seen:
                    seen[name] = stamp - start
        found.append(seen)
    return found


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    rounds = parser.parse_args().rounds
    tmp = Path(os.environ.get("TMPDIR", "/tmp"))
    ways = ("xpulaunch", "torchrun", "xpulaunch-late")
    table: dict[str, list[dict[str, float]]] = {way: [] for way in ways}
    for i in range(rounds + 1):
        for way in table:
            nodes = one_round(way, tmp)
            if i:
                table[way] += nodes
                print(way, [{k: round(v, 3) for k, v in n.items()} for n in nodes], flush=True)
    for way, nodes in table.items():
        parts = ", ".join(f"{name} {statistics.median(n.get(name, -1) for n in nodes):.3f} s"
                          for name in STEPS)  # fmt: skip
        print(f"{way:14} medians over {len(nodes)} nodes: {parts}")
    print(f"(train: {TRAIN}; python {sys.version.split()[0]})")


if __name__ == "__main__":
    main()
