"""``xpulaunch status`` and the lease options of ``run``/``llama``."""

from __future__ import annotations

import io
import json
import os
import pwd
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from helpers import run_refused, run_request
from xpulaunch.cli.status import status
from xpulaunch.cli.waiting import WaitReporter
from xpulaunch.leases import LeaseManager
from xpulaunch.leases.wait_queue import WaitStatus, wait_line
from xpulaunch.model import Inventory

PlanFor = Callable[..., Any]  # the plan_for fixture (tests/leases/conftest.py)
Processes = Any  # the processes fixture (tests/leases/conftest.py)
HOLDER_KEYS = {"pid", "command", "user", "since", "job_id", "hostname"}


def _status_json(lock_dir: Path) -> dict[str, Any]:
    result = CliRunner().invoke(status, ["--json", "--lock-dir", str(lock_dir)])
    assert result.exit_code == 0, result.output
    document: dict[str, Any] = json.loads(result.output)
    return document


def test_status_json_shape_with_leases_and_a_waiter(
    lock_dir: Path, one_card: Inventory, plan_for: PlanFor, processes: Processes
) -> None:
    import time

    _plan, lease = LeaseManager(lock_dir).allocate(
        plan_for(one_card, "1"), command=["python", "train.py"]
    )
    waiter = processes.worker(lock_dir, "--devices", "1", "--gpus", "1", "--wait", "hold")
    deadline = time.monotonic() + 15
    while not (doc := _status_json(lock_dir))["waiting"]:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    lease.release()
    assert waiter.wait(timeout=20) == 0

    assert doc["schema"] == "xpulaunch.status/1"
    assert doc["lock_dir"] == str(lock_dir) and doc["lock_dir_kind"] == "shared"
    assert doc["lock_dir_exists"] is True
    [entry] = doc["leases"]
    assert set(entry) == {"device", "holder_alive", *HOLDER_KEYS}
    assert entry["device"] == "0000:01:00.0" and entry["pid"] == os.getpid()
    assert entry["command"] == ["python", "train.py"] and entry["job_id"] == lease.job_id
    assert entry["user"] == pwd.getpwuid(os.getuid()).pw_name and entry["holder_alive"] is True
    assert entry["since"][:4].isdigit() and "T" in entry["since"]  # ISO 8601, with offset
    [queued] = doc["waiting"]
    assert set(queued) == {"position", "waiting_for", "stopped", "owner", "ignored", *HOLDER_KEYS}
    assert queued["owner"] == f"user {pwd.getpwuid(os.getuid()).pw_name}"
    assert queued["ignored"] is None
    assert queued["position"] == 1 and queued["pid"] == waiter.pid
    assert queued["command"] == ["lease_worker", "hold", "1"]
    assert _status_json(lock_dir)["leases"] == [] and _status_json(lock_dir)["waiting"] == []


def test_status_table(lock_dir: Path, inventory: Inventory, plan_for: PlanFor) -> None:
    _plan, lease = LeaseManager(lock_dir).allocate(
        plan_for(inventory, "2"), command=["/usr/bin/python3", "train.py"]
    )
    with lease:
        result = CliRunner().invoke(status, ["--lock-dir", str(lock_dir)])
    lines = result.output.splitlines()
    assert result.exit_code == 0
    assert lines[0] == f"lock directory: {lock_dir} (shared)"
    assert lines[2].split() == ["DEVICE", "PID", "USER", "SINCE", "JOB", "COMMAND"]
    for line, key in zip(lines[3:5], ("0000:01:00.0", "0000:02:00.0"), strict=True):
        cells = line.split()
        assert cells[:2] == [key, str(os.getpid())] and cells[4] == lease.job_id
        assert line.endswith("python3 train.py")


def test_status_keeps_a_command_with_a_newline_on_its_row(
    lock_dir: Path, one_card: Inventory, plan_for: PlanFor
) -> None:
    """A launch's argument may hold a newline (``python -c "a<newline>b"``); in a shared lock
    directory its second line would read as a lease row of its own."""
    forged = "x\n0000:09:00.0  1  root  10:00  job-9  python3 train.py"
    _plan, lease = LeaseManager(lock_dir).allocate(
        plan_for(one_card, "1"), command=["python3", "-c", forged]
    )
    with lease:
        result = CliRunner().invoke(status, ["--lock-dir", str(lock_dir)])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[3].startswith("0000:01:00.0") and "\\x0a0000:09:00.0" in lines[3]
    assert not any(line.startswith("0000:09:00.0") for line in lines)


