"""A full disk, a removed ``--log-dir`` or ``/dev/full``: the job's own exit status stands, one
warning says what was not written, files end in whole lines, nothing is left half-written."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from fault_cli import Launch, finish
from helpers import wait_for

TWO_LINES = "print('x' * 60)"
MANY_LINES = "for i in range(300): print(i, 'x' * 50)"


def _good(code: int, err: str) -> None:
    assert code == 0, err
    assert "Traceback" not in err


@pytest.mark.parametrize(
    "layout", [("--nproc-per-node", "2"), ("--log-layout", "torchrun", "--nproc-per-node", "2")]
)
def test_summary_json_on_a_full_disk_warns_and_keeps_the_status(
    launch: Launch, small_disk: Callable[[int], Path], layout: tuple[str, ...]
) -> None:
    disk = small_disk(8192)
    logs = disk / "logs"
    proc = launch("run", "--log-dir", str(logs), *layout, sys.executable, "-c", TWO_LINES)
    code, out, err = finish(proc)
    _good(code, err)  # it used to fail with an OSError traceback, exit 1
    assert out.count("x" * 60) == 2
    [warning] = [line for line in err.splitlines() if "summary.json" in line]
    assert "No space left on device; not written" in warning
    assert not list(disk.rglob("*.tmp"))


def test_a_log_dir_removed_during_the_run(launch: Launch, tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    started = tmp_path / "started"
    script = f"import pathlib, time; pathlib.Path({str(started)!r}).touch(); time.sleep(1)"
    proc = launch("run", "--log-dir", str(logs), sys.executable, "-c", script)
    wait_for(started.exists, "the worker to start")
    shutil.rmtree(logs)
    code, _, err = finish(proc)
    _good(code, err)
    assert "summary.json: No such file or directory; not written" in err


def test_events_to_dev_full_warn_once(launch: Launch) -> None:
    proc = launch("run", "--events", "/dev/full", "--max-restarts", "2", "--backoff", "0",
                  "sh", "-c", "exit 0")  # fmt: skip
    code, _, err = finish(proc)
    _good(code, err)  # it used to raise from close(): a traceback and exit 1
    warnings = [line for line in err.splitlines() if "--events /dev/full" in line]
    assert len(warnings) == 1, err
    assert "No space left on device" in warnings[0]


def test_events_on_a_full_disk_are_whole_lines(
    launch: Launch, small_disk: Callable[[int], Path]
) -> None:
    disk = small_disk(6000)
    events = disk / "events.jsonl"
    args = ("--restart", "always", "--max-restarts", "60", "--backoff", "0")
    code, _, err = finish(launch("run", "--events", str(events), *args, "true"))
    assert "Traceback" not in err
    assert code == 0, err
    lines = events.read_text().splitlines()
    assert lines, "some events fit"
    for line in lines:  # the last one used to be cut mid-object
        json.loads(line)
    assert err.count(f"--events {events}: No space left on device") == 1


def test_log_lines_on_a_nearly_full_disk(launch: Launch, small_disk: Callable[[int], Path]) -> None:
    disk = small_disk(8192)
    logs = disk / "logs"
    code, out, err = finish(launch("run", "--log-dir", str(logs), sys.executable, "-c", MANY_LINES))
    _good(code, err)
    assert out.count("x" * 50) == 300  # the console has them all
    text = (logs / "attempt_0" / "0.log").read_text()
    assert text.endswith("\n")  # the last line used to be cut: "2026-11-26T1"
    assert all(line.endswith("x" * 50) for line in text.splitlines())
    # Lines that did not fit were said to be lost (it used to keep a third, silently).
    assert err.count("log file") == 1 and "No space left on device" in err


@pytest.mark.parametrize("where", ["/dev/full", "small disk"])
def test_console_output_to_a_full_disk_is_reported_on_stderr(
    launch: Launch, tmp_path: Path, where: str, request: pytest.FixtureRequest
) -> None:
    if where == "/dev/full":
        target = Path("/dev/full")
    else:
        target = request.getfixturevalue("small_disk")(4096) / "console.log"
    with open(target, "wb") as out:
        proc = launch("run", "--nproc-per-node", "2", sys.executable, "-c", MANY_LINES, stdout=out)
        _, raw = proc.communicate(timeout=60)
    code, err = proc.returncode, raw.decode()
    _good(code, err)
    warnings = [line for line in err.splitlines() if "stdout:" in line]
    assert len(warnings) == 1, err  # it used to lose the output with exit 0 and no word
    assert "No space left on device; no longer written" in warnings[0]


def test_events_to_a_pipe_nobody_reads_never_freeze_the_supervisor(launch: Launch) -> None:
    # A reader that holds the pipe open and never reads: after about 64 KiB of events
    # the writes block; the loop must go on restarting, and SIGTERM must be honoured.
    proc = launch(
        "run", "--events", "-", "--restart", "always", "--backoff", "0", "--grace", "2",
        "sh", "-c", "exit 1",
    )  # fmt: skip
    # stderr is read all along: a full stderr pipe would drop the console's last lines,
    # which this test reads (the console never blocks either, and drops what it cannot write).
    assert proc.stderr is not None
    chunks: list[bytes] = []
    reader = threading.Thread(target=lambda: chunks.extend(iter(proc.stderr.readline, b"")))
    reader.start()
    time.sleep(4)
    assert proc.poll() is None
    started = time.monotonic()
    proc.terminate()
    proc.wait(timeout=15)  # it used to ignore SIGTERM and --grace until killed
    assert time.monotonic() - started < 10
    reader.join(timeout=15)
    err = b"".join(chunks).decode()
    assert proc.returncode == 128 + 15, err[-2000:]
    assert "events dropped: its reader was not reading" in err


def test_events_to_a_fifo_whose_reader_stalls(launch: Launch, tmp_path: Path) -> None:
    import os

    fifo = tmp_path / "events.fifo"
    os.mkfifo(fifo)
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)  # opened, never read
    try:
        proc = launch("run", "--events", str(fifo), "--restart", "always", "--backoff", "0",
                      "--grace", "2", "sh", "-c", "exit 1")  # fmt: skip
        time.sleep(4)
        proc.terminate()
        code, _, err = finish(proc, timeout_s=15)
        assert code == 128 + 15, err
    finally:
        os.close(reader)


def test_events_to_a_fifo_nobody_opens(launch: Launch, tmp_path: Path) -> None:
    import os

    fifo = tmp_path / "events.fifo"
    os.mkfifo(fifo)
    code, out, err = finish(launch("run", "--events", str(fifo), "echo", "ran"), timeout_s=30)
    _good(code, err)  # it used to block in open() before anything started
    assert "ran" in out
    assert f"--events {fifo}: no process opened it for reading" in err


def test_events_to_a_fifo_whose_reader_comes_late(launch: Launch, tmp_path: Path) -> None:
    import os

    fifo = tmp_path / "events.fifo"
    os.mkfifo(fifo)
    proc = launch("run", "--events", str(fifo), sys.executable, "-c", "import time; time.sleep(1)")
    time.sleep(0.3)
    reader = subprocess.run(["cat", str(fifo)], capture_output=True, timeout=30, check=True)
    code, _, err = finish(proc)
    _good(code, err)
    names = [json.loads(line)["event"] for line in reader.stdout.decode().splitlines()]
    assert "started" in names and names[-1] == "lease_released"


def test_a_wait_ticket_on_a_full_disk_is_named(
    launch: Launch, tmp_path: Path, small_disk: Callable[[int], Path]
) -> None:
    locks = small_disk(1 << 20) / "locks"
    inventory = tmp_path / "inventory.json"
    device = {"vendor": "nvidia", "index": 0, "name": "NVIDIA H100", "pci_bus_id": "0000:01:00.0"}
    inventory.write_text(json.dumps({"schema": "xpulaunch.inventory/1", "devices": [device]}))
    args = ("--lock-dir", str(locks), "--inventory", str(inventory), "--gpus", "1")
    holder = launch("run", *args, "sleep", "30")
    wait_for(lambda: [f for f in locks.glob("unit-*.holder") if f.stat().st_size], "a lease")
    small_disk(0)
    code, _, err = finish(launch("run", *args, "--wait-timeout", "5", "true"))
    holder.kill()
    finish(holder)
    assert code == 1
    [line] = err.strip().splitlines()  # it used to name no file: "No space left on device"
    assert line.startswith(f"xpulaunch: error: cannot write the wait ticket {locks}/wait-")
    assert line.endswith(".ticket: No space left on device")
    assert not list(locks.glob("wait-*"))
