"""A log file that cannot be written (full disk) never stops supervision."""

from __future__ import annotations

import os
from pathlib import Path

from fault_cli import Launch, finish

CHATTY = "import sys\nfor i in range(3000): print('x' * 200)\nprint('done', file=sys.stderr)"


def test_a_full_log_disk_warns_once_and_the_job_finishes(launch: Launch, tmp_path: Path) -> None:
    log_dir = tmp_path / "logs"
    (log_dir / "attempt_0").mkdir(parents=True)
    for rank in ("0", "1"):  # /dev/full fails every write with ENOSPC, as a full disk does
        os.symlink("/dev/full", log_dir / "attempt_0" / f"{rank}.log")
    proc = launch(
        "run", "--log-dir", str(log_dir), "--nproc-per-node", "2", "python3", "-c", CHATTY
    )
    status, out, err = finish(proc)
    assert status == 0, err
    assert "Traceback" not in err
    assert out.count("x" * 200) == 6000  # the console kept everything
    assert err.count("done") == 2
    warnings = [line for line in err.splitlines() if "log file" in line]
    assert len(warnings) == 2, err  # once per file, not once per line
    assert "No space left on device" in warnings[0]


def test_a_log_dir_that_fails_later_does_not_stop_the_job(launch: Launch, tmp_path: Path) -> None:
    log_dir = tmp_path / "logs"
    log_dir.mkdir()
    (log_dir / "attempt_0").write_text("a file where a directory must go\n")
    proc = launch("run", "--log-dir", str(log_dir), "python3", "-c", "print('ran')")
    status, out, err = finish(proc)
    assert (status, "Traceback" in err) == (0, False), err
    assert "ran" in out
    assert "log file" in err


def test_a_crash_loop_keeps_the_first_and_the_last_attempts(launch: Launch, tmp_path: Path) -> None:
    log_dir = tmp_path / "logs"
    args = ["--log-dir", str(log_dir), "--max-restarts", "30", "--backoff", "0"]
    code, _, err = finish(launch("run", *args, "python3", "-c", "print('x'); exit(3)"))
    assert code == 3, err
    attempts = log_dir.glob("attempt_*")  # beside them: summary.json
    kept = sorted(int(p.name.split("_")[1]) for p in attempts)
    assert kept == [0, *range(11, 31)]
    assert (log_dir / "attempt_30" / "0.log").read_text().endswith("Z x\n")  # time-stamped
