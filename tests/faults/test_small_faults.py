"""Smaller faults, each with a real launch: a heartbeat that cannot be recorded, closed
standard streams, a hang's exit status, odd environment values, a metrics interval too short."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import pytest

from fault_cli import Launch, finish
from helpers import one_line_error, wait_for

HEARTBEATS = """
import pathlib, sys, time, xpulaunch
for step in range(15):
    xpulaunch.heartbeat()
    if step == 2:
        pathlib.Path(sys.argv[1]).touch()
    time.sleep(0.2)
print("trained")
"""


def test_a_heartbeat_whose_directory_is_gone_never_raises(launch: Launch, tmp_path: Path) -> None:
    logs, beating = tmp_path / "logs", tmp_path / "beating"
    proc = launch("run", "--log-dir", str(logs), "--hang-timeout", "30", "--heartbeat",
                  sys.executable, "-c", HEARTBEATS, str(beating))  # fmt: skip
    wait_for(beating.exists, "the worker to beat")
    shutil.rmtree(logs)
    code, out, err = finish(proc)
    assert code == 0, err  # the worker used to die of FileNotFoundError from heartbeat()
    assert "trained" in out
    assert err.count("heartbeat not recorded") == 1


def test_heartbeat_swallows_every_os_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import xpulaunch.in_worker as in_worker

    monkeypatch.setattr(in_worker, "_last_beat_s", float("-inf"))
    monkeypatch.setattr(in_worker, "_warned", False)
    monkeypatch.setenv(in_worker.HEARTBEAT_FILE_VAR, str(tmp_path / "gone" / "0.heartbeat"))
    in_worker.heartbeat()
    monkeypatch.setattr(in_worker, "_last_beat_s", float("-inf"))
    (tmp_path / "file").write_text("")
    monkeypatch.setenv(in_worker.HEARTBEAT_FILE_VAR, str(tmp_path / "file" / "beat"))
    in_worker.heartbeat()  # ENOTDIR
    assert capsys.readouterr().err.count("heartbeat not recorded") == 1


def _closing(fd: int) -> object:
    def close() -> None:
        os.close(fd)

    return close


@pytest.mark.parametrize("fd", [0, 1, 2])
def test_a_closed_standard_stream_is_treated_like_dev_null(
    launch: Launch, tmp_path: Path, fd: int
) -> None:
    ran = tmp_path / "ran"
    proc = launch("run", "sh", "-c", f"echo hi; touch {ran}", preexec_fn=_closing(fd))
    code, _, _ = finish(proc)
    assert code == 0  # >&- used to be a traceback; 2>&- exit 1 without running the job
    assert ran.exists()


def test_status_with_a_closed_stdout(launch: Launch) -> None:
    code, _, err = finish(launch("status", preexec_fn=_closing(1)))
    assert code == 0, err


def test_a_hang_ends_the_job_with_its_own_status(launch: Launch) -> None:
    silent = "import time; time.sleep(30)"
    proc = launch("run", "--hang-timeout", "0.5", sys.executable, "-c", silent)
    code, _, err = finish(proc)
    assert code == 123, err  # it used to be 143, as if xpulaunch had been sent SIGTERM
    assert "silent for" in err


@pytest.mark.parametrize("value", ["yes", "2", "true"])
def test_an_unknown_cgroup_setting_is_refused(launch: Launch, value: str) -> None:
    code, _, err = finish(launch("run", "true", env={"XPULAUNCH_CGROUP": value}))
    assert code == 2
    assert f"XPULAUNCH_CGROUP='{value}': expected 0" in one_line_error(err)


def test_a_metrics_interval_below_a_tenth_of_a_second_is_refused(launch: Launch) -> None:
    proc = launch("run", "--metrics-port", "0", "--metrics-interval", "0.001", "true")
    code, _, err = finish(proc)
    assert code == 2
    assert "--metrics-interval: '0.001' is not a number of seconds >= 0.1" in one_line_error(err)


EMBEDDED = """
import os, sys
from xpulaunch.supervisor.supervisor import Supervisor, WorkerSpec
spec = WorkerSpec("0", ["sh", "-c", "echo hi; touch " + sys.argv[1]], dict(os.environ))
with Supervisor([spec], record_dir=sys.argv[2]) as supervisor:
    sys.exit(supervisor.wait(30))
"""


@pytest.mark.parametrize("fd", [1, 2])
def test_the_python_api_runs_with_a_closed_standard_stream(tmp_path: Path, fd: int) -> None:
    import subprocess

    ran = tmp_path / "ran"
    argv = [sys.executable, "-c", EMBEDDED, str(ran), str(tmp_path / "records")]
    done = subprocess.run(argv, preexec_fn=_closing(fd), capture_output=fd == 1, timeout=60,
                          check=False)  # fmt: skip
    assert done.returncode == 0  # sys.stdout (or stderr) is None: it used to raise
    assert ran.exists()
