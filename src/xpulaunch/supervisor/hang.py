"""Hang detection: a worker that stops printing, or stops touching its heartbeat file.

A distributed job that deadlocks in a collective keeps every process alive and silent, and
holds its GPUs until someone notices (pytorch/pytorch#97191). With ``hang_timeout_s`` each
running worker has a deadline: its last output (or, with ``heartbeat``, the modification
time of ``XPULAUNCH_HEARTBEAT_FILE``, which :func:`xpulaunch.heartbeat` touches) plus the
timeout. One loop timer per worker fires at that deadline; when the worker was active since,
the timer moves to the new deadline, so a quiet job costs one wake-up per worker per timeout
and nothing polls.

A worker past its deadline gets a :class:`~xpulaunch.events.HangDetected` event, its
Python stacks dumped into its log by ``py-spy dump`` when py-spy is installed (on a helper
thread: it may take seconds), and is then failed like any other failure, so the restart
policy and its backoff apply.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from typing import TYPE_CHECKING

from xpulaunch.events import STACK_DUMP_HEADER, HangDetected

if TYPE_CHECKING:
    from concurrent.futures import Future

    from xpulaunch.joblog.logs import LogSink
    from xpulaunch.supervisor.loop import Loop
    from xpulaunch.supervisor.worker import Worker, WorkerOwner

PY_SPY_TIMEOUT_S = 30.0
# The job's exit status when a hang failed it for good: not the worker's own 143 (the SIGTERM
# that stopped it), which a script cannot tell from ``kill -TERM`` of xpulaunch, nor 124
# (``--max-runtime``, as GNU timeout), 125 (the nodes of a job failed each other), 126/127
# (cannot start) or 128+N (a signal).
HANG_STATUS = 123


class HangWatch:
    """Fails a silent worker through its ``owner``, as a failed health check does."""

    def __init__(
        self, owner: WorkerOwner, loop: Loop, sink: LogSink, timeout_s: float, *, heartbeat: bool
    ) -> None:
        self._owner, self._loop, self._sink = owner, loop, sink
        self._timeout_s, self._heartbeat = timeout_s, heartbeat
        self._clock = loop.clock

    def started(self, worker: Worker) -> None:
        """Arm the first deadline of a run that just started."""
        run_id = worker.run_id
        self._loop.call_at(self._clock() + self._timeout_s, lambda: self._check(worker, run_id))

    def _check(self, worker: Worker, run_id: int) -> None:
        if run_id != worker.run_id or not worker.alive or worker.expected:
            return  # that run ended, or is being stopped anyway
        last_s = self._last_activity_s(worker)
        now = self._clock()
        if now < last_s + self._timeout_s:
            self._loop.call_at(last_s + self._timeout_s, lambda: self._check(worker, run_id))
            return
        self._hung(worker, run_id, now - last_s)

    def _last_activity_s(self, worker: Worker) -> float:
        """On the engine's clock: the last output, or the heartbeat file's last touch."""
        started_s = worker.started_at_s or 0.0
        if not self._heartbeat:
            return max(worker.last_output_s, started_s)
        path = worker.heartbeat_file
        try:
            age_s = time.time() - os.stat(path).st_mtime if path else None
        except OSError:
            age_s = None  # removed by the worker: no beat since it started
        if age_s is None:
            return started_s
        return max(self._clock() - age_s, started_s)

    def _hung(self, worker: Worker, run_id: int, silent_s: float) -> None:
        what = "heartbeat" if self._heartbeat else "output"
        pid = worker.pid or 0
        self._owner.emit(HangDetected(self._clock(), worker.name, pid, silent_s, what))
        reason = (
            f"silent for {silent_s:.0f} s (no {what} within --hang-timeout {self._timeout_s:g} s)"
        )
        worker.failed_status = HANG_STATUS
        py_spy = shutil.which("py-spy")
        if py_spy is None:
            self._sink.message(f"worker {worker.name}: no stack dump (py-spy is not installed)")
            self._owner.on_failed(worker, reason)
            return
        self._loop.submit(
            lambda: _dump_stacks(py_spy, pid), lambda f: self._dumped(worker, run_id, reason, f)
        )

    def _dumped(
        self, worker: Worker, run_id: int, reason: str, future: Future[list[bytes]]
    ) -> None:
        lines = [STACK_DUMP_HEADER.encode(), *future.result()]
        self._sink.write(worker.name, True, lines)
        if run_id == worker.run_id and worker.alive:
            self._owner.on_failed(worker, reason)


def _dump_stacks(py_spy: str, pid: int) -> list[bytes]:
    """``py-spy dump --pid PID`` (every thread's Python stack) as lines; its error if it failed."""
    try:
        done = subprocess.run(
            [py_spy, "dump", "--pid", str(pid)],
            capture_output=True,
            timeout=PY_SPY_TIMEOUT_S,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return [f"py-spy failed: {exc}".encode()]
    return (done.stdout + done.stderr).splitlines()
