"""``xpulaunch logs``: ``-f`` ends when the run is over or gone; logs are streamed in
constant memory; only regular files are read; the folder holding ``logs/`` finds it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from fault_cli import Launch, finish
from helpers import one_line_error, wait_for

PRINTING = "import time\nfor i in range(40):\n    print('line', i, flush=True)\n    time.sleep(0.2)"


def _following(launch: Launch, logs: Path) -> subprocess.Popen[bytes]:
    log = logs / "attempt_0" / "0.log"
    wait_for(lambda: log.exists() and "line 0" in log.read_text(), "the run's first line")
    return launch("logs", str(logs), "-f")


def test_follow_ends_when_the_run_directory_is_removed(launch: Launch, tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    job = launch("run", "--log-dir", str(logs), sys.executable, "-c", PRINTING)
    follower = _following(launch, logs)
    time.sleep(0.5)
    subprocess.run(["rm", "-rf", str(logs)], check=True)
    code, out, err = finish(follower, timeout_s=10)  # it used to follow for ever
    assert code == 0, err
    assert "line 0" in out
    job.send_signal(signal.SIGTERM)
    finish(job)


def test_follow_ends_when_the_supervisor_was_killed(launch: Launch, tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    job = launch("run", "--log-dir", str(logs), sys.executable, "-c", PRINTING)
    follower = _following(launch, logs)
    time.sleep(0.5)
    job.kill()  # no summary.json will ever come
    job.wait()
    code, out, err = finish(follower, timeout_s=10)  # it used to follow for ever
    assert code == 0, err
    assert "line 0" in out
    assert not (logs / "summary.json").exists()


def test_follow_goes_on_while_a_second_run_of_the_same_log_dir_runs(
    launch: Launch, tmp_path: Path
) -> None:
    logs = tmp_path / "logs"
    finish(launch("run", "--log-dir", str(logs), "true"))  # an earlier run's summary.json
    job = launch("run", "--log-dir", str(logs), sys.executable, "-c", PRINTING)
    follower = _following(launch, logs)
    time.sleep(1.5)
    assert follower.poll() is None  # a summary.json of the earlier run is not this run's end
    job.send_signal(signal.SIGTERM)
    finish(job)
    code, out, _ = finish(follower, timeout_s=10)
    assert code == 0 and "line 0" in out


def test_a_finished_run_leaves_no_lock_and_its_follower_ends(
    launch: Launch, tmp_path: Path
) -> None:
    """``.running.lock`` was left in every ``--log-dir`` after its run; its summary.json says
    the run is over, and ``logs -f`` reads that."""
    logs = tmp_path / "logs"
    code, _, err = finish(launch("run", "--log-dir", str(logs), sys.executable, "-c", "print(1)"))
    assert code == 0, err
    assert sorted(p.name for p in logs.iterdir()) == ["attempt_0", "summary.json"]
    code, out, err = finish(launch("logs", str(logs), "-f"), timeout_s=10)
    assert code == 0 and out.rstrip().endswith("1"), err


def test_a_lock_another_run_holds_is_not_removed(tmp_path: Path) -> None:
    from xpulaunch.joblog.logs import RUNNING_LOCK, hold_running_lock, remove_running_lock

    held = hold_running_lock(tmp_path)
    assert held is not None
    remove_running_lock(tmp_path)  # the run that holds it is not over
    assert (tmp_path / RUNNING_LOCK).exists()
    os.close(held)
    remove_running_lock(tmp_path)
    assert not (tmp_path / RUNNING_LOCK).exists()
    remove_running_lock(tmp_path)  # gone already: nothing to do


MEASURE = """
import resource, subprocess, sys
subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL, check=True)
print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss // 1024)
"""


def test_logs_streams_a_large_log_in_constant_memory(tmp_path: Path) -> None:
    attempt = tmp_path / "logs" / "attempt_0"
    attempt.mkdir(parents=True)
    for rank in ("0", "1"):  # 2 x 40 MB, time-stamped lines as a run writes them
        line = f"2026-11-26T13:03:{rank}0.000Z " + "x" * 100 + "\n"
        (attempt / f"{rank}.log").write_text(line * 380_000)
    argv = [sys.executable, "-m", "xpulaunch", "logs", str(tmp_path / "logs")]
    done = subprocess.run([sys.executable, "-c", MEASURE, *argv],
                          capture_output=True, text=True, timeout=120, check=True)  # fmt: skip
    peak_mib = int(done.stdout.strip())
    assert peak_mib < 60, peak_mib  # it used to hold both files, several times over


def test_a_log_that_is_a_fifo_or_a_device_is_refused(launch: Launch, tmp_path: Path) -> None:
    attempt = tmp_path / "logs" / "attempt_0"
    attempt.mkdir(parents=True)
    os.mkfifo(attempt / "0.log")
    code, _, err = finish(launch("logs", str(tmp_path / "logs")), timeout_s=10)  # used to hang
    assert code == 2
    assert "not a regular file" in one_line_error(err)
    (attempt / "0.log").unlink()
    (attempt / "0.log").symlink_to("/dev/zero")
    code, _, err = finish(launch("logs", str(tmp_path / "logs")), timeout_s=10)  # used: 10 GB
    assert code == 2
    assert "not a regular file" in one_line_error(err)


def test_logs_in_the_folder_that_holds_the_log_dir(launch: Launch, tmp_path: Path) -> None:
    code, _, err = finish(launch("run", "--log-dir", "logs", "echo", "hello", cwd=tmp_path))
    assert code == 0, err
    code, out, err = finish(launch("logs", cwd=tmp_path))
    assert code == 0, err
    assert out.rstrip().endswith("Z hello")  # it used to print nothing, status 0
    assert "reading logs" in err
