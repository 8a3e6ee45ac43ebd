"""Process-table reading, safe signalling, the guardian and the record sweep."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from process_kit import alive, wait_for
from xpulaunch.model import JOB_ID_VAR, WORKER_VAR
from xpulaunch.processes import guardian, procfs, records, signals

Argv = Callable[..., list[str]]


@pytest.fixture
def procs() -> Iterator[list[subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for proc in started:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=10)


def start(procs: list, argv: list[str], **kwargs: object) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen(argv, **kwargs)  # type: ignore[call-overload]
    procs.append(proc)
    return proc


def test_read_stat_survives_odd_command_names(tmp_path: Path, procs: list) -> None:
    odd = tmp_path / "we ird) (x"
    odd.symlink_to(sys.executable)
    proc = start(procs, [str(odd), "-S", "-c", "import time; time.sleep(30)"])
    wait_for(lambda: Path(f"/proc/{proc.pid}/comm").read_text() == "we ird) (x\n")
    info = procfs.process_info(proc.pid)
    assert info is not None
    assert (info.pid, info.ppid, info.pgid) == (proc.pid, os.getpid(), os.getpgrp())
    assert info.start_ticks >= procfs.now_ticks() - 30 * os.sysconf("SC_CLK_TCK")


def test_read_stat_of_a_gone_process_is_none() -> None:
    proc = subprocess.Popen([sys.executable, "-S", "-c", "pass"])
    proc.wait()
    assert procfs.process_info(proc.pid) is None
    assert procfs.process_environ(proc.pid) == {}


def test_find_job_by_marker_and_session(child: Argv, procs: list) -> None:
    since = procfs.now_ticks()
    env = {**os.environ, JOB_ID_VAR: "job-a", WORKER_VAR: "w0"}
    marked = start(procs, child("sleeper.py"), env=env, stdout=subprocess.DEVNULL)
    leader = start(procs, child("sleeper.py"), start_new_session=True, stdout=subprocess.DEVNULL)
    other = start(procs, child("sleeper.py"), stdout=subprocess.DEVNULL)
    wait_for(lambda: procfs.process_environ(marked.pid).get(JOB_ID_VAR) == "job-a")
    info = procfs.process_info(leader.pid)
    assert info is not None
    found = procfs.find_job("job-a", {leader.pid: info.start_ticks}, since_ticks=since)
    by_pid = {m.info.pid: m.worker for m in found}
    assert by_pid == {marked.pid: "w0", leader.pid: None}
    assert other.pid not in by_pid
    # A session id whose leader has other start ticks was reused: not ours.
    reused = procfs.find_job(None, {leader.pid: info.start_ticks + 1}, since_ticks=since)
    assert leader.pid not in {m.info.pid for m in reused}


def test_signals_never_hit_init_or_ourselves() -> None:
    for target in (0, 1, -1, os.getpid()):
        assert signals.signal_pid(target, 0) is False
    for group in (0, 1, os.getpgrp()):
        assert signals.signal_group(group, 0) is False


def test_gone_is_success(child: Argv, procs: list) -> None:
    proc = start(procs, child("sleeper.py"), start_new_session=True, stdout=subprocess.DEVNULL)
    assert signals.signal_group(proc.pid, signal.SIGKILL) is True
    proc.wait(timeout=10)
    assert signals.signal_group(proc.pid, signal.SIGKILL) is False
    assert signals.signal_pid(proc.pid, signal.SIGKILL) is False


@pytest.mark.parametrize(
    ("returncode", "status", "text"),
    [
        (0, 0, "exit code 0"),
        (3, 3, "exit code 3"),
        (-signal.SIGSEGV, 139, "killed by SIGSEGV (exit status 139)"),
        (-signal.SIGKILL, 137, "killed by SIGKILL (exit status 137)"),
        (-40, 168, "killed by signal 40 (exit status 168)"),
    ],
)
def test_exit_status(returncode: int, status: int, text: str) -> None:
    assert signals.exit_status(returncode) == status
    assert signals.describe_returncode(returncode) == text


# "shell": the guardian as the supervisor starts it (stage 1, which execs stage 2 on EOF);
# "python": stage 2 alone, reading the pipe itself.
STAGES = ("shell", "python")


def _guardian(
    job: str, since: int, record: Path, stage: str = "shell"
) -> tuple[subprocess.Popen[bytes], int]:
    read_fd, write_fd = os.pipe()
    argv = guardian.command(sys.executable, job, since, str(record))
    if stage == "python":
        argv = guardian.stage_two(sys.executable, job, since, str(record))
    proc = subprocess.Popen(argv, stdin=read_fd, start_new_session=True, env={})
    os.close(read_fd)
    return proc, write_fd


@pytest.mark.parametrize("stage", STAGES)
def test_guardian_kills_the_job_on_eof(
    child: Argv, tmp_path: Path, procs: list, stage: str
) -> None:
    since = procfs.now_ticks()
    record = tmp_path / "job.jsonl"
    session = start(procs, child("sleeper.py"), start_new_session=True, stdout=subprocess.DEVNULL)
    env = {**os.environ, JOB_ID_VAR: "job-g"}
    marked = start(procs, child("sleeper.py"), env=env, start_new_session=True,
                   stdout=subprocess.DEVNULL)  # fmt: skip
    ticks = procfs.process_info(session.pid).start_ticks  # type: ignore[union-attr]
    # The worker's session is in the job's record, as the supervisor writes it.
    record.write_text(f'{{"job": "job-g"}}\n{{"pid": {session.pid}, "start": {ticks}}}\n')
    (tmp_path / "job.run" / "attempt_0").mkdir(parents=True)  # the private run directory
    watchdog, write_fd = _guardian("job-g", since, record, stage)
    os.close(write_fd)  # what the supervisor's death looks like
    assert watchdog.wait(timeout=30) == 0
    assert session.wait(timeout=10) == -signal.SIGKILL
    assert marked.wait(timeout=10) == -signal.SIGKILL
    assert not record.exists()
    assert not (tmp_path / "job.run").exists()


@pytest.mark.parametrize("stage", STAGES)
def test_guardian_done_leaves_everything(
    child: Argv, tmp_path: Path, procs: list, stage: str
) -> None:
    env = {**os.environ, JOB_ID_VAR: "job-d"}
    marked = start(procs, child("sleeper.py"), env=env, stdout=subprocess.DEVNULL)
    watchdog, write_fd = _guardian("job-d", procfs.now_ticks(), tmp_path / "none", stage)
    os.write(write_fd, b"done\n")
    os.close(write_fd)
    assert watchdog.wait(timeout=30) == 0
    assert alive(marked.pid)


def test_guardian_ignores_junk_and_the_terminals_signals(
    child: Argv, tmp_path: Path, procs: list
) -> None:
    since = procfs.now_ticks()
    session = start(procs, child("sleeper.py"), start_new_session=True, stdout=subprocess.DEVNULL)
    ticks = procfs.process_info(session.pid).start_ticks  # type: ignore[union-attr]
    record = tmp_path / "job.jsonl"
    record.write_text(f'{{"job": "job-j"}}\n{{"pid": {session.pid}, "start": {ticks}}}\n{{"pi')
    watchdog, write_fd = _guardian("job-j", since, record)
    os.write(write_fd, b"s 12x 3\nhello\ns 1 2 3\n")
    # A Ctrl-C or hang-up is for the supervisor: ignored once the guardian is up.
    wait_for(lambda: _ignored(watchdog.pid), "the guardian to ignore SIGINT and SIGHUP")
    for sig in (signal.SIGINT, signal.SIGHUP):
        watchdog.send_signal(sig)
    os.write(write_fd, b"s 4")  # the supervisor died in the middle of a line
    assert watchdog.poll() is None
    os.close(write_fd)
    assert watchdog.wait(timeout=30) == 0
    assert session.wait(timeout=10) == -signal.SIGKILL


def _status(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return ""


def _ignored(pid: int) -> bool:
    """SIGINT and SIGHUP are in the process's ignored set."""
    line = next((x for x in _status(pid).splitlines() if x.startswith("SigIgn:")), "- 0")
    mask = int(line.split()[1], 16)
    return all(mask & (1 << (sig - 1)) for sig in (signal.SIGINT, signal.SIGHUP))


