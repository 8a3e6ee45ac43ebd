"""The Supervisor API against real child processes."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from process_kit import alive, pids_in, wait_for
from xpulaunch.errors import LaunchError, UsageError
from xpulaunch.events import (
    Event,
    Exited,
    GaveUp,
    Ready,
    Restarting,
    Started,
    Stopped,
    Unhealthy,
    WorkerState,
)
from xpulaunch.joblog.logs import LogConfig
from xpulaunch.supervisor.restart import RestartMode, RestartPolicy
from xpulaunch.supervisor.supervisor import HealthCheck, Supervisor, WorkerSpec

Argv = Callable[..., list[str]]
QUIET = LogConfig(console=False)
NO_RESTART = RestartPolicy(mode=RestartMode.NO)
FAST = RestartPolicy(max_restarts=2, backoff_initial_s=0.0)


def spec(name: str, argv: list[str], **kwargs: object) -> WorkerSpec:
    return WorkerSpec(name, argv, dict(os.environ), **kwargs)  # type: ignore[arg-type]


def supervise(workers: list[WorkerSpec], policy: RestartPolicy, record_dir: Path, **kw: object):
    events: list[Event] = []
    kw.setdefault("logs", QUIET)
    kw.setdefault("grace_s", 2.0)
    sup = Supervisor(workers, policy, on_event=events.append, record_dir=record_dir, **kw)  # type: ignore[arg-type]
    return sup, events


def of(events: list[Event], kind: type) -> list:
    return [e for e in events if isinstance(e, kind)]


def test_success_is_zero(child: Argv, record_dir: Path) -> None:
    sup, events = supervise([spec("a", child("exit_with.py", 0))], NO_RESTART, record_dir)
    sup.start()
    assert sup.wait(30) == 0
    assert [type(e) for e in events] == [Started, Ready, Exited, Stopped]
    assert sup.status()[0].state is WorkerState.EXITED
    assert sup.tail("a") == ["out line from a", "error: going to exit 0"]


def test_exit_code_and_signal_status(child: Argv, record_dir: Path) -> None:
    workers = [spec("code", child("exit_with.py", 3))]
    sup, _ = supervise(workers, NO_RESTART, record_dir)
    sup.start()
    assert sup.wait(30) == 3

    workers = [spec("segv", child("exit_with.py", 0, "SIGSEGV"))]
    sup, events = supervise(workers, NO_RESTART, record_dir)
    sup.start()
    assert sup.wait(30) == 128 + signal.SIGSEGV
    (exited,) = of(events, Exited)
    assert (exited.signal, exited.exit_code, exited.expected) == ("SIGSEGV", 139, False)
    assert exited.stderr_tail == ("error: going to exit 0",)
    (gave_up,) = of(events, GaveUp)
    assert gave_up.exit_code == 139


def test_one_real_restart(child: Argv, tmp_path: Path, record_dir: Path) -> None:
    sup, events = supervise([spec("0", child("flaky.py", tmp_path, 5))], FAST, record_dir)
    sup.start()
    assert sup.wait(30) == 0
    assert [e.attempt for e in of(events, Started)] == [0, 1]
    (restart,) = of(events, Restarting)
    assert (restart.names, restart.restart, restart.delay_s) == (("0",), 1, 0.0)
    assert [e.exit_code for e in of(events, Exited)] == [5, 0]
    # Each exit carries the stderr of its own run only.
    assert [e.stderr_tail for e in of(events, Exited)] == [("first run fails",), ()]
    assert sup.status()[0].restarts == 1


def test_gives_up_after_max_restarts(child: Argv, record_dir: Path) -> None:
    policy = RestartPolicy(max_restarts=2, backoff_initial_s=0.01)
    sup, events = supervise([spec("0", child("exit_with.py", 4))], policy, record_dir)
    sup.start()
    assert sup.wait(30) == 4
    assert len(of(events, Started)) == 3
    assert [e.restart for e in of(events, Restarting)] == [1, 2]
    assert sup.status()[0].state is WorkerState.FAILED


def test_gang_restarts_every_worker(child: Argv, tmp_path: Path, record_dir: Path) -> None:
    pidfile = tmp_path / "sleeper.pid"
    workers = [
        spec("flaky", child("flaky.py", tmp_path, 3)),
        spec("steady", child("sleeper.py", "--pidfile", pidfile)),
    ]
    sup, events = supervise(workers, FAST, record_dir)
    sup.start()
    wait_for(lambda: len(of(events, Started)) == 4)  # both, twice
    steady = [e for e in of(events, Started) if e.name == "steady"]
    assert [e.attempt for e in steady] == [0, 1]
    assert not alive(steady[0].pid)
    stopped = [e for e in of(events, Exited) if e.name == "steady"]
    assert stopped[0].expected and stopped[0].signal == "SIGTERM"
    assert sup.stop() == 0


def test_independent_restarts_only_the_failed(
    child: Argv, tmp_path: Path, record_dir: Path
) -> None:
    workers = [
        spec("flaky", child("flaky.py", tmp_path, 3)),
        spec("steady", child("sleeper.py")),
    ]
    policy = RestartPolicy(max_restarts=2, backoff_initial_s=0.0, gang=False)
    sup, events = supervise(workers, policy, record_dir)
    sup.start()
    wait_for(lambda: any(e.name == "flaky" and e.exit_code == 0 for e in of(events, Exited)))
    assert [e.name for e in of(events, Started)].count("steady") == 1
    (restart,) = of(events, Restarting)
    assert restart.names == ("flaky",)
    states = {s.name: s.state for s in sup.status()}
    assert states == {"flaky": WorkerState.EXITED, "steady": WorkerState.READY}
    assert sup.stop() == 0


def test_stop_kills_the_whole_tree(child: Argv, tmp_path: Path, record_dir: Path) -> None:
    out = tmp_path / "pids"
    out.mkdir()
    sup, _ = supervise([spec("0", child("tree.py", out))], NO_RESTART, record_dir)
    sup.start()
    wait_for(lambda: len(pids_in(out)) == 3)
    pids = pids_in(out)
    assert sup.stop() == 0
    assert not [p for p in pids if alive(p)]


def test_every_process_of_the_tree_gets_the_polite_signal(
    child: Argv, tmp_path: Path, record_dir: Path
) -> None:
    out = tmp_path / "pids"
    out.mkdir()
    workers = [spec("0", child("tree.py", out, "--note-term"))]
    sup, _ = supervise(workers, NO_RESTART, record_dir, grace_s=600)
    sup.start()
    wait_for(lambda: len(pids_in(out)) == 3)
    assert sup.stop() == 0  # long before the 600 s grace: nobody needed a SIGKILL
    noted = {int(p.stem) for p in out.glob("*.term")}
    assert noted == set(pids_in(out))  # the setsid grandchild included


def test_term_ignoring_tree_is_killed_after_grace(
    child: Argv, tmp_path: Path, record_dir: Path
) -> None:
    out = tmp_path / "pids"
    out.mkdir()
    workers = [spec("0", child("tree.py", out, "--ignore-term"))]
    sup, events = supervise(workers, NO_RESTART, record_dir, grace_s=0.5)
    sup.start()
    wait_for(lambda: len(pids_in(out)) == 3)
    pids = pids_in(out)
    sup.stop()
    assert not [p for p in pids if alive(p)]
    assert of(events, Exited)[0].signal == "SIGKILL"


def test_leftovers_of_a_finished_worker_are_removed(
    child: Argv, tmp_path: Path, record_dir: Path
) -> None:
    # The worker's main process exits 0 while its setsid grandchild would live on.
    out = tmp_path / "pids"
    out.mkdir()
    script = tmp_path / "leave_daemon.py"
    script.write_text(
        "import os, subprocess, sys, time\n"
        f"subprocess.Popen({child('sleeper.py', '--pidfile', str(out / 'daemon.pid'))!r},"
        " start_new_session=True)\n"
        f"while not os.path.exists({str(out / 'daemon.pid')!r}): time.sleep(0.01)\n"
    )
    import sys

    sup, _ = supervise([spec("0", [sys.executable, "-S", str(script)])], NO_RESTART, record_dir)
    sup.start()
    assert sup.wait(30) == 0
    (daemon,) = pids_in(out)
    assert not alive(daemon)


def test_readiness_and_liveness_probes(child: Argv, tmp_path: Path, record_dir: Path) -> None:
    flag = tmp_path / "ready"
    probe = HealthCheck(flag.exists, interval_s=0.05, timeout_s=1.0, failure_threshold=2)
    worker = spec("srv", child("ready_after.py", flag, 0.3), readiness=probe, liveness=probe)
    policy = RestartPolicy(max_restarts=1, backoff_initial_s=0.0, gang=False)
    sup, events = supervise([worker], policy, record_dir)
    sup.start()
    assert sup.status()[0].state in (WorkerState.STARTING, WorkerState.READY)
    assert sup.wait_ready(timeout=30)
    assert sup.status()[0].ready
    assert [type(e) for e in events[:2]] == [Started, Ready]
    flag.unlink()  # the "server" breaks: liveness fails twice, the worker is restarted
    wait_for(lambda: len(of(events, Started)) == 2)
    (unhealthy,) = of(events, Unhealthy)
    assert "liveness check failed 2 times" in unhealthy.reason
    assert sup.wait_ready(timeout=30)  # the new run creates the file again
    assert sup.stop() == 0


def test_readiness_deadline_fails_fast(child: Argv, tmp_path: Path, record_dir: Path) -> None:
    flag = tmp_path / "never"
    probe = HealthCheck(flag.exists, interval_s=0.05, start_deadline_s=0.3)
    worker = spec("srv", child("sleeper.py"), readiness=probe)
    sup, events = supervise([worker], NO_RESTART, record_dir)
    sup.start()
    assert not sup.wait_ready(timeout=30)
    assert sup.wait(30) == 143
    assert "not ready after 0.3 s" in of(events, Unhealthy)[0].reason


def test_prepare_gets_the_attempt(child: Argv, tmp_path: Path, record_dir: Path) -> None:
    seen: list[int] = []
    base = spec("0", child("flaky.py", tmp_path, 9))

    def prepare(attempt: int) -> WorkerSpec:
        seen.append(attempt)
        return WorkerSpec(
            "0", [*base.argv], {**base.env, "TORCHELASTIC_RESTART_COUNT": str(attempt)}
        )

    sup, _ = supervise([WorkerSpec("0", ["unused"], {}, prepare=prepare)], FAST, record_dir)
    sup.start()
    assert sup.wait(30) == 0
    assert seen == [0, 1]
    assert "restart count 1" in sup.tail("0")


def test_missing_program_is_a_launch_error_and_nothing_stays(
    child: Argv, tmp_path: Path, record_dir: Path
) -> None:
    pidfile = tmp_path / "first.pid"
    workers = [
        spec("0", child("sleeper.py", "--pidfile", pidfile)),
        spec("1", ["/nonexistent/program"]),
    ]
    sup, events = supervise(workers, FAST, record_dir)
    with pytest.raises(LaunchError, match="/nonexistent/program: no such file"):
        sup.start()
    first = of(events, Started)[0].pid
    assert not alive(first)
    assert of(events, Stopped)[0].exit_code == 127


def test_context_manager_stops(child: Argv, record_dir: Path) -> None:
    events: list[Event] = []
    with Supervisor(
        [spec("0", child("sleeper.py"))], record_dir=record_dir, logs=QUIET, on_event=events.append
    ) as sup:
        wait_for(lambda: sup.status()[0].pid is not None)
        pid = sup.status()[0].pid
    assert pid is not None and not alive(pid)
    assert isinstance(events[-1], Stopped)


def test_log_dir_has_one_file_per_attempt(child: Argv, tmp_path: Path, record_dir: Path) -> None:
    logs = LogConfig(log_dir=tmp_path / "logs", console=False)
    sup, _ = supervise([spec("w", child("flaky.py", tmp_path, 3))], FAST, record_dir, logs=logs)
    sup.start()
    assert sup.wait(30) == 0
    first = (tmp_path / "logs" / "attempt_0" / "w.log").read_text()
    second = (tmp_path / "logs" / "attempt_1" / "w.log").read_text()
    assert "first run fails" in first and "second run succeeds" not in first
    assert "second run succeeds" in second
    assert sup.log_path("w") == tmp_path / "logs" / "attempt_1" / "w.log"


def test_record_file_is_removed_after_a_clean_run(child: Argv, record_dir: Path) -> None:
    sup, _ = supervise([spec("0", child("exit_with.py", 0))], NO_RESTART, record_dir)
    sup.start()
    assert list(record_dir.glob("*.jsonl"))  # written while running
    assert sup.wait(30) == 0
    assert not list(record_dir.glob("*.jsonl"))


@pytest.mark.parametrize(
    ("workers", "message"),
    [
        ([], "no workers"),
        ([WorkerSpec("a", ["x"], {}), WorkerSpec("a", ["y"], {})], "repeated: a"),
        ([WorkerSpec("a/b", ["x"], {})], "without '/'"),
        ([WorkerSpec("a", [], {})], "argv is empty"),
        # These used to kill the loop thread (Popen's TypeError or ValueError, raised again by
        # wait()), or to run "t" for "true".
        ([WorkerSpec("a", "true", {})], "argv='true': worker a: expected argv as a list"),
        ([WorkerSpec("a", ["sleep", 1], {})], "worker a: expected strings without NUL in argv"),  # type: ignore[list-item]
        ([WorkerSpec("a", ["true"], None)], "env=None: worker a: expected env as a mapping"),  # type: ignore[arg-type]
        ([WorkerSpec("a", ["true"], {"N": 1})], "worker a: env 'N'=1: expected strings"),  # type: ignore[dict-item]
        ([WorkerSpec("a", ["true"], {"A=B": "1"})], "worker a: env 'A=B': expected a name"),
        ([WorkerSpec("a", ["true"], {"A": "x\0"})], "worker a: env 'A': expected a name"),
    ],
)
def test_bad_specs(workers: list[WorkerSpec], message: str) -> None:
    with pytest.raises(UsageError, match=message):
        Supervisor(workers)


def test_wait_before_start_is_a_usage_error() -> None:
    sup = Supervisor([WorkerSpec("a", ["x"], {})])
    with pytest.raises(UsageError, match="start"):
        sup.wait()
    assert sup.status()[0].state is WorkerState.PENDING


def test_wait_inside_on_event_is_refused(child: Argv, record_dir: Path) -> None:
    errors: list[Exception] = []
    holder: list[Supervisor] = []

    def on_event(event: Event) -> None:
        if isinstance(event, Started):
            try:
                holder[0].stop()
            except UsageError as exc:
                errors.append(exc)
            holder[0].send_stop_signal(signal.SIGTERM)  # the way to stop from a callback

    sup = Supervisor([spec("0", child("sleeper.py"))], record_dir=record_dir, logs=QUIET,
                     on_event=on_event)  # fmt: skip
    holder.append(sup)
    sup.start()
    assert sup.wait(30) == 143
    assert len(errors) == 1 and "send_stop_signal" in str(errors[0])


def test_a_restart_that_cannot_start_is_a_failure(child: Argv, record_dir: Path) -> None:
    first = spec("0", child("exit_with.py", 2))

    def prepare(attempt: int) -> WorkerSpec:
        return first if attempt == 0 else spec("0", ["/nonexistent/after-update"])

    worker = WorkerSpec("0", ["unused"], {}, prepare=prepare)
    policy = RestartPolicy(max_restarts=1, backoff_initial_s=0.0)
    sup, events = supervise([worker], policy, record_dir)
    sup.start()
    assert sup.wait(30) == 127
    assert of(events, GaveUp)[0].exit_code == 127
    assert sup.status()[0].state is WorkerState.FAILED
    assert sup.status()[0].attempt == 1


def test_a_settle_hook_that_refuses_fails_the_gang(child: Argv, record_dir: Path) -> None:
    """A ``settle`` hook that raises LaunchError (the other nodes never came back) fails the
    gang with its message instead of restarting it; any other exception is a bug."""
    asked: list[tuple[str, ...]] = []

    def settle(names: object) -> None:
        asked.append(tuple(names))  # type: ignore[call-overload]
        raise LaunchError("node(s) 1 did not reach node 0")

    policy = RestartPolicy(max_restarts=3, backoff_initial_s=0.0)
    workers = [spec("0", child("exit_with.py", 4)), spec("1", child("exit_with.py", 0))]
    sup, events = supervise(workers, policy, record_dir, settle=settle)
    sup.start()
    assert sup.wait(30) == 4
    assert asked == [("0", "1")]
    assert len(of(events, Started)) == 2  # the first start only
    (gave_up,) = of(events, GaveUp)
    assert (gave_up.exit_code, gave_up.reason) == (4, "node(s) 1 did not reach node 0")
    assert {w.state for w in sup.status()} == {WorkerState.FAILED}


def test_a_restart_lets_go_of_the_pipes_of_the_run_before(
    child: Argv, tmp_path: Path, record_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A process that escaped the job (``setsid`` and an empty environment, with no job
    cgroup to hold it) still has the first run's stdout and stderr. The restart used to
    register the new run's pipes under the same keys, leaving the old ones registered with
    callbacks that read the new ones: the old pipes were never read or closed again, and once
    one of them was readable (a line, or EOF) the loop spun at full CPU for the rest of the
    job."""
    monkeypatch.setenv("XPULAUNCH_CGROUP", "0")
    pidfile, marker = tmp_path / "escaped.pid", tmp_path / "ran-once"
    script = tmp_path / "escape_once.py"
    script.write_text(
        "import os, subprocess, sys, time\n"
        f"if os.path.exists({str(marker)!r}):\n"
        "    time.sleep(60)\n"
        f"open({str(marker)!r}, 'w').close()\n"
        f"subprocess.Popen({child('sleeper.py', '--pidfile', pidfile)!r},"
        " start_new_session=True, env={})\n"
        f"while not os.path.exists({str(pidfile)!r}): time.sleep(0.01)\n"
        "sys.exit(1)\n"
    )
    import sys

    sup, events = supervise([spec("0", [sys.executable, "-S", str(script)])], FAST, record_dir)
    sup.start()
    try:
        wait_for(lambda: len(of(events, Started)) == 2, "the restart")
        escaped = int(pidfile.read_text())
        assert alive(escaped)  # it escaped the job, as meant
        first_runs_pipe = os.readlink(f"/proc/{escaped}/fd/1")
        assert first_runs_pipe not in _open_files()
    finally:
        sup.stop()
        os.kill(int(pidfile.read_text()), signal.SIGKILL)


