"""Re-run the round-3 fault sweep (``faults-round3.md``): its reproductions and variants of them.

    python bench/fault_sweep.py [--rounds N] [--only SUBSTRING] [--xpulaunch-src DIR]

Each trial starts the real ``xpulaunch`` (``python -m xpulaunch``) in a scratch directory of
its own (its own ``XDG_RUNTIME_DIR`` and lock directory), under a bound, and checks what the
sweep counted:

* **hang**: the launch did not end within its bound (a frozen loop, a lock waited on for ever);
* **traceback**: ``Traceback`` on its stderr;
* **double-booked**: a device handed to a new job while a process of the old one still held it;
* **good job failed**: a job whose workers all succeeded ended with a status other than 0
  (a full disk, a removed ``--log-dir``, a closed stream);
* **wrong**: anything else the trial expects (the exit status, a message, a file left).

Full-disk trials use a 1 MiB tmpfs (root: ``mount``); cgroup escapes need write access to the
cgroup2 root (root). Without them those trials are reported as skipped, never as passed. Every
process a trial starts is ended by its pid; loops are bounded. ``--xpulaunch-src`` runs another
checkout's sources (for a before/after comparison: ``git worktree add /tmp/old 4f66102``, then
``--xpulaunch-src /tmp/old/src``). Exit status: 0 when every trial that ran passed.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from sweep_kit import (
    BUS,
    FAKE_LLAMA,
    KINDS,
    ROOT,
    TRIALS,
    Outcome,
    Scratch,
    Skip,
    finish,
    judge,
    trial,
    wait_until,
)

# -- A. leases (D1, D6/API, D7, D19) ------------------------------------------------------
ESCAPE = """
import os, sys, time
out, how = sys.argv[1], sys.argv[2]
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        if how.startswith("cgroup"):
            root = [l.split()[1] for l in open("/proc/mounts") if l.split()[2] == "cgroup2"][0]
            target = root
            if how == "cgroup-sibling":
                target = os.path.join(root, "escape-%d" % os.getpid())
                os.mkdir(target)
            with open(os.path.join(target, "cgroup.procs"), "w") as procs:
                procs.write("0")
        script = 'echo $$ > "$1.tmp" && mv "$1.tmp" "$1" && exec sleep 120'
        os.execve("/bin/sh", ["/bin/sh", "-c", script, "sh", out], {})
    os._exit(0)
while not os.path.exists(out):
    time.sleep(0.01)
if len(sys.argv) > 3:
    time.sleep(float(sys.argv[3]))
"""


def _cgroup_root_writable() -> bool:
    with open("/proc/mounts") as mounts:
        roots = [line.split()[1] for line in mounts if line.split()[2] == "cgroup2"]
    return bool(roots) and os.access(os.path.join(roots[0], "cgroup.procs"), os.W_OK)


def _escape(how: str, end: str) -> Callable[[Scratch, Outcome], None]:
    def run(s: Scratch, o: Outcome) -> None:
        if how.startswith("cgroup") and not _cgroup_root_writable():
            raise Skip("leaving a cgroup needs write access to the cgroup2 root")
        out, inv = s.root / "escapee.pid", s.inventory()
        env = {"XPULAUNCH_CGROUP": "0"} if how == "no-cgroup" else {}
        linger = ["30"] if end == "sigterm" else []
        proc = s.start("run", "--inventory", inv, "--gpus", "1", "--grace", "2",
                       sys.executable, "-c", ESCAPE, str(out), how, *linger, env=env)  # fmt: skip
        if not wait_until(out.exists):
            o.fail("wrong", "the escapee never started")
            return
        escapee = int(out.read_text())
        s.pids.append(escapee)
        if how == "cgroup-sibling":
            with open("/proc/mounts") as mounts:
                root = next(line.split()[1] for line in mounts if line.split()[2] == "cgroup2")
            s.cgroups.append(Path(root) / f"escape-{escapee}")
        if end == "sigterm":
            time.sleep(0.3)
            proc.terminate()
        status, _, err = finish(proc, 60)
        judge(o, status, err, good=end == "normal", expect=None if end == "sigterm" else 0)
        again, _, _ = s.run("run", "--inventory", inv, "--gpus", f"device={BUS}", "true")
        if again == 0:
            o.fail("double-booked", f"pid {escapee} still held {BUS}")
        elif "left the job but still holds" not in err:
            o.fail("wrong", "the survivor was not named")

    return run


for _how in ("cgroup", "cgroup-sibling", "no-cgroup"):
    for _end in ("normal", "sigterm"):
        trial(f"A1 escapee keeps the lease ({_how}, {_end})")(_escape(_how, _end))

API_HOLDER = """
import sys, time
import xpulaunch
from xpulaunch.leases import LeaseManager
inv = sys.argv[1]
plan, lease = LeaseManager().allocate(
    lambda held: xpulaunch.plan(["true"], gpus="1", inventory=inv, unavailable=held))
