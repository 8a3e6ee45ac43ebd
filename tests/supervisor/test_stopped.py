"""Stopped (SIGSTOP) workers and hanging health checks, with real processes and signals.

A stopped process leaves a caught SIGTERM pending until it is continued, so the supervisor
sends SIGCONT right after the stop signal; with a 30 s grace these tests would take more than
30 s without it. A health check that never answers must not hold the interpreter at exit.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest

from process_kit import alive, pids_in, wait_for
from xpulaunch.events import Event, Exited, Started, Unhealthy
from xpulaunch.joblog.logs import LogConfig
from xpulaunch.supervisor.restart import RestartMode, RestartPolicy
from xpulaunch.supervisor.supervisor import HealthCheck, Supervisor, WorkerSpec

Argv = Callable[..., list[str]]
LONG_GRACE_S = 30.0
BOUND_S = 20.0  # generous, but well before the grace would have run out


def stop_all(pids: list[int]) -> None:
    for pid in pids:
        os.kill(pid, signal.SIGSTOP)
    wait_for(lambda: all(psutil.Process(p).status() == psutil.STATUS_STOPPED for p in pids))


def noted_term(out: Path) -> set[int]:
    return {int(p.stem) for p in out.glob("*.term")}


def test_stop_continues_a_stopped_tree_so_it_can_exit_cleanly(
    child: Argv, tmp_path: Path, record_dir: Path
) -> None:
    out = tmp_path / "pids"
    out.mkdir()
    worker = WorkerSpec("0", child("tree.py", out, "--note-term"), dict(os.environ))
    sup = Supervisor([worker], RestartPolicy(mode=RestartMode.NO), grace_s=LONG_GRACE_S,
                     logs=LogConfig(console=False), record_dir=record_dir)  # fmt: skip
    sup.start()
    wait_for(lambda: len(pids_in(out)) == 3)
    pids = pids_in(out)
    stop_all(pids)  # the worker, its child and its setsid grandchild (outside its group)
    began = time.monotonic()
    assert sup.stop() == 0
    assert time.monotonic() - began < BOUND_S
    assert noted_term(out) == set(pids)  # each one was continued and acted on SIGTERM
    assert not [p for p in pids if alive(p)]


def test_a_stopped_worker_failing_liveness_is_replaced_well_within_the_grace(
    child: Argv, tmp_path: Path, record_dir: Path
) -> None:
    out = tmp_path / "pids"
    out.mkdir()
    events: list[Event] = []
    sup: Supervisor

    def not_stopped() -> bool:  # a stopped server accepts connections but never answers
        pid = sup.status()[0].pid
        return pid is None or psutil.Process(pid).status() != psutil.STATUS_STOPPED

    probe = HealthCheck(not_stopped, interval_s=0.1, timeout_s=1.0, failure_threshold=2)
    worker = WorkerSpec("0", child("tree.py", out, "--note-term"), dict(os.environ),
                        liveness=probe)  # fmt: skip
    policy = RestartPolicy(mode=RestartMode.ALWAYS, max_restarts=2, backoff_initial_s=0.0)
    sup = Supervisor([worker], policy, grace_s=LONG_GRACE_S, logs=LogConfig(console=False),
                     on_event=events.append, record_dir=record_dir)  # fmt: skip
    sup.start()
    try:
        wait_for(lambda: len(pids_in(out)) == 3)
        first = pids_in(out)
        began = time.monotonic()
        stop_all(first)
        wait_for(lambda: len([e for e in events if isinstance(e, Started)]) == 2, BOUND_S)
        assert time.monotonic() - began < BOUND_S
        assert [type(e) for e in events if isinstance(e, Unhealthy)] == [Unhealthy]
        assert noted_term(out) == set(first)  # continued, then stopped by its own handler
        (exited,) = [e for e in events if isinstance(e, Exited)]
        assert exited.expected and exited.signal is None and exited.exit_code == 0
        assert not [p for p in first if alive(p)]
    finally:
        status = sup.stop()
    assert status == 0  # a requested stop is a success


HANGING_CHECK = """
    import os, sys, threading, time
    from xpulaunch.supervisor.restart import RestartMode, RestartPolicy
    from xpulaunch.joblog.logs import LogConfig
    from xpulaunch.supervisor.supervisor import HealthCheck, Supervisor, WorkerSpec

    asked = threading.Event()

    def check():  # like a server that accepted the connection and never answers
        asked.set()
        time.sleep(60)
        return True

    probe = HealthCheck(check, interval_s=0.05, timeout_s=0.2)
    worker = WorkerSpec("0", sys.argv[1:], dict(os.environ), readiness=probe)
    sup = Supervisor([worker], RestartPolicy(mode=RestartMode.NO), grace_s=5,
                     logs=LogConfig(console=False), record_dir=os.environ["RECORDS"])
    sup.start()
    assert asked.wait(30)
    print("stopped", sup.stop(), flush=True)
"""


@pytest.mark.timeout(60)
def test_a_hanging_health_check_does_not_delay_exit(
    child: Argv, tmp_path: Path, record_dir: Path
) -> None:
    script = tmp_path / "hanging_check.py"
    script.write_text(textwrap.dedent(HANGING_CHECK))
    proc = subprocess.Popen(
        [sys.executable, str(script), *child("sleeper.py")],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "RECORDS": str(record_dir)},
    )  # fmt: skip
    assert proc.stdout is not None
    try:
        line = proc.stdout.readline()
        stopped_at = time.monotonic()
        assert line == "stopped 0\n", proc.stderr.read() if proc.stderr else ""
        proc.wait(timeout=BOUND_S)  # the check sleeps 60 s: joining it would time out
        assert time.monotonic() - stopped_at < 10.0
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.communicate(timeout=10)
    assert proc.returncode == 0
