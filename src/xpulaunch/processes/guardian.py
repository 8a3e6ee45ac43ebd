"""The guardian: a tiny watchdog that kills a job whose supervisor was SIGKILLed.

Why it exists: ``PR_SET_PDEATHSIG`` only reaches a supervisor's direct children (prctl(2)),
and a worker's own children (DataLoader workers, a ``setsid`` daemon) survive it. So the
supervisor starts this process first (:func:`start_guardian`), with the read end of a pipe as
its stdin, and keeps the write end in a :class:`GuardianHandle`. The supervisor writes only
``done``, when it has stopped everything itself. EOF without ``done`` means the supervisor
died: the guardian then SIGKILLs every process of the job, found by
:func:`xpulaunch.processes.procfs.find_job` (the workers' sessions, read from the job's record
file (:mod:`xpulaunch.processes.records`), which the supervisor writes anyway, and the
``XPULAUNCH_JOB_ID`` marker every descendant inherits), until none is left, and only then
exits. It also holds the job's device-lease file descriptors, so the devices stay leased until
the job is really gone. (On a normal end the supervisor unlocks the leases itself once it has
seen the job gone, and does not wait for the guardian to exit.)

Nothing is written to the pipe per worker: a list kept by the shell grows with every restart
(a long crash loop made it quadratic), and a blocking write from the supervisor's loop to a
stopped guardian would freeze the loop. The supervisor watches the guardian instead, and
starts a new one if it dies (:class:`~xpulaunch.supervisor.engine.Engine`).

It runs in two stages (:func:`command`), because all it does in a job that ends normally is
wait, and it should neither compete with the workers' start nor hold an interpreter's memory
for the life of the job:

1. ``/bin/sh`` (:data:`SHELL_STAGE`) waits on the pipe. ``done``: it exits. EOF: it execs
   stage 2.
2. This file, run by path with ``python -S -E -s`` (no site-packages, no PYTHON* variables:
   nothing installed or set in the environment since can break it), kills the job and
   removes what it left in the runtime directory (its record and private run directory).

The lease descriptors and the process id stay the same through the exec.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from typing import TYPE_CHECKING

if __name__ == "__main__" and not __package__:
    # Stage 2 runs this file by path under ``python -S``, which puts this file's directory
    # first on sys.path and no site-packages: import the package from the directory that
    # holds it instead, so that stage 2 uses the same process reader as the supervisor.
    sys.path[0] = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# After the path fix above: stage 2 finds the package only through it.
from xpulaunch.processes.cgroup import JobCgroup
from xpulaunch.processes.procfs import find_job
from xpulaunch.processes.records import recorded_workers, run_dir_of

if TYPE_CHECKING:
    from collections.abc import Iterable

GUARDIAN_EXIT_WAIT_S = 5.0


class GuardianHandle:
    """The supervisor's end of the guardian: a pipe whose EOF means "the supervisor died"."""

    def __init__(self, proc: subprocess.Popen[bytes], write_fd: int) -> None:
        self.proc, self.pid = proc, proc.pid
        self._fd: int | None = write_fd
        # Never block the supervisor's loop on a stopped guardian: the one line written
        # ("done") fits an empty pipe, and anything else is dropped, not waited for.
        os.set_blocking(write_fd, False)

    def close(self, *, done: bool = False, wait: bool = False) -> None:
        """Close our end; ``done``: the job is over, the guardian may exit without killing.

        ``wait``: block (bounded) until it has exited, for when it may still be the holder
        of the lease fds (they were not unlocked). Otherwise a daemon thread reaps it, so
        that the caller does not wait for the guardian's exit.
        """
        if self._fd is not None:
            if done:
                # BlockingIOError cannot happen to an empty pipe: never wait for it. A broken
                # pipe: the guardian died, and pdeathsig still covers direct workers.
                with contextlib.suppress(BlockingIOError, BrokenPipeError):
                    os.write(self._fd, b"done\n")
            os.close(self._fd)
            self._fd = None
        if done and wait:
            with contextlib.suppress(subprocess.TimeoutExpired):  # it exits on reading "done"
                self.proc.wait(timeout=GUARDIAN_EXIT_WAIT_S)
                return
        reaper = threading.Thread(target=self.proc.wait, name="xpulaunch-reaper", daemon=True)
        reaper.start()