print("held", flush=True)
time.sleep(60)
"""


@trial("A2 API lease and CLI job in the shared lock dir")
def _api_and_cli(s: Scratch, o: Outcome) -> None:
    inv = s.inventory()
    holder = subprocess.Popen([sys.executable, "-c", API_HOLDER, inv], env=s.env,
                              stdout=subprocess.PIPE)  # fmt: skip
    s.started.append(holder)
    assert holder.stdout is not None
    if holder.stdout.readline() != b"held\n":
        o.fail("wrong", "the API holder did not lease")
        return
    status, _, err = s.run("run", "--inventory", inv, "--gpus", "1", "true")
    if status == 0:
        o.fail("double-booked", "a CLI job got the device the API job holds")
    elif "Traceback" in err:
        o.fail("traceback", err[-160:])


HOLD = """
import fcntl, os, sys, time
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o666)
fcntl.flock(fd, fcntl.LOCK_EX)
if len(sys.argv) > 2:
    os.write(fd, sys.argv[2].encode())
open(sys.argv[1] + ".held", "w").close()
time.sleep(600)
"""


def _hold(s: Scratch, path: Path, content: str = "") -> subprocess.Popen[bytes]:
    path.parent.mkdir(parents=True, exist_ok=True)
    extra = [content] if content else []
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(path), *extra])
    s.started.append(holder)
    wait_until(Path(f"{path}.held").exists)
    return holder


def _held_lock(what: str) -> Callable[[Scratch, Outcome], None]:
    def run(s: Scratch, o: Outcome) -> None:
        holder = _hold(s, s.root / "locks" / "allocate.lock")
        env = {"XPULAUNCH_LOCK_TIMEOUT": "3"}
        if what == "stopped":
            holder.send_signal(signal.SIGSTOP)
            status, _, err = s.run("status", env=env, timeout_s=30)
            judge(o, status, err, good=False, expect=None)
            if "which is stopped" not in err:
                o.fail("wrong", "the stopped holder was not named as stopped")
            return
        started = time.monotonic()
        status, _, err = s.run("run", "--gpus", "none", "true", env=env, timeout_s=30)
        judge(o, status, err)
        if time.monotonic() - started > 2.5:
            o.fail("hang", "--gpus none waited for allocate.lock")

    return run


trial("A3 --gpus none beside a held allocate.lock")(_held_lock("held"))
trial("A3 a stopped allocate.lock holder is named")(_held_lock("stopped"))


@trial("A4 slow llama --list-devices holds up no other launch")
def _slow_listing(s: Scratch, o: Outcome) -> None:
    listing = s.root / "listing"
    slow = s.root / "slow-llama"
    slow.write_text(f'#!/bin/sh\n[ "$1" = --list-devices ] && {{ touch {listing}; sleep 6; }}\n'
                    f'exec {sys.executable} {FAKE_LLAMA} "$@"\n')  # fmt: skip
    slow.chmod(0o755)
    model = s.root / "m.gguf"
    model.write_bytes(b"GGUF")
    inv = s.inventory(2)
    server = s.start("llama", "-m", str(model), "--binary", str(slow), "--inventory", inv,
                     "--gpus", "1")  # fmt: skip
    if not wait_until(listing.exists):
        o.fail("wrong", "the listing never started")
        return
    started = time.monotonic()
    status, _, err = s.run("run", "--inventory", inv, "--gpus", "1", "true",
                           env={"XPULAUNCH_LOCK_TIMEOUT": "3"}, timeout_s=30)  # fmt: skip
    judge(o, status, err)
    if time.monotonic() - started > 2.5:
        o.fail("hang", "a launch waited for another's --list-devices")
    server.terminate()


@trial("A5 a hung listing behind a wrapper leaves no process")
def _hung_listing(s: Scratch, o: Outcome) -> None:
    child = s.root / "child.pid"
    wrapper = s.root / "wrapper"
    wrapper.write_text(f"#!/bin/sh\nsleep 300 & echo $! > {child}\nwait\n")
    wrapper.chmod(0o755)
    code = ("import os, sys\nfrom xpulaunch.llamacpp.binary import list_devices\n"
            "try:\n    list_devices(sys.argv[1], dict(os.environ), timeout_s=0.5)\n"
            "except Exception as exc:\n    print(type(exc).__name__)\n")  # fmt: skip
    subprocess.run([sys.executable, "-c", code, str(wrapper)], env=s.env, timeout=30,
                   capture_output=True, check=False)  # fmt: skip
    pid = int(child.read_text())
    s.pids.append(pid)
    if not wait_until(lambda: not _alive(pid), 5):
        o.fail("wrong", f"the real binary (pid {pid}) outlived the timeout")


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        return False


def _planted(content: str) -> Callable[[Scratch, Outcome], None]:
    def run(s: Scratch, o: Outcome) -> None:
        if os.getuid() != 0:
            raise Skip("planting another user's file needs root")
        locks = s.root / "shared"
        locks.mkdir(mode=0o1777)
        ticket = locks / "wait-000000000000-1.ticket"
        text = content
        if content == "record":
            record = {"pid": os.getpid(), "argv": ["xpulaunch"], "user": "x", "since_s": 1.0,
                      "job_id": "j", "hostname": os.uname().nodename}  # fmt: skip
            text = json.dumps(record)
        _hold(s, ticket, text)
        os.chown(ticket, 65534, 65534)
        started = time.monotonic()
        args = ("--lock-dir", str(locks), "--inventory", s.inventory(), "--gpus", "1")
        status, _, err = s.run("run", *args, "--wait-timeout", "8", "true", timeout_s=30)
        judge(o, status, err)
        if time.monotonic() - started > 6:
            o.fail("hang", "a planted ticket held the launch back")
        _, out, _ = s.run("status", "--lock-dir", str(locks))
        if "ignored" not in out or "a file of user" not in out:
            o.fail("wrong", "status did not name the planted ticket's owner")

    return run


trial("A6 planted ticket (empty record)")(_planted("{}"))
trial("A6 planted ticket (a copied record naming a live pid)")(_planted("record"))


@trial("A7 Ctrl-Z while holding allocate.lock")
def _ctrl_z(s: Scratch, o: Outcome) -> None:
    import select

    code = ("import os, signal, sys, time\n"
            "from xpulaunch.leases.lock_directory import LockDirectory\n"
            "d = LockDirectory(sys.argv[1], shared=True); d.ensure(create=True)\n"
            "with d.allocation_lock():\n    os.kill(os.getpid(), signal.SIGTSTP)\n"
            "    print('held', flush=True)\n    time.sleep(0.5)\n"
            "print('after', flush=True)\n")  # fmt: skip
    # Its own process group in our session: the kernel discards Ctrl-Z in an orphaned one.
    child = subprocess.Popen([sys.executable, "-c", code, str(s.root / "locks")], env=s.env,
                             stdout=subprocess.PIPE, process_group=0)  # fmt: skip
    s.started.append(child)
    assert child.stdout is not None
    if not select.select([child.stdout], [], [], 20)[0]:
        o.fail("hang", "stopped while holding allocate.lock")
        return
    child.stdout.readline()
    if not wait_until(lambda: _state(child.pid) == "T", 10):
        o.fail("wrong", "the deferred Ctrl-Z never stopped it")
    elif not _lock_free(s.root / "locks" / "allocate.lock"):
        o.fail("hang", "stopped with allocate.lock held")
    os.kill(child.pid, signal.SIGCONT)


def _state(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "?"


def _lock_free(path: Path) -> bool:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return True
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    finally:
        os.close(fd)
    return True


# -- B. freezes (D2, D12) ---------------------------------------------------------------
def _fill(fd: int) -> None:
    """Write to a pipe until it is full: a reader that stopped reading long ago."""
    os.set_blocking(fd, False)
    with contextlib.suppress(BlockingIOError):
        while True:
            os.write(fd, b"x" * 4096)


def _unread_events(kind: str, full: bool) -> Callable[[Scratch, Outcome], None]:
    def run(s: Scratch, o: Outcome) -> None:
        common = ("--restart", "always", "--backoff", "0", "--grace", "2", "sh", "-c", "exit 1")
        keep: list[int] = []
        if kind == "stdout pipe":  # a pipe whose reader never reads
            read_end, write_end = os.pipe()
            keep += [read_end, write_end]
            if full:
                _fill(write_end)
                os.set_blocking(write_end, True)
            proc = s.start("run", "--events", "-", *common, stdout=write_end)
        else:
            fifo = s.root / "events.fifo"
            os.mkfifo(fifo)
            keep.append(os.open(fifo, os.O_RDONLY | os.O_NONBLOCK))
            if full:
                keep.append(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
                _fill(keep[-1])
            proc = s.start("run", "--events", str(fifo), *common)
        try:
            time.sleep(4)
            proc.terminate()
            status, _, err = finish(proc, 15)
        finally:
            for fd in keep:
                os.close(fd)
        judge(o, status, err, good=False, expect=143)

    return run


for _kind in ("stdout pipe", "fifo"):
    for _full in (False, True):
        _what = "--events - to a pipe" if _kind == "stdout pipe" else "--events FIFO"
        _state_of = "full and unread" if _full else "unread"
        trial(f"B1 {_what}, {_state_of}, then SIGTERM")(_unread_events(_kind, _full))


@trial("B2 --events FIFO nobody opens")
def _fifo_nobody(s: Scratch, o: Outcome) -> None:
    fifo = s.root / "events.fifo"
    os.mkfifo(fifo)
    status, _, err = s.run("run", "--events", str(fifo), "true", timeout_s=20)
    judge(o, status, err)


def _stopped_guardian(full: bool) -> Callable[[Scratch, Outcome], None]:
    return lambda s, o: _guardian_stopped(s, o, full)


trial("B3 stopped guardian under a restart loop, then SIGTERM")(_stopped_guardian(False))
trial("B3 stopped guardian with a full pipe, then SIGTERM")(_stopped_guardian(True))


def _guardian_stopped(s: Scratch, o: Outcome, full: bool) -> None:
    proc = s.start("run", "--restart", "always", "--backoff", "0", "--grace", "2",
                   "--nproc-per-node", "8", "--isolate", "sh", "-c", "exit 1")  # fmt: skip
    jobs = s.root / "xpulaunch" / "jobs"
    if not wait_until(lambda: list(jobs.glob("*.jsonl"))):
        o.fail("wrong", "no job record")
        return
    [record] = jobs.glob("*.jsonl")
    guardian = json.loads(record.read_text().splitlines()[0])["guardian"][0]
    s.pids.append(guardian)
    os.kill(guardian, signal.SIGSTOP)
    if full:  # stopped for long: its pipe is full (/proc/PID/fd/0 reopens the pipe to write)
        with contextlib.suppress(OSError):
            stuffing = os.open(f"/proc/{guardian}/fd/0", os.O_WRONLY | os.O_NONBLOCK)
            _fill(stuffing)
            os.close(stuffing)
    time.sleep(6)
    proc.terminate()
    status, _, err = finish(proc, 15)
    os.kill(guardian, signal.SIGCONT)
    judge(o, status, err, good=False, expect=143)


@trial("B4 a console nobody reads, then SIGTERM")
def _console_unread(s: Scratch, o: Outcome) -> None:
    proc = s.start("run", "--grace", "2", "sh", "-c", "yes xxxxxxxxxxxxxxxxxxxxxxxx")
    time.sleep(2)
    proc.terminate()
    status, _, err = finish(proc, 15)
    judge(o, status, err, good=False, expect=143)


# -- C. full disk, removed dirs (D3, D9, D10) ---------------------------------------------
def _summary_full(layout: tuple[str, ...]) -> Callable[[Scratch, Outcome], None]:
    def run(s: Scratch, o: Outcome) -> None:
        disk = s.small_disk(8192)
        logs = disk / "logs"
        if layout and layout[0] == "torchrun":
            args = ["torchrun", "--standalone", "--nproc-per-node", "2", "--log-dir", str(logs),
                    "--no-python", sys.executable, "-c", "print('x' * 60)"]  # fmt: skip
        else:
            args = ["run", "--log-dir", str(logs), "--nproc-per-node", "2", *layout,
                    sys.executable, "-c", "print('x' * 60)"]  # fmt: skip
        status, _, err = s.run(*args)
        judge(o, status, err)
        if list(disk.rglob("*.tmp")):
            o.fail("wrong", "a .tmp was left")

    return run


trial("C1 summary.json on a full disk (our layout)")(_summary_full(()))
trial("C1 summary.json on a full disk (--log-layout torchrun)")(
    _summary_full(("--log-layout", "torchrun"))
)
trial("C1 summary.json on a full disk (xpulaunch torchrun)")(_summary_full(("torchrun",)))


@trial("C2 --events on a full disk: whole lines")
def _events_full(s: Scratch, o: Outcome) -> None:
    disk = s.small_disk(6000)
    events = disk / "events.jsonl"
    status, _, err = s.run("run", "--events", str(events), "--restart", "always",
                           "--max-restarts", "60", "--backoff", "0", "true")  # fmt: skip
    judge(o, status, err)
    for line in events.read_text().splitlines():
        try:
            json.loads(line)
        except ValueError:
            o.fail("wrong", f"a cut JSON line: {line[-60:]!r}")
            break


@trial("C2 --events /dev/full")
def _events_dev_full(s: Scratch, o: Outcome) -> None:
    status, _, err = s.run("run", "--events", "/dev/full", "echo", "ok")
    judge(o, status, err)


@trial("C3 --log-dir removed during the run")
def _log_dir_removed(s: Scratch, o: Outcome) -> None:
    logs = s.root / "logs"
    proc = s.start("run", "--log-dir", str(logs), "sh", "-c", "sleep 1.5")
    wait_until((logs / "attempt_0").exists)
    time.sleep(0.3)
    shutil.rmtree(logs, ignore_errors=True)
    status, _, err = finish(proc, 30)
    judge(o, status, err)


@trial("C4 log lines on a nearly full disk")
def _log_lines_full(s: Scratch, o: Outcome) -> None:
    disk = s.small_disk(8192)
    logs = disk / "logs"
    code = "for i in range(300): print(i, 'x' * 50)"
    status, _, err = s.run("run", "--log-dir", str(logs), sys.executable, "-c", code)
    judge(o, status, err)
    text = (logs / "attempt_0" / "0.log").read_text()
    if text and not text.endswith("\n"):
        o.fail("wrong", "the log ends in half a line")
    if "log file" not in err:
        o.fail("wrong", "lost lines were not reported")


@trial("C5 console redirected to a full disk")
def _console_full(s: Scratch, o: Outcome) -> None:
    disk = s.small_disk(4096)
    code = "for i in range(3000): print(i, 'x' * 50)"
    with open(disk / "console.log", "wb") as out:
        status, _, err = s.run("run", "--nproc-per-node", "2", sys.executable, "-c", code,
                               stdout=out)  # fmt: skip
    judge(o, status, err)
    if "stdout:" not in err:
        o.fail("wrong", "the lost console output was not reported")


@trial("C6 heartbeat with its directory removed")
def _heartbeat_gone(s: Scratch, o: Outcome) -> None:
    logs, beating = s.root / "logs", s.root / "beating"
    code = ("import pathlib, sys, time, xpulaunch\nfor step in range(15):\n"
            "    xpulaunch.heartbeat()\n    if step == 2: pathlib.Path(sys.argv[1]).touch()\n"
            "    time.sleep(0.2)\n")  # fmt: skip
    proc = s.start("run", "--log-dir", str(logs), "--hang-timeout", "30", "--heartbeat",
                   sys.executable, "-c", code, str(beating))  # fmt: skip
    wait_until(beating.exists)
    shutil.rmtree(logs, ignore_errors=True)
    status, _, err = finish(proc, 30)
    judge(o, status, err)


# -- D. closed streams, bad values, logs, cleanup (D5, D8, D11, D13, D16, D20) -------------
def _closed(fd: int, command: tuple[str, ...]) -> Callable[[Scratch, Outcome], None]:
    def run(s: Scratch, o: Outcome) -> None:
        ran = s.root / "ran"
        args = [*command, "sh", "-c", f"echo hi; touch {ran}"] if command[0] == "run" else command
        status, _, err = s.run(*args, preexec_fn=lambda: os.close(fd))
        judge(o, status, err)
        if command[0] == "run" and not ran.exists():
            o.fail("good job failed", "the job never ran")

    return run


for _fd, _name in ((1, "stdout"), (2, "stderr"), (0, "stdin")):
    trial(f"D1 closed {_name}: run")(_closed(_fd, ("run",)))
trial("D1 closed stdout: status")(_closed(1, ("status",)))
trial("D1 closed stdout: devices")(_closed(1, ("devices",)))


def _bad_value(env: dict[str, str], args: tuple[str, ...]) -> Callable[[Scratch, Outcome], None]:
    def run(s: Scratch, o: Outcome) -> None:
        status, _, err = s.run(*args, env=env)
        judge(o, status, err, good=False, expect=2)
        if status is not None and err.count("\n") != 1:
            o.fail("wrong", f"not one line: {err[:200]!r}")

    return run


trial("D2 XPULAUNCH_CGROUP=yes")(_bad_value({"XPULAUNCH_CGROUP": "yes"}, ("run", "true")))
trial("D2 XPULAUNCH_CGROUP=2")(_bad_value({"XPULAUNCH_CGROUP": "2"}, ("run", "true")))
trial("D2 XPULAUNCH_LOCK_TIMEOUT=-1")(_bad_value({"XPULAUNCH_LOCK_TIMEOUT": "-1"}, ("status",)))
trial("D2 --metrics-interval 0.001")(
    _bad_value({}, ("run", "--metrics-port", "0", "--metrics-interval", "0.001", "true"))
)


@trial("D3 a hang exits 123")
def _hang_status(s: Scratch, o: Outcome) -> None:
    # 123 (HANG_STATUS): 124 is a --max-runtime stop and 125 a node that lost its peers
    status, _, err = s.run("run", "--hang-timeout", "0.5", "sleep", "30")
    judge(o, status, err, good=False, expect=123)


@trial("D4 300 workers with --log-dir at ulimit -n 1024")
def _fd_limit(s: Scratch, o: Outcome) -> None:
    import resource

    def limit() -> None:
        resource.setrlimit(
            resource.RLIMIT_NOFILE, (1024, resource.getrlimit(resource.RLIMIT_NOFILE)[1])
        )

    status, _, err = s.run("run", "--nproc-per-node", "300", "--log-dir", str(s.root / "L"),
                           "--log-layout", "torchrun", "sh", "-c", "sleep 3",
                           preexec_fn=limit, timeout_s=120)  # fmt: skip
    judge(o, status, err)


@trial("D5 logs -f after the run dir is removed")
def _follow_removed(s: Scratch, o: Outcome) -> None:
    logs = s.root / "logs"
    job = s.start(
        "run", "--log-dir", str(logs), "sh", "-c", "for i in $(seq 20); do echo $i; sleep .3; done"
    )
    wait_until((logs / "attempt_0" / "0.log").exists)
    follower = s.start("logs", str(logs), "-f")
    time.sleep(0.8)
    shutil.rmtree(logs, ignore_errors=True)
    status, _, err = finish(follower, 10)
    judge(o, status, err)
    job.terminate()


@trial("D5 logs -f after kill -9 of the run")
def _follow_killed(s: Scratch, o: Outcome) -> None:
    logs = s.root / "logs"
    job = s.start("run", "--log-dir", str(logs), "sh", "-c", "sleep 20")
    wait_until((logs / "attempt_0" / "0.log").exists)
    follower = s.start("logs", str(logs), "-f")
    time.sleep(0.5)
    job.kill()
    status, _, err = finish(follower, 10)
    judge(o, status, err)


@trial("D5 logs of a FIFO and of a /dev/zero link")
def _logs_special(s: Scratch, o: Outcome) -> None:
    attempt = s.root / "logs" / "attempt_0"
    attempt.mkdir(parents=True)
    os.mkfifo(attempt / "0.log")
    (attempt / "1.log").symlink_to("/dev/zero")
    for rank in ("0", "1"):
        status, _, err = s.run("logs", str(s.root / "logs"), "--rank", rank, timeout_s=10)
        judge(o, status, err, good=False, expect=2)


@trial("D6 a worker with a nested cgroup")
def _nested_cgroup(s: Scratch, o: Outcome) -> None:
    if not _cgroup_root_writable():
        raise Skip("needs a job cgroup (root)")
    code = ("import os, time\n"
            "root = [l.split()[1] for l in open('/proc/mounts') if l.split()[2] == 'cgroup2'][0]\n"
            "own = [l[3:].strip() for l in open('/proc/self/cgroup') if l.startswith('0::')]\n"
            "leaf = root + own[0]\n"
            "print(leaf, flush=True)\nos.mkdir(os.path.join(leaf, 'sub'))\n"
            "open(os.path.join(leaf, 'sub', 'cgroup.procs'), 'w').write('0')\n"
            "time.sleep(0.3)\n")  # fmt: skip
    started = time.monotonic()
    status, out, err = s.run("run", sys.executable, "-c", code)
    judge(o, status, err)
    job = os.path.dirname(out.split("] ", 1)[-1].strip())
    if "xpulaunch-" in job and os.path.exists(job):
        o.fail("wrong", f"{job} was left behind")
        subprocess.run(["find", job, "-depth", "-type", "d", "-exec", "rmdir", "{}", ";"],
                       check=False, capture_output=True)  # fmt: skip
    if time.monotonic() - started > 1.9:
        o.fail("hang", "the exit waited for the cgroup")


@trial("D7 kill -9 of xpulaunch leaves no run directory")
def _run_dir_leak(s: Scratch, o: Outcome) -> None:
    proc = s.start("run", "sh", "-c", "sleep 30")
    jobs = s.root / "xpulaunch" / "jobs"
    wait_until(lambda: list(jobs.glob("*.run")))
    time.sleep(0.3)
    proc.kill()
    proc.wait()
    if not wait_until(lambda: not list(jobs.glob("*.run")), 10):
        o.fail("wrong", "a <job>.run directory leaked")


@trial("D8 a crash loop keeps 21 attempt directories")
def _retention(s: Scratch, o: Outcome) -> None:
    logs = s.root / "logs"
    code = ("import json, os, sys, xpulaunch\nxpulaunch.heartbeat()\n"
            "open(os.environ['TORCHELASTIC_ERROR_FILE'], 'w').write('{}')\n"
            "sys.exit(3)\n")  # fmt: skip
    status, _, err = s.run("run", "--log-dir", str(logs), "--max-restarts", "30", "--backoff", "0",
                           "--hang-timeout", "30", "--heartbeat", sys.executable, "-c", code,
                           timeout_s=120)  # fmt: skip
    judge(o, status, err, good=False, expect=3)
    kept = len(list(logs.glob("attempt_*")))
    if kept != 21:
        o.fail("wrong", f"{kept} attempt directories kept")


@trial("D9 xpulaunch logs in the folder holding logs/")
def _logs_parent(s: Scratch, o: Outcome) -> None:
    s.run("run", "--log-dir", "logs", "echo", "hello")
    status, out, err = s.run("logs")
    judge(o, status, err)
    if "hello" not in out:
        o.fail("wrong", "nothing printed")


def main() -> int:
    # Each area's trials live in a module of its own (bench/sweep_*.py) that registers them
    # in sweep_kit's TRIALS through its @trial.
    import sweep_queue  # noqa: F401
    import sweep_router  # noqa: F401
    import sweep_runpath  # noqa: F401

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=1, help="repeat every trial N times")
    parser.add_argument("--only", default="", help="run the trials whose name has this")
    parser.add_argument("--xpulaunch-src", default=str(ROOT / "src"))
    args = parser.parse_args()
    src = Path(args.xpulaunch_src).resolve()

    tally = {kind: 0 for kind in KINDS}
    ran = skipped = failed = 0
    for name, fn in TRIALS.items():
        if args.only not in name:
            continue
        for _ in range(args.rounds):
            outcome = Outcome()
            with tempfile.TemporaryDirectory(prefix="fault-sweep-") as tmp:
                scratch = Scratch(Path(tmp), src)
                try:
                    fn(scratch, outcome)
                except Skip as why:
                    skipped += 1
                    print(f"SKIP  {name}: {why}", flush=True)
                    continue
                except Exception as exc:
                    outcome.fail("wrong", f"the trial itself failed: {exc!r}")
                finally:
                    scratch.close()
            ran += 1
            for kind in outcome.found:
                tally[kind] += 1
            failed += bool(outcome.found)
            print(f"{'FAIL' if outcome.found else 'ok  '}  {name}", flush=True)
            for note in outcome.notes:
                print(f"        {note}", flush=True)
    print(f"\n{ran} trials ran, {failed} failed, {skipped} skipped")
    print("  ".join(f"{kind}: {count}" for kind, count in tally.items()))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
