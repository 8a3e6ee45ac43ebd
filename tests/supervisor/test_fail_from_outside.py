"""``Supervisor.fail``: another node's failure fails this node's workers, which then restart
or give up by the restart policy, as if one of them had failed (real child processes)."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from process_kit import wait_for
from xpulaunch.events import Event, GaveUp, Restarting, Started, Stopped
from xpulaunch.joblog.logs import LogConfig
from xpulaunch.supervisor.restart import RestartMode, RestartPolicy
from xpulaunch.supervisor.supervisor import Supervisor, WorkerSpec

Argv = Callable[..., list[str]]


def sleepers(child: Argv, count: int) -> list[WorkerSpec]:
    return [WorkerSpec(str(i), child("sleeper.py"), dict(os.environ)) for i in range(count)]


def started(events: list[Event], count: int) -> Callable[[], bool]:
    return lambda: len([e for e in events if isinstance(e, Started)]) == count


def test_a_failure_from_outside_restarts_the_gang_then_gives_up_with_its_status(
    child: Argv, record_dir: Path
) -> None:
    events: list[Event] = []
    policy = RestartPolicy(max_restarts=1, backoff_initial_s=0.0)
    sup = Supervisor(sleepers(child, 2), policy, on_event=events.append, record_dir=record_dir,
                     logs=LogConfig(console=False), grace_s=5.0)  # fmt: skip
    sup.start()
    wait_for(started(events, 2))
    sup.fail("node 1 failed (worker 0 exited with code 1)", 125)
    wait_for(started(events, 4))
    sup.fail("node 1 is gone", 125)
    assert sup.wait(30) == 125
    (restarting,) = [e for e in events if isinstance(e, Restarting)]
    assert restarting.names == ("0", "1")
    assert restarting.reason.startswith("node 1 failed (worker 0 exited with code 1); restart 1")
    (gave_up,) = [e for e in events if isinstance(e, GaveUp)]
    assert (gave_up.exit_code, gave_up.reason) == (125, "node 1 is gone; no restarts left "
                                                          "(1 allowed)")  # fmt: skip
    (stopped,) = [e for e in events if isinstance(e, Stopped)]
    assert (stopped.exit_code, stopped.reason) == (125, "node 1 is gone")


def test_a_failure_before_the_start_fails_the_workers_once_started(
    child: Argv, record_dir: Path
) -> None:
    sup = Supervisor(sleepers(child, 1), RestartPolicy(mode=RestartMode.NO),
                     record_dir=record_dir, logs=LogConfig(console=False))  # fmt: skip
    sup.fail("node 2 is gone", 125)
    sup.start()
    assert sup.wait(30) == 125
