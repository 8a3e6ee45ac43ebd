"""A descendant that leaves its session and clears its environment (sudo, ssh, a daemon)
cannot escape a job that has a cgroup of its own; without one it can (what the README says)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import psutil
import pytest

from fault_cli import Launch, finish
from helpers import kill_all, wait_for
from xpulaunch.processes.cgroup import JobCgroup

# The worker double-forks a child that calls setsid and execs with an empty environment, so
# neither its session nor the XPULAUNCH_JOB_ID marker leads to it; then the worker exits 0.
ESCAPE = """
import os, sys, time
pidfile = sys.argv[1]
child = os.fork()
if child == 0:
    os.setsid()
    if os.fork() == 0:
        code = "import os, sys, time\\nopen(sys.argv[1], 'w').write(str(os.getpid()))\\n"
        code += "time.sleep(600)"
        os.execve(sys.executable, [sys.executable, "-S", "-c", code, pidfile], {})
    os._exit(0)
os.waitpid(child, 0)
while not os.path.exists(pidfile) or not open(pidfile).read():
    time.sleep(0.01)
"""


def cgroups_available() -> bool:
    """Can this process make a child cgroup v2 here (as xpulaunch would)?"""
    cgroup, _ = JobCgroup.create(f"probe-{os.getpid()}")
    if cgroup is None:
        return False
    return cgroup.remove()


def run_escapee(launch: Launch, tmp_path: Path, env: dict[str, str]) -> int:
    script, pidfile = tmp_path / "escape.py", tmp_path / "escapee.pid"
    script.write_text(ESCAPE)
    code, _, err = finish(launch("run", sys.executable, str(script), str(pidfile), env=env))
    assert code == 0, err
    return int(pidfile.read_text())


def gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_an_escaped_descendant_is_killed_with_a_job_cgroup(launch: Launch, tmp_path: Path) -> None:
    if not cgroups_available():
        # Where the host gives no cgroup, requiring one is a one-line error, not a silent
        # downgrade.
        code, _, err = finish(launch("run", "true", env={"XPULAUNCH_CGROUP": "1"}))
        assert code != 0 and "cgroup" in err and "Traceback" not in err
        return
    before = job_cgroups()
    pid = run_escapee(launch, tmp_path, {})
    wait_for(lambda: gone(pid), "the escaped descendant to be killed", timeout_s=10)
    assert job_cgroups() <= before  # the job's cgroup is removed at the end


def job_cgroups() -> set[str]:
    return {d.name for d in Path(_own_cgroup()).iterdir() if d.name.startswith("xpulaunch-")}


def test_without_a_cgroup_an_escaped_descendant_survives(launch: Launch, tmp_path: Path) -> None:
    """The limit the README states: sessions and markers cannot find such a process."""
    pid = run_escapee(launch, tmp_path, {"XPULAUNCH_CGROUP": "0"})
    try:
        assert not gone(pid)
    finally:
        kill_all([psutil.Process(pid)])


def _own_cgroup() -> str:
    from xpulaunch.processes.cgroup import own_cgroup_dir

    with open("/proc/self/mountinfo") as mounts, open("/proc/self/cgroup") as own:
        path = own_cgroup_dir(mounts.read(), own.read())
    if path is None:
        pytest.fail("cgroups were available a moment ago")
    return path


# A worker that makes a cgroup of its own below its leaf and moves into it (as a container
# runtime or a program limiting its children does), saying where its leaf was.
NEST = """
import os, time
root = [l.split()[1] for l in open("/proc/mounts") if l.split()[2] == "cgroup2"][0]
leaf = root + [l[3:].strip() for l in open("/proc/self/cgroup") if l.startswith("0::")][0]
print(leaf, flush=True)
os.mkdir(os.path.join(leaf, "sub"))
with open(os.path.join(leaf, "sub", "cgroup.procs"), "w") as procs:
    procs.write("0")
time.sleep(0.3)
"""


def test_a_worker_with_a_nested_cgroup_leaves_no_cgroup_and_no_delay(launch: Launch) -> None:
    import time

    if not cgroups_available():
        pytest.skip("this host gives the job no cgroup of its own")
    started = time.monotonic()
    code, out, err = finish(launch("run", sys.executable, "-c", NEST))
    elapsed_s = time.monotonic() - started
    assert code == 0, err
    leaf = out.split("] ", 1)[1].strip()
    job = os.path.dirname(leaf)
    assert os.path.basename(job).startswith("xpulaunch-"), leaf
    assert not os.path.exists(job)  # it used to be left behind, with w-0/sub in it
    assert elapsed_s < 1.9  # and removing it used to wait 2 s for an EBUSY that stays
