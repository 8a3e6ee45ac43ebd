"""Faults on the ``xpulaunch run`` path, each with a real launch: a stderr that cannot be
written (``2>/dev/full``, a full disk under ``2>>job.err``), and a program that is "Text file
busy" when it is first started."""

from __future__ import annotations

from pathlib import Path

import pytest

from fault_cli import Launch, finish


def test_a_stderr_that_fails_every_write_still_runs_the_job(launch: Launch, tmp_path: Path) -> None:
    """xpulaunch's own lines are dropped; the job runs and its status is the exit status (it
    used to be 1, the program never started, and nothing said so)."""
    ran = tmp_path / "ran"
    with open("/dev/full", "wb") as full:
        proc = launch("run", "--gpus", "none", "--", "sh", "-c", f"echo RAN > {ran}", stderr=full)
        assert proc.wait(timeout=60) == 0
        assert ran.read_text() == "RAN\n"
        failing = launch("run", "--gpus", "none", "--", "sh", "-c", "exit 3", stderr=full)
        assert failing.wait(timeout=60) == 3


@pytest.mark.parametrize("args", [["--gpus", "banana", "true"], ["--grace", "nan", "true"]])
def test_a_usage_error_is_still_2_with_such_a_stderr(launch: Launch, args: list[str]) -> None:
    with open("/dev/full", "wb") as full:
        assert launch("run", *args, stderr=full).wait(timeout=60) == 2


@pytest.mark.parametrize("cgroup", ["", "0"])
def test_a_program_busy_at_its_first_start_is_retried_under_a_restart_policy(
    launch: Launch, tmp_path: Path, cgroup: str
) -> None:
    """A script held open for writing (a copy or a build still finishing) cannot be executed
    (ETXTBSY). Under --restart on-failure that first start is a failed attempt like any other,
    retried after the backoff; it used to end the job at once with 126. ("0": no job cgroup,
    so setpriv may start the worker; it then exits 126 itself, which was retried already.)"""
    program = tmp_path / "program"
    program.write_text("#!/bin/sh\necho STARTED\n")
    program.chmod(0o755)
    env = {"XPULAUNCH_CGROUP": cgroup}
    with open(program, "a") as writer:  # closed at the first failure
        # Unbuffered: readline takes no more than the line, for communicate() to read the rest.
        args = ("--restart", "on-failure", "--max-restarts", "2", "--backoff", "0.2")
        proc = launch("run", *args, str(program), env=env, bufsize=0)
        assert proc.stderr is not None
        seen = b""
        while b"busy" not in seen:  # the first start failed: let the restart find it free
            line = proc.stderr.readline()
            assert line, "xpulaunch ended before its first start failed"
            seen += line
        writer.close()
        code, out, err = finish(proc)
    assert code == 0, seen.decode() + err
    assert "STARTED" in out and "restarting" in (seen.decode() + err)


def test_other_exec_errors_stay_immediate_under_a_restart_policy(
    launch: Launch, tmp_path: Path
) -> None:
    proc = launch("run", "--restart", "on-failure", "--max-restarts", "2", str(tmp_path / "gone"))
    code, _, err = finish(proc, timeout_s=30)
    assert code == 127 and err.count("error:") == 1


def test_busy_without_a_restart_policy_fails_at_once(launch: Launch, tmp_path: Path) -> None:
    program = tmp_path / "program"
    program.write_text("#!/bin/sh\necho STARTED\n")
    program.chmod(0o755)
    with open(program, "a"):
        code, out, err = finish(launch("run", str(program)), timeout_s=30)
    assert code == 126 and "STARTED" not in out
    assert "Text file busy" in err and err.count("error:") == 1