def _identity(pid: int) -> list[int]:
    return [pid, procfs.process_info(pid).start_ticks]  # type: ignore[union-attr]


def test_sweep_kills_what_dead_jobs_left(child: Argv, tmp_path: Path, procs: list) -> None:
    directory = tmp_path / "xpulaunch" / "jobs"
    directory.mkdir(parents=True)
    since = procfs.now_ticks()
    env = {**os.environ, JOB_ID_VAR: "dead-job"}
    left = start(procs, child("sleeper.py"), env=env, start_new_session=True,
                 stdout=subprocess.DEVNULL)  # fmt: skip
    wait_for(lambda: procfs.process_environ(left.pid).get(JOB_ID_VAR) == "dead-job")
    gone = subprocess.Popen([sys.executable, "-S", "-c", "pass"])
    dead_identity = _identity(gone.pid)
    gone.wait()
    head = {"job": "dead-job", "since": since, "supervisor": dead_identity, "guardian": None}
    (directory / "dead-job.jsonl").write_text(json.dumps(head) + "\n")
    (directory / "dead-job.run" / "attempt_0").mkdir(parents=True)  # its error files' folder
    live_head = {"job": "live-job", "since": since, "supervisor": _identity(os.getpid())}
    (directory / "live-job.jsonl").write_text(json.dumps(live_head) + "\n")
    (directory / "live-job.run").mkdir()
    assert records.sweep(directory) == 1
    assert left.wait(timeout=10) == -signal.SIGKILL
    assert not (directory / "dead-job.jsonl").exists()
    assert not (directory / "dead-job.run").exists()
    assert (directory / "live-job.jsonl").exists()  # its supervisor (we) is alive
    assert (directory / "live-job.run").exists()


