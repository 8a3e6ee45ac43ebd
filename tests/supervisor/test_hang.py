"""Hang detection (by output and by heartbeat) and --max-runtime, with real processes."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from helpers import wait_for
from run_kit import read_events, xpulaunch
from xpulaunch.errors import UsageError
from xpulaunch.events import Event, Exited, HangDetected, Started, Stopped
from xpulaunch.joblog.logs import LogConfig
from xpulaunch.supervisor.hang import HANG_STATUS
from xpulaunch.supervisor.restart import RestartMode, RestartPolicy
from xpulaunch.supervisor.supervisor import Supervisor, WorkerSpec

TIMEOUT_S = 1.5


def supervise(argv: list[str], tmp_path: Path, **kw: object) -> tuple[Supervisor, list[Event]]:
    events: list[Event] = []
    policy = kw.pop("policy", RestartPolicy(max_restarts=1, backoff_initial_s=0.0))
    spec = WorkerSpec("0", argv, dict(os.environ))
    sup = Supervisor(
        [spec],
        policy,
        grace_s=2.0,
        logs=LogConfig(console=False),  # type: ignore[arg-type]
        on_event=events.append,
        record_dir=tmp_path / "records",
        **kw,
    )  # type: ignore[arg-type]
    return sup, events


def test_a_silent_worker_is_detected_in_time_and_restarted(
    script: Callable[[str], str], tmp_path: Path
) -> None:
    sup, events = supervise([sys.executable, script("silent.py")], tmp_path,
                            hang_timeout_s=TIMEOUT_S)  # fmt: skip
    sup.start()
    try:
        wait_for(lambda: len([e for e in events if isinstance(e, Started)]) == 2, 60)
    finally:
        sup.stop()
    first = next(e for e in events if isinstance(e, Started))
    (hang, *_) = [e for e in events if isinstance(e, HangDetected)]
    assert hang.name == "0" and hang.watched == "output" and hang.pid == first.pid
    assert TIMEOUT_S <= hang.time_s - first.time_s <= TIMEOUT_S + 1.0
    assert hang.silent_s >= TIMEOUT_S
    stopped = next(e for e in events if isinstance(e, Exited))
    assert stopped.expected and stopped.signal == "SIGTERM"  # failed, then stopped by us


def test_a_worker_that_keeps_beating_is_left_alone(
    script: Callable[[str], str], tmp_path: Path
) -> None:
    # Silent for three timeouts, but beating: not a hang. It finishes on its own.
    argv = [sys.executable, script("beats.py"), str(3 * TIMEOUT_S)]
    sup, events = supervise(argv, tmp_path, hang_timeout_s=TIMEOUT_S, heartbeat=True)
    sup.start()
    assert sup.wait(60) == 0
    assert not [e for e in events if isinstance(e, HangDetected)]
    assert [e.exit_code for e in events if isinstance(e, Exited)] == [0]


def test_a_worker_that_stops_beating_is_a_hang_even_when_it_prints(
    tmp_path: Path,
) -> None:
    chatty = "import time\nwhile True:\n    print('still here', flush=True)\n    time.sleep(0.1)\n"
    sup, events = supervise([sys.executable, "-c", chatty], tmp_path, hang_timeout_s=TIMEOUT_S,
                            heartbeat=True, policy=RestartPolicy(mode=RestartMode.NO))  # fmt: skip
    sup.start()
    assert sup.wait(60) == HANG_STATUS  # failed as hung (its own 143 is the SIGTERM)
    (hang,) = [e for e in events if isinstance(e, HangDetected)]
    assert hang.watched == "heartbeat"
    stopped = events[-1]
    assert isinstance(stopped, Stopped) and stopped.reason == "worker 0 failed"


def test_heartbeat_without_a_hang_timeout_is_refused(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="hang_timeout_s"):
        supervise(["true"], tmp_path, heartbeat=True)


def test_the_cli_reports_the_hang_and_the_missing_py_spy(
    script: Callable[[str], str], tmp_path: Path
) -> None:
    logs = tmp_path / "logs"
    no_py_spy = {"PATH": "/usr/bin:/bin"}  # py-spy is a dev dependency, in the venv's bin
    done = xpulaunch("--hang-timeout", "1", "--log-dir", str(logs), script("silent.py"),
                     env=no_py_spy)  # fmt: skip
    assert done.returncode != 0
    assert "worker 0 silent for 1 s (no output): treating it as failed" in done.stderr
    assert "no stack dump (py-spy is not installed)" in done.stderr
    assert "gave up: no restarts were requested" in done.stderr
    cause = json.loads((logs / "summary.json").read_text())["root_cause"]
    assert (cause["type"], cause["source"]) == ("HangDetected", "supervisor")


def test_max_runtime_ends_the_job_with_124(script: Callable[[str], str], tmp_path: Path) -> None:
    stream = tmp_path / "events.jsonl"
    done = xpulaunch("--max-runtime", "1", "--events", str(stream), script("sleeps.py"))
    assert done.returncode == 124, done.stderr
    assert "ran for --max-runtime 1 s: stopping every worker" in done.stderr
    assert "SIGTERM: stopping" not in done.stderr  # no signal came from the user
    events = read_events(stream)
    names = [e["event"] for e in events]
    assert names[names.index("timed_out") :] == ["timed_out", "stopping", "exited", "stopped",
                                                 "lease_released"]  # fmt: skip
    assert events[names.index("stopping")]["cause"] == "max_runtime"
    assert events[names.index("stopped")]["exit_code"] == 124


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--heartbeat"], "--heartbeat needs --hang-timeout"),
        (["--hang-timeout", "0"], "--hang-timeout: '0' is not a number of seconds > 0"),
        (["--max-runtime", "-3"], "--max-runtime: '-3' is not a number of seconds > 0"),
    ],
)
def test_bad_values_are_one_line_errors(
    script: Callable[[str], str], args: list[str], message: str
) -> None:
    done = xpulaunch(*args, script("sleeps.py"))
    assert done.returncode == 2 and message in done.stderr, done.stderr
    assert "Traceback" not in done.stderr


def test_with_py_spy_the_stacks_go_to_the_log_before_the_restart(
    script: Callable[[str], str], tmp_path: Path
) -> None:
    logs = tmp_path / "logs"
    venv_bin = str(Path(sys.executable).parent)  # where the dev extra installed py-spy
    path = {"PATH": f"{venv_bin}:/usr/bin:/bin"}
    done = xpulaunch("--hang-timeout", "1", "--log-dir", str(logs), "--max-restarts", "1",
                     "--backoff", "0", script("silent.py"), env=path)  # fmt: skip
    assert done.returncode != 0
    assert "py-spy is not installed" not in done.stderr
    for attempt in (0, 1):
        log = (logs / f"attempt_{attempt}" / "0.log").read_text()
        assert "xpulaunch: py-spy dump of the silent process:" in log
        assert "<module> (silent.py:4)" in log  # where it sleeps: the stack, read for real
    assert "restarting worker 0" in done.stderr


def test_the_stack_dump_is_shown_once(script: Callable[[str], str]) -> None:
    """It was printed live, then again as the worker's "last lines" when the job gave up."""
    venv_bin = str(Path(sys.executable).parent)  # where the dev extra installed py-spy
    path = {"PATH": f"{venv_bin}:/usr/bin:/bin"}
    done = xpulaunch("--hang-timeout", "1", script("silent.py"), env=path)
    assert done.returncode == 123, done.stderr
    assert done.stderr.count("py-spy dump of the silent process:") == 1, done.stderr
    assert done.stderr.count("(silent.py:4)") == 1, done.stderr
    assert "last lines of worker 0's stderr" not in done.stderr
    assert "worker 0 failed first: it was silent for" in done.stderr
