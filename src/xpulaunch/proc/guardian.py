"""The guardian: a tiny watchdog that kills a job whose supervisor was SIGKILLed.

Why it exists (landscape.md (c) 14): ``PR_SET_PDEATHSIG`` only reaches a supervisor's direct
children, and a worker's own children (DataLoader workers, a ``setsid`` daemon) survive it.
So the supervisor starts this process first, with the read end of a pipe as its stdin. The
supervisor writes the session id of every worker it starts and ``done`` when it has stopped
everything itself. EOF without ``done`` means the supervisor died: the guardian then SIGKILLs
every process of the job, found by session id and by the ``XPULAUNCH_JOB_ID`` environment
marker every descendant inherits, until none is left, and only then exits. It also holds the
job's device-lease file descriptors, so the devices stay leased until the job is really gone.
(On a normal end the supervisor unlocks the leases itself once it has seen the job gone, and
does not wait for the guardian to exit.)

It runs in two stages (:func:`command`), because it must start fast and stay small while it
waits, which is all it does in a job that ends normally:

1. ``/bin/sh`` (:data:`SHELL_STAGE`) reads the pipe and keeps the session lines. ``done``:
   it exits. EOF: it execs stage 2 with those lines as stdin. A shell starts in ~1.5 ms and
   ~1 MiB, where Python took ~13 ms of CPU, competing with the workers' own start on a small
   machine (issue 4), and ~8 MiB for as long as the job ran.
2. This module, run by path with ``python -S -E`` (no site-packages, no PYTHON* variables),
   kills the job. It imports only ``os``, ``_signal``, ``sys`` and ``time``: not even
   ``typing`` nor ``signal``, whose enums pull in ``enum``, ``functools`` and
   ``collections``; its start-up matters less now, but the supervisor is dead and the job's
   processes run on unwatched until it is done.

The lease descriptors and the process id stay the same through the exec. The /proc reader
below is also what :mod:`xpulaunch.proc.tree` uses to find a job's processes, so both sides
agree on what "a process of the job" is.
"""

from __future__ import annotations

import _signal  # type: ignore[import-not-found]  # what signal wraps (no stub): same calls
import os
import sys
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Iterator, Mapping

JOB_ID_VAR = "XPULAUNCH_JOB_ID"
WORKER_VAR = "XPULAUNCH_WORKER"
_GONE_STATES = frozenset("ZXx")  # zombie / dead: it holds no resources but a pid
# /proc/PID/stat is 52 numbers and a command name of at most 64 bytes (TASK_COMM_LEN 16,
# escaped): well under 1 KiB.
_STAT_MAX_BYTES = 4096


class ProcInfo:
    """One line of /proc/PID/stat, the fields we use."""

    __slots__ = ("pgid", "pid", "ppid", "sid", "start_ticks", "state")

    def __init__(self, pid: int, fields: list[bytes]) -> None:
        """``fields``: /proc/PID/stat from field 3 (the state) on."""
        self.pid, self.state = pid, fields[0].decode()
        self.ppid, self.pgid, self.sid = int(fields[1]), int(fields[2]), int(fields[3])
        self.start_ticks = int(fields[19])  # ticks after boot (field 22): pid-reuse identity

    def __repr__(self) -> str:
        return f"ProcInfo(pid={self.pid}, sid={self.sid}, state={self.state!r})"


class Member:
    """A live process of a job, and the worker it belongs to by its marker (if any)."""

    __slots__ = ("info", "worker")

    def __init__(self, info: ProcInfo, worker: str | None) -> None:
        self.info, self.worker = info, worker

    def __repr__(self) -> str:
        return f"Member({self.info!r}, worker={self.worker!r})"


def read_stat(pid: int) -> ProcInfo | None:
    """Parse /proc/PID/stat; None when the process is gone."""
    # os.open/os.read, not open(): a third faster, and a scan reads this for every process.
    try:
        fd = os.open(f"/proc/{pid}/stat", os.O_RDONLY)
    except OSError:  # gone between listing and reading (ENOENT/ESRCH)
        return None
    try:
        raw = os.read(fd, _STAT_MAX_BYTES)  # one read: the kernel writes it in one go
    except OSError:  # gone while reading (ESRCH)
        return None
    finally:
        os.close(fd)
    # The command name (field 2) is in parentheses and may itself hold spaces and ')'.
    fields = raw[raw.rfind(b")") + 2 :].split()
    return ProcInfo(pid, fields) if len(fields) >= 20 else None


