"""A worker with XPULAUNCH_CPUS in its environment starts bound to those CPUs, before its
program runs, and its children inherit the binding (real processes on this machine)."""

from __future__ import annotations

import json
import os
import sys

import pytest

from xpulaunch.core.cpu_bind import format_cpulist, parse_cpulist
from xpulaunch.processes.spawn import spawn

# Reports its own affinity as its first act, /proc's view of it, and a grandchild's.
REPORT = """
import json, os, subprocess, sys
status = dict(l.split(":\\t", 1) for l in open("/proc/self/status").read().splitlines()
              if ":\\t" in l)
child = subprocess.run([sys.executable, "-c", "import os; print(sorted(os.sched_getaffinity(0)))"],
                       capture_output=True, text=True, check=True).stdout
print(json.dumps({"mine": sorted(os.sched_getaffinity(0)), "proc": status["Cpus_allowed_list"],
                  "grandchild": json.loads(child)}))
"""


def run_report(env: dict[str, str], *, death_signal: int | None = 9) -> dict[str, object]:
    proc = spawn([sys.executable, "-c", REPORT], env, death_signal=death_signal)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    return dict(json.loads(out))


@pytest.mark.parametrize("death_signal", [9, None])
def test_the_program_and_its_children_run_on_the_cpus_named(death_signal: int | None) -> None:
    one = min(os.sched_getaffinity(0))
    env = {**os.environ, "XPULAUNCH_CPUS": str(one)}
    seen = run_report(env, death_signal=death_signal)
    assert seen == {"mine": [one], "proc": str(one), "grandchild": [one]}


def test_without_the_variable_the_child_keeps_the_parents_cpus() -> None:
    env = {k: v for k, v in os.environ.items() if k != "XPULAUNCH_CPUS"}
    seen = run_report(env)
    assert seen["mine"] == sorted(os.sched_getaffinity(0))
    assert seen["proc"] == format_cpulist(os.sched_getaffinity(0))


def test_a_value_that_is_not_a_cpu_list_is_an_oserror() -> None:
    with pytest.raises(OSError, match="XPULAUNCH_CPUS='zero'"):
        spawn([sys.executable, "-c", "pass"], {"XPULAUNCH_CPUS": "zero"})


def test_cpus_this_machine_lacks_fail_the_worker_with_a_line_not_the_supervisor() -> None:
    missing = max(parse_cpulist("0-4095") - os.sched_getaffinity(0))
    proc = spawn([sys.executable, "-c", "pass"], {"XPULAUNCH_CPUS": str(missing)})
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 126
    assert b"xpulaunch: cannot bind to CPUs" in err
