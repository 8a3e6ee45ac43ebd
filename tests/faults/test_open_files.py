"""Hundreds of workers at a low ``ulimit -n``: raised to what the job needs, or a clear error
naming the need (not a worker that 'cannot be started' with status 127)."""

from __future__ import annotations

import resource
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from fault_cli import Launch, finish


def limited(soft: int, hard: int) -> Callable[[], None]:
    return lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_the_soft_limit_is_raised_to_what_the_job_needs(launch: Launch) -> None:
    proc = launch("run", "--nproc-per-node", "150", "true", preexec_fn=limited(256, 4096))
    code, _, err = finish(proc, timeout_s=120)
    assert code == 0, err[-2000:]


def test_a_hard_limit_too_low_names_what_is_needed(launch: Launch) -> None:
    proc = launch("run", "--nproc-per-node", "150", "true", preexec_fn=limited(256, 256))
    code, _, err = finish(proc, timeout_s=120)
    assert code == 1, err[-2000:]
    assert err.count("\n") <= 2 and "Traceback" not in err
    assert "150 workers need about 514 open files" in err
    assert "ulimit -n" in err


@pytest.mark.parametrize(("layout", "workers"), [("torchrun", "40"), ("xpulaunch", "60")])
def test_log_files_count_in_what_the_job_needs(
    launch: Launch, tmp_path: Path, layout: str, workers: str
) -> None:
    # Each worker's log file takes a descriptor too (two in torchrun's layout): not counted,
    # worker 37 or 57 "could not be started" (exit 126, blaming the program).
    args = ("--log-dir", str(tmp_path / layout), "--log-layout", layout)
    proc = launch("run", "--nproc-per-node", workers, *args, "sh", "-c", "sleep 1",
                  preexec_fn=limited(200, 4096))  # fmt: skip
    code, _, err = finish(proc, timeout_s=120)
    assert code == 0, err[-2000:]


# Uses up its descriptors, then starts a job: spawning fails with EMFILE.
EXHAUSTED = """
import os, resource, sys
from xpulaunch.errors import LaunchError
from xpulaunch.supervisor.supervisor import Supervisor, WorkerSpec
resource.setrlimit(resource.RLIMIT_NOFILE, (200, 200))
held = []
try:
    while True:
        held.append(os.open("/dev/null", os.O_RDONLY))
except OSError:
    pass
for fd in held[-12:]:  # room for the supervisor's own few, none for a worker's pipes
    os.close(fd)
try:
    Supervisor([WorkerSpec("0", ["true"], dict(os.environ))], record_dir=sys.argv[1]).start()
except LaunchError as exc:
    print(exc.exit_code, exc, flush=True)
"""


def test_out_of_descriptors_is_said_to_be_ours_not_the_programs(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-c", EXHAUSTED, str(tmp_path / "records")],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    code, _, message = done.stdout.strip().partition(" ")
    assert code == "1", done.stdout  # not 126: the program is not at fault
    assert "xpulaunch itself ran out of open files ('ulimit -n' is 200)" in message
