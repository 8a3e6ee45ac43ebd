"""The real subprocess runner and the thread helper: explicit env, bounded time, no leftovers."""

from __future__ import annotations

import contextlib
import json
import os
import sys
import threading
import time
from pathlib import Path

import pytest

from xpulaunch.model import Problem
from xpulaunch.probing.context import parallel
from xpulaunch.probing.runner import RunResult, SubprocessRunner, tool_env


def _script(tmp_path: Path, name: str, body: str) -> Path:
    path = tmp_path / name
    path.write_text(f"#!{sys.executable}\nimport os, sys, time, subprocess\n{body}")
    path.chmod(0o755)
    return path


def test_tool_gets_exactly_the_env_it_is_given(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XPULAUNCH_PARENT_ONLY", "leak")
    tool = _script(tmp_path, "env-tool", "import json; print(json.dumps(sorted(os.environ)))\n")
    result = SubprocessRunner().run([str(tool)], env={"ONLY": "1"}, timeout_s=10)
    assert isinstance(result, RunResult) and result.returncode == 0
    names = json.loads(result.stdout)
    assert "ONLY" in names and "XPULAUNCH_PARENT_ONLY" not in names


def test_nonzero_exit_is_a_result_with_its_first_line(tmp_path: Path) -> None:
    tool = _script(tmp_path, "fails", "print('\\n  No devices were found'); sys.exit(6)\n")
    result = SubprocessRunner().run([str(tool)], env={}, timeout_s=10)
    assert isinstance(result, RunResult)
    assert (result.returncode, result.first_line()) == (6, "No devices were found")


def test_timeout_kills_the_whole_group_even_with_a_grandchild_holding_the_pipe(
    tmp_path: Path,
) -> None:
    pid_file = tmp_path / "grandchild.pid"
    tool = _script(
        tmp_path,
        "hangs",
        f"p = subprocess.Popen(['sleep', '60'])\nopen({str(pid_file)!r}, 'w').write(str(p.pid))\n"
        "time.sleep(60)\n",
    )
    started = time.monotonic()
    result = SubprocessRunner().run([str(tool)], env={"PATH": "/usr/bin:/bin"}, timeout_s=1.0)
    assert time.monotonic() - started < 5
    assert isinstance(result, Problem)
    assert result.message == "timed out after 1 s and was killed"
    grandchild = int(pid_file.read_text())
    for _ in range(50):  # SIGKILL is immediate; reaping by init may lag, so a zombie is dead
        if not _alive(grandchild):
            break
        time.sleep(0.05)
    else:
        pytest.fail(f"grandchild {grandchild} still alive")


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def test_unrunnable_file_is_a_problem(tmp_path: Path) -> None:
    not_exec = tmp_path / "xpu-smi"
    not_exec.write_text("#!/bin/sh\n")
    result = SubprocessRunner().run([str(not_exec)], env={}, timeout_s=5)
    assert isinstance(result, Problem)
    assert result.source == "xpu-smi" and "cannot run" in result.message


def test_which_uses_the_given_path_only(tmp_path: Path) -> None:
    tool = _script(tmp_path, "nvidia-smi", "pass\n")
    runner = SubprocessRunner()
    assert runner.which("nvidia-smi", {"PATH": str(tmp_path)}) == str(tool)
    assert runner.which("nvidia-smi", {"PATH": "/nonexistent"}) is None


def test_tool_env_is_a_new_dict_without_the_dropped_names() -> None:
    parent = {"PATH": "/bin", "ZE_AFFINITY_MASK": "0"}
    child = tool_env(parent, ["ZE_AFFINITY_MASK"])
    assert child == {"PATH": "/bin"} and parent == {"PATH": "/bin", "ZE_AFFINITY_MASK": "0"}


def test_parallel_really_overlaps_and_keeps_order() -> None:
    barrier = threading.Barrier(3, timeout=5)  # only passes if all three run at once

    def call(n: int) -> int:
        barrier.wait()
        return n

    assert parallel([lambda: call(1), lambda: call(2), lambda: call(3)]) == [1, 2, 3]


def test_parallel_reraises_a_bug_instead_of_losing_it() -> None:
    def broken() -> int:
        raise KeyError("bug in a probe")

    with pytest.raises(KeyError, match="bug in a probe"):
        parallel([lambda: 1, broken])


def test_ctrl_c_while_a_tool_runs_kills_its_group(tmp_path: Path) -> None:
    """The tool runs in its own session, so the terminal's Ctrl-C never reaches it: the
    runner must end it, or an interrupted ``xpulaunch llama`` leaves its ``--list-devices``
    (or a wrapper's ``sleep``) running on."""
    import signal
    import subprocess

    from helpers import wait_for
    from process_kit import alive

    pid_file = tmp_path / "tool.pid"
    tool = _script(
        tmp_path,
        "hangs",
        "p = subprocess.Popen(['sleep', '60'])\n"
        f"open({str(pid_file)!r}, 'w').write(f'{{os.getpid()}} {{p.pid}}')\n"
        "time.sleep(60)\n",
    )
    code = (
        # A shell's background job ignores SIGINT; this caller takes it as a terminal's would.
        "import signal; signal.signal(signal.SIGINT, signal.default_int_handler)\n"
        "from xpulaunch.probing.runner import SubprocessRunner\n"
        f"SubprocessRunner().run([{str(tool)!r}], env={{'PATH': '/usr/bin:/bin'}}, timeout_s=60)\n"
    )
    caller = subprocess.Popen([sys.executable, "-c", code], stderr=subprocess.PIPE)
    try:
        wait_for(lambda: pid_file.exists() and pid_file.read_text(), "the tool's pids")
        caller.send_signal(signal.SIGINT)
        _, err = caller.communicate(timeout=10)
        assert b"KeyboardInterrupt" in err
        grandchild = int(pid_file.read_text().split()[1])
        wait_for(lambda: not alive(grandchild), f"grandchild {grandchild} to be killed", 5)
    finally:
        if caller.poll() is None:
            caller.kill()
        if pid_file.exists():  # a failed test leaves nothing behind either
            with contextlib.suppress(ProcessLookupError):
                os.killpg(int(pid_file.read_text().split()[0]), signal.SIGKILL)