def read_environ(pid: int) -> dict[str, str]:
    """The environment a process was started with; empty when unreadable or gone."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as handle:
            raw = handle.read()
    except OSError:  # gone, or another user's process (EACCES)
        return {}
    env = {}
    for item in raw.split(b"\0"):
        name, sep, value = item.partition(b"=")
        if sep:
            env[name.decode(errors="replace")] = value.decode(errors="replace")
    return env


def now_ticks() -> int:
    """The current time in the units of ``ProcInfo.start_ticks``."""
    with open("/proc/uptime", "rb") as handle:
        uptime_s = float(handle.read().split()[0])
    # /proc/uptime has 10 ms resolution; one tick of margin so nothing started "now" is missed.
    return max(int(uptime_s * os.sysconf("SC_CLK_TCK")) - 1, 0)


def iter_procs(uid: int, since_ticks: int = 0) -> Iterator[ProcInfo]:
    """Every live (not zombie) process of ``uid`` started at or after ``since_ticks``."""
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        info = read_stat(int(entry.name))
        if info is None or info.state in _GONE_STATES or info.start_ticks < since_ticks:
            continue
        try:
            if entry.stat().st_uid != uid:
                continue
        except OSError:  # exited while we looked
            continue
        yield info


def find_job(
    job_id: str | None,
    sessions: Mapping[int, int],
    *,
    since_ticks: int = 0,
    exclude: frozenset[int] = frozenset(),
) -> list[Member]:
    """Live processes of a job: members of its workers' sessions, or carrying its marker.

    ``sessions`` maps a worker's session id to its leader's start ticks. A session whose id
    was reused by a newer process is not ours (the kernel frees a pid only once no process
    uses it as session id, so a live leader with other start ticks means reuse). Only
    processes started at or after ``since_ticks`` are looked at: the job started then, so
    every process of it, in its workers' sessions or carrying its marker, was forked after.
    """
    ours = {sid for sid, ticks in sessions.items() if _session_is_ours(sid, ticks)}
    found = []
    for info in iter_procs(os.getuid(), since_ticks):
        if info.pid in exclude or info.pid <= 1:
            continue
        env = read_environ(info.pid)
        marked = job_id is not None and env.get(JOB_ID_VAR) == job_id
        if marked or info.sid in ours:
            found.append(Member(info, env.get(WORKER_VAR)))
    return found


def _session_is_ours(sid: int, leader_ticks: int) -> bool:
    leader = read_stat(sid)
    return leader is None or leader.start_ticks == leader_ticks


def _kill(pid: int) -> None:
    # Never pid 0/1/-1 (kill(-1) would hit every process we may signal) nor ourselves.
    if pid <= 1 or pid == os.getpid():
        return
    try:
        os.kill(pid, _signal.SIGKILL)
    except ProcessLookupError:
        return  # already gone: that is what we want


def kill_job(job_id: str, sessions: Mapping[int, int], since_ticks: int) -> None:
    """SIGKILL every process of the job until none is left (a D-state one may take long)."""
    delay_s = 0.02
    while True:
        members = find_job(job_id, sessions, since_ticks=since_ticks)
        if not members:
            return
        for member in members:
            _kill(member.info.pid)
        time.sleep(delay_s)
        delay_s = min(delay_s * 2, 1.0)


# Stage 1: sh -c SHELL_STAGE NAME PYTHON GUARDIAN_PY JOB_ID SINCE_TICKS RECORD_FILE. Only the
# "s PID TICKS" lines are kept. The terminal's Ctrl-C and hang-up are for the supervisor
# (and signals ignored here stay ignored through the exec).
SHELL_STAGE = r"""
trap '' INT HUP
sessions=
while IFS= read -r line; do
  case $line in
    done) exit 0 ;;
    "s "*) sessions="$sessions$line
" ;;
  esac
done
exec "$1" -S -E -s "$2" "$3" "$4" "$5" <<EOF
$sessions
EOF
"""


def command(python: str, job_id: str, since_ticks: int, record: str) -> list[str]:
    """The guardian's argv: stage 1, which execs stage 2 (this file, under ``python``)."""
    stage_2 = [python, os.path.abspath(__file__), job_id, str(since_ticks), record]
    return ["/bin/sh", "-c", SHELL_STAGE, "xpulaunch-guardian", *stage_2]


def main(argv: list[str]) -> int:
    """``guardian.py JOB_ID SINCE_TICKS [RECORD_FILE]``; stdin: the supervisor's pipe, or
    what stage 1 kept of it."""
    # The terminal's Ctrl-C and hang-up are for the supervisor, which forwards them.
    _signal.signal(_signal.SIGINT, _signal.SIG_IGN)
    _signal.signal(_signal.SIGHUP, _signal.SIG_IGN)
    job_id, since_ticks = argv[0], int(argv[1])
    record = argv[2] if len(argv) > 2 else None
    sessions: dict[int, int] = {}
    for line in sys.stdin.buffer:
        words = line.split()
        if words == [b"done"]:
            return 0
        if len(words) == 3 and words[0] == b"s" and words[1].isdigit() and words[2].isdigit():
            sessions[int(words[1])] = int(words[2])
    kill_job(job_id, sessions, since_ticks)
    if record and os.path.exists(record):
        try:
            os.unlink(record)
        except FileNotFoundError:
            return 0  # a sweep removed it just now
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
