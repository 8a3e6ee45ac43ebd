"""A console nobody reads (a paused pager, Ctrl-S, a stuck log shipper) never freezes the
supervisor: stop signals and deadlines work, the output that did not fit is counted."""

from __future__ import annotations

import signal
import subprocess
from pathlib import Path

from fault_cli import Launch
from helpers import wait_for

# Fills any pipe, says so with a file, then waits to be stopped (ignoring SIGTERM with --stubborn).
FLOOD = """
import os, signal, sys, time
if "--stubborn" in sys.argv:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
for i in range(50000):
    print("line", i, "x" * 100, flush=True)
open(sys.argv[1], "w").close()
while True:
    time.sleep(60)
"""


def start_flood(
    launch: Launch, tmp_path: Path, *extra: str
) -> tuple[subprocess.Popen[bytes], Path]:
    marker, err = tmp_path / "flooded", tmp_path / "stderr.txt"
    script = tmp_path / "flood.py"
    script.write_text(FLOOD)
    proc = launch(
        "run", "--grace", "1", "python3", str(script), str(marker), *extra,
        stderr=err.open("wb"),
    )  # fmt: skip
    wait_for(marker.exists, "the worker to write more than the pipe holds", timeout_s=60)
    return proc, err


def test_sigterm_works_while_nobody_reads_stdout(launch: Launch, tmp_path: Path) -> None:
    proc, err = start_flood(launch, tmp_path)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 143, err.read_text()
    text = err.read_text()
    assert "Traceback" not in text
    assert "lines of output dropped" in text


def test_the_grace_deadline_kills_while_nobody_reads_stdout(launch: Launch, tmp_path: Path) -> None:
    proc, err = start_flood(launch, tmp_path, "--stubborn")
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=30) == 130, err.read_text()
