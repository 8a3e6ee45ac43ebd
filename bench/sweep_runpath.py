"""Fault-sweep trials for the ``xpulaunch run`` path (round 4's newcomer 4 and faults 3, 10,
11), registered into ``bench/fault_sweep.py``'s trials: a dry run and a real run of the same
command line must refuse the same things (a leased device under ``--inventory``, unwritable
``--events`` and ``--log-dir`` paths, c10d without torch); a stderr on ``/dev/full`` must not
stop the job or change its status; a program "Text file busy" at its first start is retried
under a restart policy.

    python bench/fault_sweep.py --only runpath
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from sweep_kit import Outcome, Scratch, judge, trial

HOLD_LEASE = """
import sys, time
from xpulaunch.core.plan import LaunchRequest, make_plan
from xpulaunch.launch.plan import load_inventory
from xpulaunch.leases import LeaseManager
inventory = load_inventory(sys.argv[1])
request = LaunchRequest(argv=("x",), gpus="device=0", master_port=29555)
plan_fn = lambda held: make_plan(request, inventory, {}, unavailable=held)
_, lease = LeaseManager().allocate(plan_fn)
print("held", flush=True)
time.sleep(60)
"""


def _same(o: Outcome, s: Scratch, what: str, *args: str, env: dict[str, str] | None = None) -> None:
    """The dry run and the real run of ``args`` end alike: status and error line."""
    dry = s.run("run", "--dry-run", *args, env=env)
    real = s.run("run", *args, env=env)
    for status, _, err in (dry, real):
        judge(o, status, err, good=False, expect=None)
    if (dry[0], dry[2]) != (real[0], real[2]):
        o.fail(
            "wrong",
            f"{what}: dry run {dry[0]} {dry[2].strip()[:90]!r}, real run "
            f"{real[0]} {real[2].strip()[:90]!r}",
        )
    elif real[0] == 0:
        o.fail("wrong", f"{what}: both runs accepted it")


@trial("runpath: dry run and real run on a device a running job leases (--inventory)")
def _leased(s: Scratch, o: Outcome) -> None:
    inventory = s.inventory(2)
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD_LEASE, inventory], env=s.env, stdout=subprocess.PIPE
    )
    s.started.append(holder)
    assert holder.stdout is not None
    if holder.stdout.readline() != b"held\n":
        o.fail("wrong", "the holder did not lease nvidia 0")
        return
    _same(o, s, "--gpus device=0", "--inventory", inventory, "--gpus", "device=0", "true")
    status, out, err = s.run("run", "--dry-run", "--inventory", inventory, "--gpus", "1", "true")
    judge(o, status, err)
    if "nvidia 0 (0000:01:00.0): chosen" in out:
        o.fail("double-booked", "the dry run chose the leased nvidia 0")


@trial("runpath: dry run and real run on paths they cannot write")
def _paths(s: Scratch, o: Outcome) -> None:
    for option, path in (
        ("--events", "/nonexistent/dir/e.jsonl"),
        ("--log-dir", "/proc/x"),
        ("--events", "/proc/x"),
        ("--log-dir", "/etc/hostname/x"),
    ):
        _same(o, s, f"{option} {path}", option, path, "--gpus", "none", "true")
    left = sorted(p.name for p in s.root.iterdir() if p.name not in ("locks", "xpulaunch"))
    if left:
        o.fail("wrong", f"the dry runs left {left}")


@trial("runpath: dry run and real run of c10d without torch")
def _c10d(s: Scratch, o: Outcome) -> None:
    blocker = s.root / "no-torch"
    blocker.mkdir()
    (blocker / "sitecustomize.py").write_text("import sys\nsys.modules['torch'] = None\n")
    env = {"PYTHONPATH": os.pathsep.join([str(blocker), str(s.src)])}
    c10d = ["--rdzv-backend", "c10d", "--rdzv-endpoint", "127.0.0.1:41400", "--rdzv-id", "x"]
    _same(o, s, "c10d", "--gpus", "none", *c10d, "--nnodes", "1:2", "true", env=env)


@trial("runpath: stderr on /dev/full, a good job, a failing job, a usage error")
def _full_stderr(s: Scratch, o: Outcome) -> None:
    ran = s.root / "ran"
    cases = ((["sh", "-c", f"echo RAN > {ran}"], 0), (["sh", "-c", "exit 3"], 3))
    with open("/dev/full", "wb") as full:
        for argv, expect in cases:
            status, _, _ = s.run("run", "--gpus", "none", "--", *argv, stderr=full)
            judge(o, status, "", good=expect == 0, expect=expect)
        status, _, _ = s.run("run", "--gpus", "banana", "true", stderr=full)
        judge(o, status, "", good=False, expect=2)
    if not ran.exists():
        o.fail("good job failed", "the program never ran")


@trial("runpath: a program Text file busy at its first start, --restart on-failure")
def _busy(s: Scratch, o: Outcome) -> None:
    for cgroup in ("", "0"):  # with and without a job cgroup (setpriv starts the workers)
        program = s.root / f"program{cgroup}"
        program.write_text("#!/bin/sh\necho STARTED\n")
        program.chmod(0o755)
        args = ("run", "--restart", "on-failure", "--max-restarts", "2", "--backoff", "0.2")
        with open(program, "a") as writer:
            proc = s.start(*args, str(program), env={"XPULAUNCH_CGROUP": cgroup}, bufsize=0)
            assert proc.stderr is not None
            seen = b""
            while b"busy" not in seen:
                line = proc.stderr.readline()
                if not line:
                    break
                seen += line
            writer.close()
            out, err = proc.communicate(timeout=60)
        judge(o, proc.returncode, seen.decode() + err.decode())
        if b"STARTED" not in out:
            o.fail("good job failed", f"XPULAUNCH_CGROUP={cgroup!r}: the restart never ran it")
    status, _, err = s.run("run", "--restart", "on-failure", str(Path(s.root, "gone")))
    judge(o, status, err, good=False, expect=127)