def test_status_of_missing_or_empty_directory(tmp_path: Path) -> None:
    result = CliRunner().invoke(status, ["--lock-dir", str(tmp_path / "none")])
    assert "does not exist yet" in result.output and result.exit_code == 0
    result = CliRunner().invoke(status, ["--lock-dir", str(tmp_path)])
    assert "no devices are leased" in result.output


def test_status_through_the_real_entry_point(
    lock_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    env = {**os.environ, "XPULAUNCH_LOCK_DIR": str(lock_dir)}
    done = subprocess.run(
        [sys.executable, "-m", "xpulaunch", "status", "--json"],
        capture_output=True,
        text=True,
        env=env,
        timeout=30,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["lock_dir"] == str(lock_dir)  # from XPULAUNCH_LOCK_DIR

    (tmp_path / "file").write_text("")
    done = _xpulaunch("status", "--lock-dir", str(tmp_path / "file"))
    assert done.returncode == 2 and done.stdout == ""  # click's own check: a usage error
    assert done.stderr.startswith("xpulaunch: error: --lock-dir: Directory ")
    assert done.stderr.count("\n") == 1

    planted = tmp_path / "planted"
    planted.mkdir()
    os.mkfifo(planted / "unit-0000%3A01%3A00.0.lock")
    done = _xpulaunch("status", "--lock-dir", str(planted))
    # Not a lease: anyone may plant names in a shared directory, and status (like every
    # launch) goes on; a launch that wants that very device fails naming the file's owner.
    assert done.returncode == 0, done.stderr
    assert "no devices are leased" in done.stdout


def _xpulaunch(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "xpulaunch", *args],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )


def _lease_fields(*args: str, env: dict[str, str] | None = None) -> dict[str, Any]:
    request = run_request(*args, env=env)
    return {"lock_dir": request.lock_dir, "shared": request.shared, "wait": request.wait,
            "timeout": request.wait_timeout_s}  # fmt: skip


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        ([], {"lock_dir": None, "shared": False, "wait": False, "timeout": None}),
        (["--wait"], {"lock_dir": None, "shared": False, "wait": True, "timeout": None}),
        (
            ["--wait-timeout", "2.5"],
            {"lock_dir": None, "shared": False, "wait": True, "timeout": 2.5},
        ),
        (
            ["--shared", "--lock-dir", "/srv/locks"],
            {"lock_dir": "/srv/locks", "shared": True, "wait": False, "timeout": None},
        ),
    ],
)
def test_lease_options_parse(
    args: list[str], expected: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("XPULAUNCH_LOCK_DIR")
    assert _lease_fields(*args) == expected


def test_lock_dir_comes_from_the_environment() -> None:
    fields = _lease_fields(env={"XPULAUNCH_LOCK_DIR": "/srv/shared-locks"})
    assert fields["lock_dir"] == "/srv/shared-locks"


def test_negative_wait_timeout_is_refused() -> None:
    assert "--wait-timeout" in run_refused("--wait-timeout", "-1")


def test_wait_line_and_reporter_on_a_log() -> None:
    first = WaitStatus(3.2, 1, "--gpus 1: only 0 free", 60.0)
    assert wait_line(first) == "waiting 3 s of 60 for devices (next in line): --gpus 1: only 0 free"
    assert "(3rd in line)" in wait_line(WaitStatus(1, 3, "2 earlier launch(es) go first"))
    log = io.StringIO()
    reporter = WaitReporter(log, log_every_s=30)
    reporter.on_wait(first)
    reporter.on_wait(WaitStatus(10.0, 1, "--gpus 1: only 0 free", 60.0))  # same: not repeated
    reporter.on_wait(WaitStatus(40.0, 1, "--gpus 1: only 0 free", 60.0))  # 30 s later: repeated
    reporter.on_wait(WaitStatus(41.0, 1, "something else", 60.0))  # changed: reported
    lines = log.getvalue().splitlines()
    assert [line.split()[2] for line in lines] == ["3", "40", "41"]
    assert all(line.startswith("xpulaunch: waiting ") for line in lines)


def test_reporter_rewrites_one_line_on_a_terminal() -> None:
    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    tty = Tty()
    with WaitReporter(tty) as reporter:
        reporter.on_wait(WaitStatus(1.0, 2, "1 earlier launch(es) go first"))
        reporter.on_wait(WaitStatus(2.0, 1, "--gpus 1: only 0 free"))
        # the holder's command line, in the reason, may hold a newline of its own
        reporter.on_wait(WaitStatus(3.0, 1, "pid 9 (python -c 'a\nb')"))
    out = tty.getvalue()
    assert "\n" not in out and out.count("\r\x1b[K") == 4 and out.endswith("\r\x1b[K")
    assert "python -c 'a\\x0ab'" in out