def test_sweep_never_kills_a_reused_pid(child: Argv, tmp_path: Path, procs: list) -> None:
    directory = tmp_path / "jobs"
    directory.mkdir()
    bystander = start(procs, child("sleeper.py"), start_new_session=True,
                      stdout=subprocess.DEVNULL)  # fmt: skip
    ticks = _identity(bystander.pid)[1]
    lines = [
        {"job": "old", "since": 0, "supervisor": [bystander.pid, ticks - 1]},
        {"pid": bystander.pid, "start": ticks - 1},  # same pid, other start time: reused
    ]
    (directory / "old.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    assert records.sweep(directory) == 0
    with pytest.raises(subprocess.TimeoutExpired):  # a SIGKILL would end it well within this
        bystander.wait(timeout=0.3)


def test_runtime_dir_prefers_xdg(tmp_path: Path) -> None:
    found = records.runtime_dir({"XDG_RUNTIME_DIR": str(tmp_path)})
    assert found == str(tmp_path / "xpulaunch" / "jobs")
    missing = records.runtime_dir({"XDG_RUNTIME_DIR": str(tmp_path / "missing")})
    assert missing == f"/tmp/xpulaunch-{os.getuid()}/jobs"


def test_identity_is_pid_and_start_ticks(child: Argv, procs: list) -> None:
    proc = start(procs, child("sleeper.py"), stdout=subprocess.DEVNULL)
    ticks = procfs.start_ticks(proc.pid)
    assert ticks is not None
    assert procfs.is_running(proc.pid, ticks)
    assert not procfs.is_running(proc.pid, ticks + 1)  # the same pid, another process
    started_s = procfs.start_time_s(proc.pid)
    assert started_s is not None and abs(started_s - time.time()) < 60
    proc.kill()
    proc.wait()
    assert procfs.start_ticks(proc.pid) is None
    assert not procfs.is_running(proc.pid, ticks)


def test_a_zombie_is_not_running(procs: list) -> None:
    proc = start(procs, [sys.executable, "-S", "-c", "pass"])
    wait_for(lambda: _state(proc.pid) == "Z")  # exited, not reaped yet
    info = procfs.process_info(proc.pid)
    assert info is not None and info.gone
    assert procfs.start_ticks(proc.pid) is None


def _state(pid: int) -> str | None:
    info = procfs.process_info(pid)
    return None if info is None else info.state


def test_guardian_reads_worker_lines_until_done() -> None:
    lines = [b"s 12 34\n", b"hello\n", b"s 1x 2\n", b"s 56 78\n", b"s 9"]
    assert guardian.read_workers(lines) == {12: 34, 56: 78}
    assert guardian.read_workers([b"s 12 34\n", b"done\n", b"s 56 78\n"]) is None
