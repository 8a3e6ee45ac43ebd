"""A program that passes the pre-check but cannot be executed fails at once, with the
status a shell gives: 126 (found, cannot run), 127 (not found)."""

from __future__ import annotations

from pathlib import Path

import pytest

from fault_cli import Launch, finish


@pytest.mark.parametrize(
    ("content", "status", "why"),
    [
        (b"not a program\0\1\2", 126, "Exec format error"),  # executable bit, no ELF, no #!
        # A missing interpreter is named: the script itself is there.
        (b"#!/nonexistent/interpreter\necho hi\n", 127, "'/nonexistent/interpreter' (the #!"),
        # Windows line endings: the kernel looks for "/bin/sh\r". This one also used to run
        # as a worker exiting 127 (restarted, with setpriv's message) on a host without cgroups.
        (b"#!/bin/sh\r\necho hi\r\n", 127, "'/bin/sh\\r' (the #! line) was not found: the"),
    ],
)
@pytest.mark.parametrize("workers", ["1", "3"])
@pytest.mark.parametrize("cgroup", ["", "0"])
def test_a_program_that_cannot_exec_fails_at_once(
    launch: Launch, tmp_path: Path, content: bytes, status: int, why: str, workers: str, cgroup: str
) -> None:
    program = tmp_path / "program"
    program.write_bytes(content)
    program.chmod(0o755)
    env = {"XPULAUNCH_CGROUP": cgroup}  # "0": no job cgroup, so setpriv may start workers
    proc = launch("run", "--nproc-per-node", workers, "--max-restarts", "2", str(program), env=env)
    code, _, err = finish(proc, timeout_s=30)  # it used to wait for a signal
    assert code == status, err
    assert why in err
    assert err.count("error:") == 1
    assert "Traceback" not in err