def start_guardian(
    job_id: str,
    since_ticks: int,
    record: str,
    lease_fds: tuple[int, ...],
    cgroup: str | None = None,
) -> GuardianHandle | None:
    """Start the guardian of a job; None when it cannot be started (then only
    ``PR_SET_PDEATHSIG`` and the record sweep cover a dead supervisor)."""
    read_fd, write_fd = os.pipe()  # both close-on-exec: no worker inherits the write end
    argv = command(sys.executable, job_id, since_ticks, record, cgroup)
    try:
        # No pdeathsig and its own session: it must outlive us and ignore the terminal.
        proc = subprocess.Popen(
            argv,
            stdin=read_fd,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env={},
            cwd="/",
            start_new_session=True,
            pass_fds=lease_fds,
        )
    except OSError:
        os.close(write_fd)
        return None
    finally:
        os.close(read_fd)
    return GuardianHandle(proc, write_fd)


# Stage 1: sh -c SHELL_STAGE NAME STAGE_2_ARGV... It keeps nothing (stage 2 reads the job's
# record). The terminal's Ctrl-C and hang-up are for the supervisor (and signals ignored here
# stay ignored through the exec).
SHELL_STAGE = r"""
trap '' INT HUP
while IFS= read -r line; do
  [ "$line" = done ] && exit 0
done
exec "$@"
"""


def command(
    python: str, job_id: str, since_ticks: int, record: str, cgroup: str | None = None
) -> list[str]:
    """The guardian's argv: stage 1, which execs stage 2 (:func:`stage_two`) on EOF."""
    stage_2 = stage_two(python, job_id, since_ticks, record, cgroup)
    return ["/bin/sh", "-c", SHELL_STAGE, "xpulaunch-guardian", *stage_2]


def stage_two(
    python: str, job_id: str, since_ticks: int, record: str, cgroup: str | None = None
) -> list[str]:
    """Stage 2's argv: this file under ``python``, without site-packages or PYTHON*."""
    here = os.path.abspath(__file__)
    argv = [python, "-S", "-E", "-s", here, job_id, str(since_ticks), record]
    return [*argv, cgroup] if cgroup else argv


def read_workers(lines: Iterable[bytes]) -> dict[int, int] | None:
    """The workers announced on the pipe (``s PID TICKS``); None once ``done`` is read.

    Anything else (a line cut short by the supervisor's death, junk) is ignored.
    """
    workers: dict[int, int] = {}
    for line in lines:
        words = line.split()
        if words == [b"done"]:
            return None
        if len(words) == 3 and words[0] == b"s" and words[1].isdigit() and words[2].isdigit():
            workers[int(words[1])] = int(words[2])
    return workers


def kill_job(
    job_id: str, workers: dict[int, int], since_ticks: int, cgroup: str | None = None
) -> None:
    """SIGKILL every process of the job until none is left (a D-state one may take long).

    ``workers`` maps each worker's pid (its session id) to its start ticks; ``cgroup`` is the
    job's cgroup, if it has one.
    """
    me, delay_s = frozenset({os.getpid()}), 0.02
    while True:
        if cgroup is not None:
            JobCgroup(cgroup).kill()
        found = find_job(job_id, workers, since_ticks=since_ticks, exclude=me, cgroup=cgroup)
        if not found:
            if cgroup is not None:
                JobCgroup(cgroup).remove()
            return
        for process in found:  # find_job never returns pid 0 or 1
            try:
                os.kill(process.info.pid, signal.SIGKILL)
            except ProcessLookupError:
                continue  # already gone: that is what we want
        time.sleep(delay_s)
        delay_s = min(delay_s * 2, 1.0)


def main(argv: list[str]) -> int:
    """``guardian.py JOB_ID SINCE_TICKS [RECORD_FILE [CGROUP]]``; stdin: the supervisor's pipe, or
    what stage 1 kept of it."""
    # The terminal's Ctrl-C and hang-up are for the supervisor, which forwards them.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    job_id, since_ticks = argv[0], int(argv[1])
    record = argv[2] if len(argv) > 2 else None
    cgroup = argv[3] if len(argv) > 3 else None
    workers = read_workers(sys.stdin.buffer)  # at EOF after stage 1; what a test may write
    if workers is None:
        if cgroup is not None:
            JobCgroup(cgroup).remove()  # the supervisor removes it too; whoever is last
        return 0
    if record:
        workers.update(recorded_workers(record))
    kill_job(job_id, workers, since_ticks, cgroup)
    if record:
        # What the job left in the runtime directory: the record and the workers' private
        # run directory (their error files), which the supervisor would have removed.
        shutil.rmtree(run_dir_of(record), ignore_errors=True)
        with contextlib.suppress(FileNotFoundError):  # a sweep removed it, or none was written
            os.unlink(record)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