def _open_files() -> set[str]:
    """What this process's descriptors point at (``pipe:[1234]``, paths)."""
    found = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            found.add(os.readlink(f"/proc/self/fd/{fd}"))
        except OSError:  # the descriptor listdir itself used, closed by now
            continue
    return found


def test_stop_from_another_thread_during_start_stops_the_job(child: Argv, record_dir: Path) -> None:
    sup, _ = supervise([spec("0", child("sleeper.py"))], NO_RESTART, record_dir)
    starting, stopped = threading.Event(), []
    make_engine = sup._make_engine

    def slow_make_engine():  # a start that takes a while (many workers, a slow cgroup)
        starting.set()
        time.sleep(0.5)
        return make_engine()

    sup._make_engine = slow_make_engine  # type: ignore[method-assign]
    stopper = threading.Thread(target=lambda: stopped.append(sup.stop()))
    threading.Thread(target=lambda: starting.wait(10) and stopper.start()).start()
    sup.start()
    wait_for(lambda: stopped, "stop() to return", timeout_s=30)
    try:
        # It used to return 0 at once, finding no engine yet, and the job ran on.
        assert stopped == [0]
        assert sup.wait(10) == 0
    finally:
        sup.stop()


def test_stop_in_a_signal_handler_during_start_stops_the_job(child: Argv, record_dir: Path) -> None:
    sup, _ = supervise([spec("0", child("sleeper.py"))], NO_RESTART, record_dir)
    make_engine, answers = sup._make_engine, []

    def interrupted_make_engine():  # as if SIGTERM's handler ran here, on start's thread
        answers.append(sup.stop())
        return make_engine()

    sup._make_engine = interrupted_make_engine  # type: ignore[method-assign]
    sup.start()  # no deadlock on the supervisor's lock
    try:
        assert answers == [0]
        assert sup.wait(10) == 0  # start stopped the job the handler asked to stop
    finally:
        sup.stop()
