"""The c10d agent started before the plan (xpulaunch.proc.prestart): which command lines start
it, and the child itself, forked for real by tests/proc/prestart/driver.py with a stand-in for
torch's agent module. The whole path through the CLI, with torch's agent, is in
tests/multinode/test_prestart_cli.py."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import wait_for
from xpulaunch.core import elastic
from xpulaunch.proc import prestart
from xpulaunch.proc.processes import process_info

DRIVER = Path(__file__).parent / "prestart" / "driver.py"
C10D = ["--nnodes", "2", "--rdzv-backend", "c10d", "--rdzv-endpoint", "h:1", "train.py"]


@pytest.mark.parametrize(
    ("args", "environ", "expected"),
    [
        (C10D, {}, True),
        (["train.py", "--rdzv-backend=c10d", "--rdzv-endpoint", "h:1"], {}, True),
        (["run", "--rdzv_backend", "c10d", "train.py"], {}, True),
        (["train.py", "--nnodes", "2", "--rdzv-backend", "static"], {}, False),
        (["train.py", "--", "--rdzv-backend", "c10d"], {}, False),  # the script's own words
        ([*C10D[:-1], "--dry-run", "train.py"], {}, False),
        ([*C10D, "--help"], {}, False),
        (C10D, {"XPULAUNCH_PRESTART": "0"}, False),
        (["torchrun", "--nnodes=2", "--rdzv-backend=c10d", "train.py"], {}, True),
        (["torchrun", "--nnodes=1:1", "--rdzv-backend=c10d", "train.py"], {}, False),
        (["torchrun", "--rdzv-backend", "c10d", "train.py"], {}, False),  # one node: no agent
        (["torchrun", "--standalone", "--nnodes", "2", "--rdzv-backend=c10d", "t.py"], {}, False),
        (["devices"], {}, False),
        ([], {}, False),
    ],
)
def test_which_command_lines_start_the_agent_early(
    args: list[str], environ: dict[str, str], expected: bool
) -> None:
    assert prestart.wanted(args, environ) is expected


def test_the_agent_module_is_the_one_the_plan_runs() -> None:
    assert prestart.AGENT_MODULE == elastic.AGENT_MODULE


@pytest.mark.parametrize(
    ("names", "expected"),
    [
        ({"CUDA_VISIBLE_DEVICES", "ZE_AFFINITY_MASK", "OMP_NUM_THREADS"}, True),
        ({"XPULAUNCH_JOB_ID", "TORCHELASTIC_ERROR_FILE", elastic.DISABLE_SHARED_STORE}, True),
        (set(), True),
        ({"CUDA_VISIBLE_DEVICES", "LOGLEVEL"}, False),  # torch's loggers read it at import
        ({"PYTHONPATH"}, False),
    ],
)
def test_only_variables_read_at_run_time_may_differ(names: set[str], expected: bool) -> None:
    assert prestart._read_at_run_time(names) is expected


def _drive(mode: str, tmp_path: Path) -> dict[str, object]:
    done = subprocess.run(
        [sys.executable, str(DRIVER), mode, str(tmp_path)], capture_output=True, text=True,
        timeout=60, env={**os.environ, "KEPT": "from the command line"}, check=True,
    )  # fmt: skip
    report: dict[str, object] = json.loads(done.stdout.splitlines()[-1])
    return report


def test_the_adopted_child_runs_the_module_as_told(tmp_path: Path) -> None:
    run = _drive("adopt", tmp_path)
    assert run["status"] == 3
    assert run["err"] == "a line on stderr\n"
    agent = json.loads(str(run["out"]))
    assert agent["name"] == "__main__"
    assert agent["args"] == ["--nnodes", "2"]
    assert agent["cwd"] == str(tmp_path)
    assert agent["env"] == {
        "XPULAUNCH_JOB_ID": "job-1", "CUDA_VISIBLE_DEVICES": "", "KEPT": "from the command line"
    }  # fmt: skip
    assert agent["big"] == 300_000  # the whole order came through
    assert agent["session_leader"] is True
    assert agent["pdeathsig"] == signal.SIGKILL
    assert agent["stdin"] == os.devnull
    assert str(tmp_path / "lease") in agent["open"]  # the lease's descriptor came along


@pytest.mark.parametrize("mode", ["changed", "other_module"])
def test_a_child_that_does_not_fit_is_ended_not_adopted(mode: str, tmp_path: Path) -> None:
    assert _drive(mode, tmp_path) == {"adopted": False, "gone": True}


def test_a_discarded_child_is_gone_and_never_adopted_later(tmp_path: Path) -> None:
    assert _drive("discard", tmp_path) == {"gone": True, "adopt_after": False}


def test_the_child_dies_with_a_killed_parent(tmp_path: Path) -> None:
    driver = subprocess.Popen(
        [sys.executable, str(DRIVER), "orphan", str(tmp_path)], stdout=subprocess.PIPE, text=True
    )
    assert driver.stdout is not None
    pid = json.loads(driver.stdout.readline())["pid"]
    os.kill(pid, 0)  # waiting for its order
    driver.kill()
    driver.communicate(timeout=30)
    wait_for(lambda: _gone(pid), "the child gone with its parent", 20)


def _gone(pid: int) -> bool:
    info = process_info(pid)  # a zombie left to a PID 1 that does not reap counts as gone
    return info is None or info.gone
