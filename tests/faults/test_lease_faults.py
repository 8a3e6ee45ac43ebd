"""Leases that hold: a process that left the job keeps its device; every entry point finds the
same lock directory; nothing slow or stopped holds ``allocate.lock``; a planted ticket holds
nobody back. Real processes, real flocks, real signals."""

from __future__ import annotations

import fcntl
import json
import os
import pwd
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from fault_cli import Launch, finish
from helpers import lock_is_free, wait_for
from xpulaunch.leases import LeaseManager
from xpulaunch.leases.lock_files import lock_file_name

BUS = "0000:01:00.0"

# A worker whose grandchild leaves the job: its own session, an empty environment (no job
# marker) and, with "cgroup", the root cgroup (as root may). It keeps the inherited lease fd.
ESCAPE = """
import os, sys, time
out, how = sys.argv[1], sys.argv[2]
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        if how == "cgroup":
            root = [l.split()[1] for l in open("/proc/mounts") if l.split()[2] == "cgroup2"][0]
            with open(os.path.join(root, "cgroup.procs"), "w") as procs:
                procs.write("0")
        script = 'echo $$ > "$1.tmp" && mv "$1.tmp" "$1" && exec sleep 120'
        os.execve("/bin/sh", ["/bin/sh", "-c", script, "sh", out], {})
    os._exit(0)
while not os.path.exists(out):
    time.sleep(0.01)
"""

HOLD = """
import fcntl, os, sys, time
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o666)
fcntl.flock(fd, fcntl.LOCK_EX)
if len(sys.argv) > 2:
    os.write(fd, sys.argv[2].encode())
open(sys.argv[1] + ".held", "w").close()
time.sleep(600)
"""


def inventory(tmp_path: Path) -> str:
    path = tmp_path / "inventory.json"
    device = {"vendor": "nvidia", "index": 0, "name": "NVIDIA H100", "pci_bus_id": BUS}
    path.write_text(json.dumps({"schema": "xpulaunch.inventory/1", "devices": [device]}))
    return str(path)


def _cgroup2_root() -> str | None:
    with open("/proc/mounts") as mounts:
        roots = [line.split()[1] for line in mounts if line.split()[2] == "cgroup2"]
    writable = roots and os.access(os.path.join(roots[0], "cgroup.procs"), os.W_OK)
    return roots[0] if writable else None


def _hold(path: Path, content: str = "") -> subprocess.Popen[bytes]:
    extra = [content] if content else []
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(path), *extra])
    wait_for(Path(f"{path}.held").exists, f"a stranger to lock {path.name}")
    return holder


def _end(proc: subprocess.Popen[bytes]) -> None:
    proc.kill()
    proc.wait()


@pytest.mark.parametrize("how", ["cgroup", "no-cgroup"])
def test_a_process_that_left_the_job_keeps_its_device_leased(
    launch: Launch, tmp_path: Path, how: str
) -> None:
    if how == "cgroup" and _cgroup2_root() is None:
        pytest.skip("leaving a cgroup needs write access to the cgroup2 root (root)")
    locks, out = tmp_path / "locks", tmp_path / "escapee.pid"
    env = {"XPULAUNCH_CGROUP": "0"} if how == "no-cgroup" else {}
    args = ("--lock-dir", str(locks), "--inventory", inventory(tmp_path))
    proc = launch("run", *args, "--gpus", "1", sys.executable, "-c", ESCAPE, str(out), how, env=env)
    code, _, err = finish(proc)
    escapee = psutil.Process(int(out.read_text()))
    try:
        assert code == 0, err
        # The kernel's truth: the lease is still locked, by the open file description the
        # escapee shares; xpulaunch used to unlock it (and hand the device out again).
        assert not lock_is_free(locks / lock_file_name(BUS))
        assert f"pid {escapee.pid} (sleep 120) left the job but still holds the lease" in err
        again = launch("run", *args, "--gpus", f"device={BUS}", "true")
        code, _, err = finish(again)
        assert code != 0 and "leased by" in err, err
    finally:
        escapee.kill()
        escapee.wait(10)
    wait_for(lambda: lock_is_free(locks / lock_file_name(BUS)), "the device to be free")


