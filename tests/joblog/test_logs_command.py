"""``xpulaunch logs``: a run's log files read back, merged, filtered and followed."""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from helpers import wait_for
from run_kit import XPULAUNCH, xpulaunch
from xpulaunch.joblog.log_reader import LogFollower

STAMP = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z "


def logs(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([XPULAUNCH, "logs", *args], capture_output=True, text=True,
                          timeout=60, check=False)  # fmt: skip


@pytest.fixture
def run_dir(tmp_path: Path, script: Callable[[str], str]) -> Path:
    """A real two-worker run in which each worker crashed once and was restarted (each on its
    own: in a gang the second could be stopped before it wrote its traceback)."""
    folder = tmp_path / "logs"
    done = xpulaunch("--log-dir", str(folder), "--nproc-per-node", "2", "--max-restarts", "1",
                     "--no-gang", "--backoff", "0", script("crash_once.py"))  # fmt: skip
    assert done.returncode == 0, done.stderr
    return folder


def test_every_worker_of_the_last_attempt_merged_with_prefixes(run_dir: Path) -> None:
    done = logs(str(run_dir))
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert sorted(line[:4] for line in lines) == ["[0] ", "[1] "]
    assert all(re.match(r"\[\d\] " + STAMP + "second attempt is fine$", line) for line in lines)


def test_one_rank_of_an_earlier_attempt(run_dir: Path) -> None:
    done = logs(str(run_dir), "--rank", "1", "--attempt", "0")
    assert done.returncode == 0, done.stderr
    assert re.match(STAMP + "Traceback", done.stdout)  # no prefix for a single worker
    assert done.stdout.rstrip().endswith("RuntimeError: first attempt crashes")


def test_the_run_dir_comes_from_the_environment(run_dir: Path) -> None:
    env = {**os.environ, "XPULAUNCH_LOG_DIR": str(run_dir)}
    done = subprocess.run([XPULAUNCH, "logs", "--rank", "0"], capture_output=True, text=True,
                          env=env, check=False)  # fmt: skip
    assert "second attempt is fine" in done.stdout


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--attempt", "7"], "--attempt 7: {dir} has attempts 0,1"),
        (["--rank", "5"], "--rank 5: no log in attempt 1; there are 0,1"),
    ],
)
def test_bad_choices_are_one_line_errors(run_dir: Path, args: list[str], message: str) -> None:
    done = logs(str(run_dir), *args)
    assert done.returncode == 2
    assert message.format(dir=run_dir) in done.stderr and "Traceback" not in done.stderr


def test_not_a_run_dir(tmp_path: Path) -> None:
    done = logs(str(tmp_path))
    assert done.returncode == 2 and "no attempt_N directories" in done.stderr


def test_follow_prints_new_lines_until_the_summary_appears(tmp_path: Path) -> None:
    attempt = tmp_path / "attempt_0"
    attempt.mkdir()
    log = attempt / "0.log"
    log.write_bytes(b"2026-11-23T23:00:00.000Z first\n")
    proc = subprocess.Popen([XPULAUNCH, "logs", "-f", str(tmp_path)], stdout=subprocess.PIPE,
                            text=True)  # fmt: skip
    assert proc.stdout is not None
    try:
        assert proc.stdout.readline() == "2026-11-23T23:00:00.000Z first\n"
        with open(log, "ab") as handle:
            handle.write(b"2026-11-23T23:00:01.000Z sec")
            handle.flush()
            handle.write(b"ond\n")
        assert proc.stdout.readline() == "2026-11-23T23:00:01.000Z second\n"
        (tmp_path / "summary.json").write_text("{}")
        assert proc.wait(timeout=60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.communicate()


def test_follow_goes_on_into_the_attempt_a_restart_starts(tmp_path: Path) -> None:
    """-f follows the run, not only the attempt it began in: the lines of a restarted
    worker (attempt_1) are printed as they come, after what attempt_0 wrote last."""
    run, out, err = tmp_path / "run", tmp_path / "out", tmp_path / "err"
    (run / "attempt_0").mkdir(parents=True)
    (run / "attempt_0" / "0.log").write_bytes(b"2026-11-23T23:00:00.000Z first try\n")
    with open(out, "wb") as stdout, open(err, "wb") as stderr:
        proc = subprocess.Popen([XPULAUNCH, "logs", "-f", str(run)], stdout=stdout, stderr=stderr)
    try:
        wait_for(lambda: b"first try" in out.read_bytes(), "the first line")
        with open(run / "attempt_0" / "0.log", "ab") as handle:
            handle.write(b"2026-11-23T23:00:01.000Z crashed\n")
        (run / "attempt_1").mkdir()
        (run / "attempt_1" / "0.log").write_bytes(b"2026-11-23T23:00:02.000Z second try\n")
        wait_for(lambda: b"second try" in out.read_bytes(), "attempt 1's line, while it runs")
        assert proc.poll() is None
        (run / "summary.json").write_text("{}")
        assert proc.wait(timeout=60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert out.read_text().splitlines() == [
        "2026-11-23T23:00:00.000Z first try",
        "2026-11-23T23:00:01.000Z crashed",
        "2026-11-23T23:00:02.000Z second try",
    ]
    assert err.read_text() == "xpulaunch: attempt 1 started (a restart)\n"


def test_a_followed_log_truncated_or_rotated_is_read_again_from_its_start(
    tmp_path: Path,
) -> None:
    """logrotate's copytruncate (or ': > 0.log') and a rotation by rename: the lines written
    after it come whole, not lost (truncated) nor cut from the middle (rotated)."""
    log = tmp_path / "0.log"
    log.write_bytes(b"2026-11-23T23:00:00.000Z a first line, longer than what follows\n")
    follower = LogFollower([("0", log)])
    assert [line for _, line in follower.read()] == [
        b"2026-11-23T23:00:00.000Z a first line, longer than what follows"
    ]
    with open(log, "r+b") as handle:  # copytruncate: the same file, cut to nothing
        handle.truncate(0)
    with open(log, "ab") as handle:
        handle.write(b"2026-11-23T23:00:01.000Z after the truncation\n")
    assert follower.read() == [("0", b"2026-11-23T23:00:01.000Z after the truncation")]
    log.rename(tmp_path / "0.log.1")  # a rotation: a new file takes the name
    log.write_bytes(b"2026-11-23T23:00:02.000Z in the new file, a line longer than the old\n")
    assert follower.read() == [
        ("0", b"2026-11-23T23:00:02.000Z in the new file, a line longer than the old")
    ]
    assert follower.read() == []