def test_two_processes_that_left_the_job_are_named_in_one_line(
    launch: Launch, tmp_path: Path
) -> None:
    locks, outs = tmp_path / "locks", [tmp_path / "first.pid", tmp_path / "second.pid"]
    args = ("--lock-dir", str(locks), "--inventory", inventory(tmp_path), "--gpus", "1")
    escape = " && ".join(f'"$0" -c "$1" {out} no-cgroup' for out in outs)
    proc = launch(
        "run", *args, "sh", "-c", escape, sys.executable, ESCAPE, env={"XPULAUNCH_CGROUP": "0"}
    )
    code, _, err = finish(proc)
    escapees = [psutil.Process(int(out.read_text())) for out in outs]
    try:
        assert code == 0, err
        first = min(e.pid for e in escapees)
        assert f"pid {first} (sleep 120) and 1 more left the job but still hold the lease" in err
        assert "until they exit" in err
    finally:
        for escapee in escapees:
            escapee.kill()
            escapee.wait(10)


def test_the_python_api_finds_the_lock_dir_the_cli_uses(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    shared = tmp_path / "shared-locks"
    monkeypatch.setenv("XPULAUNCH_LOCK_DIR", str(shared))
    manager = LeaseManager()
    assert (manager.lock_dir, manager.directory.shared) == (shared, True)
    env_only = LeaseManager(env={"XPULAUNCH_LOCK_DIR": str(shared), "XDG_RUNTIME_DIR": "/"})
    assert env_only.lock_dir == shared
    assert LeaseManager(tmp_path / "given").lock_dir == tmp_path / "given"  # explicit wins


def test_a_cpu_launch_takes_no_lock(launch: Launch, tmp_path: Path) -> None:
    locks = tmp_path / "locks"
    locks.mkdir()
    holder = _hold(locks / "allocate.lock")
    try:
        started = time.monotonic()
        proc = launch("run", "--lock-dir", str(locks), "--gpus", "none", "true",
                      env={"XPULAUNCH_LOCK_TIMEOUT": "3"})  # fmt: skip
        code, _, err = finish(proc)
        assert code == 0, err  # it used to wait 3 s, then fail blaming "something else"
        assert time.monotonic() - started < 2.5
    finally:
        _end(holder)


def test_a_stopped_holder_of_the_allocation_lock_is_named_as_stopped(
    launch: Launch, tmp_path: Path
) -> None:
    locks = tmp_path / "locks"
    locks.mkdir()
    holder = _hold(locks / "allocate.lock")
    try:
        holder.send_signal(signal.SIGSTOP)
        proc = launch("status", "--lock-dir", str(locks), env={"XPULAUNCH_LOCK_TIMEOUT": "0.5"})
        code, _, err = finish(proc)
    finally:
        _end(holder)
    assert code != 0
    assert f"pid {holder.pid}" in err
    assert "which is stopped (Ctrl-Z or SIGSTOP) while it holds the lock" in err
    assert f"kill -CONT {holder.pid}" in err


CTRL_Z_INSIDE = """
import os, signal, sys, time
from xpulaunch.leases.lock_directory import LockDirectory
directory = LockDirectory(sys.argv[1], shared=True)
directory.ensure(create=True)
with directory.allocation_lock():
    os.kill(os.getpid(), signal.SIGTSTP)  # Ctrl-Z while the lock is held
    print("held", flush=True)
    time.sleep(0.5)
print("let go", flush=True)
"""


def test_ctrl_z_while_holding_the_allocation_lock_stops_only_after_letting_go(
    tmp_path: Path,
) -> None:
    locks = tmp_path / "locks"
    # Its own process group in our session: a terminal stop signal to an orphaned group is
    # discarded by the kernel, so this is how a shell's job receives Ctrl-Z.
    child = subprocess.Popen(
        [sys.executable, "-c", CTRL_Z_INSIDE, str(locks)], stdout=subprocess.PIPE,
        process_group=0,
    )  # fmt: skip
    try:
        assert child.stdout is not None
        ready = select.select([child.stdout], [], [], 20)[0]
        assert ready, "stopped while holding the lock"  # what it used to do
        assert child.stdout.readline() == b"held\n"
        process = psutil.Process(child.pid)
        wait_for(lambda: process.status() == psutil.STATUS_STOPPED, "the deferred stop")
        assert lock_is_free(locks / "allocate.lock")
        process.resume()
        assert child.stdout.readline() == b"let go\n"
        assert child.wait(10) == 0
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()


def _nobody() -> tuple[int, str]:
    entry = pwd.getpwnam("nobody")
    return entry.pw_uid, entry.pw_name


@pytest.mark.parametrize("content", ["{}", "own-pid"])
def test_a_planted_ticket_holds_nobody_back_and_is_named_with_its_owner(
    launch: Launch, tmp_path: Path, content: str
) -> None:
    if os.getuid() != 0:
        pytest.skip("planting a file of another user needs root")
    locks = tmp_path / "locks"
    locks.mkdir(mode=0o1777)
    ticket = locks / "wait-000000000000-1.ticket"
    if content == "own-pid":  # a record copied from a real waiter, naming a live pid of ours
        record = {"pid": os.getpid(), "argv": ["xpulaunch"], "user": "x", "since_s": 1.0,
                  "job_id": "j", "hostname": os.uname().nodename}  # fmt: skip
        content = json.dumps(record)
    holder = _hold(ticket, content)
    uid, name = _nobody()
    os.chown(ticket, uid, uid)
    try:
        started = time.monotonic()
        proc = launch("run", "--lock-dir", str(locks), "--inventory", inventory(tmp_path),
                      "--gpus", "1", "--wait-timeout", "8", "true")  # fmt: skip
        code, _, err = finish(proc)
        assert code == 0, err  # it used to wait the 8 s: "1 earlier launch(es) go first"
        assert time.monotonic() - started < 6
        status = launch("status", "--lock-dir", str(locks), "--json")
        code, out, err = finish(status)
        assert code == 0, err
        [waiter] = json.loads(out)["waiting"]
        assert waiter["owner"] == f"user {name}"
        assert waiter["ignored"]
        text = finish(launch("status", "--lock-dir", str(locks)))[1]
        assert "ignored" in text and f"a file of user {name}" in text
    finally:
        _end(holder)


def test_a_real_waiter_is_named_to_the_launches_behind_it(launch: Launch, tmp_path: Path) -> None:
    locks, inv = tmp_path / "locks", inventory(tmp_path)
    marker = tmp_path / "holding"
    hold = f"import pathlib, time; pathlib.Path({str(marker)!r}).touch(); time.sleep(600)"
    args = ("--lock-dir", str(locks), "--inventory", inv, "--gpus", "1")
    holder = launch("run", *args, sys.executable, "-c", hold)
    wait_for(marker.exists, "the holder to run")
    first = launch("run", *args, "--wait", "true")
    wait_for(lambda: list(locks.glob("wait-*.ticket")), "the first waiter to queue")
    second = launch("run", *args, "--wait-timeout", "1", "true")
    code, _, err = finish(second)
    assert code != 0
    assert f"1 earlier launch(es) go first (pid {first.pid} of user " in err
    for proc in (first, holder):
        proc.send_signal(signal.SIGTERM)
        finish(proc)


@pytest.mark.parametrize("lock_dir", ["exists", "not yet"])
def test_a_negative_lock_timeout_is_a_usage_error(
    launch: Launch, tmp_path: Path, lock_dir: str
) -> None:
    locks = tmp_path / "locks"
    if lock_dir == "exists":
        locks.mkdir()
    proc = launch("status", "--lock-dir", str(locks), env={"XPULAUNCH_LOCK_TIMEOUT": "-1"})
    code, _, err = finish(proc)
    assert code == 2, err
    assert "XPULAUNCH_LOCK_TIMEOUT='-1'" in err


def test_flock_of_a_file_we_hold_is_ours(tmp_path: Path) -> None:
    """The helper test above relies on: another open of the lock file does not share our
    lock (so a status probe is never taken for a survivor)."""
    from xpulaunch.processes.procfs import flock_sharers

    path = tmp_path / "f.lock"
    fd = os.open(path, os.O_RDONLY | os.O_CREAT)
    fcntl.flock(fd, fcntl.LOCK_EX)
    st = os.fstat(fd)
    inode = (st.st_dev, st.st_ino)
    with open(path, "rb") as another_open:  # the same file, its own open file description
        other = subprocess.Popen(["sleep", "30"], stdin=another_open)
    sharer = subprocess.Popen(["sleep", "30"], pass_fds=(fd,))
    try:
        found = wait_for(lambda: flock_sharers([fd], exclude=frozenset({os.getpid()})) or None)
        assert found == {sharer.pid: {inode}}
    finally:
        for proc in (other, sharer):
            _end(proc)
        os.close(fd)


def test_another_jobs_shared_lock_of_the_same_file_is_not_ours(tmp_path: Path) -> None:
    """Slot jobs of one device each hold their own shared lock of its lock file: a process
    of another job lists a lock there too, but not ours."""
    from xpulaunch.processes.procfs import flock_sharers

    path = tmp_path / "f.lock"
    fd = os.open(path, os.O_RDONLY | os.O_CREAT)
    fcntl.flock(fd, fcntl.LOCK_SH)
    st = os.fstat(fd)
    inode = (st.st_dev, st.st_ino)
    take_own = "import fcntl, time; fcntl.flock(0, fcntl.LOCK_SH); print(); time.sleep(30)"
    with open(path, "rb") as another_open:  # its own open file description, its own lock
        other = subprocess.Popen(
            [sys.executable, "-u", "-c", take_own], stdin=another_open, stdout=subprocess.PIPE
        )
    sharer = subprocess.Popen(["sleep", "30"], pass_fds=(fd,))
    try:
        assert other.stdout is not None and other.stdout.readline() == b"\n"  # it has its lock
        found = wait_for(lambda: flock_sharers([fd], exclude=frozenset({os.getpid()})) or None)
        assert found == {sharer.pid: {inode}}
    finally:
        for proc in (other, sharer):
            _end(proc)
        os.close(fd)


def test_a_slot_job_that_ends_beside_another_names_no_survivor(
    launch: Launch, tmp_path: Path
) -> None:
    locks, inv = tmp_path / "locks", inventory(tmp_path)
    wait_then = 'touch "$0.started"; while [ ! -e "$0.go" ]; do sleep 0.02; done'
    args = ("--lock-dir", str(locks), "--inventory", inv, "--gpus", "1", "--slots-per-gpu", "2")
    first = launch("run", *args, "sh", "-c", wait_then, str(tmp_path / "first"))
    wait_for((tmp_path / "first.started").exists, "the first slot job to run")
    second = launch("run", *args, "sh", "-c", wait_then, str(tmp_path / "second"))
    wait_for((tmp_path / "second.started").exists, "the second slot job to run")
    (tmp_path / "first.go").touch()
    code, _, err = finish(first)
    (tmp_path / "second.go").touch()
    second_code, _, second_err = finish(second)
    # The second job's own shared lock of the device's lock file used to be taken for the
    # first job's lease: "pid N (... the second xpulaunch) left the job but still holds it".
    assert (code, second_code) == (0, 0), err + second_err
    assert "left the job" not in err
    assert lock_is_free(locks / lock_file_name(BUS))
