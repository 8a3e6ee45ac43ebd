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
        (b"#!/nonexistent/interpreter\necho hi\n", 127, "no such file"),  # missing interpreter
    ],
)
@pytest.mark.parametrize("workers", ["1", "3"])
def test_a_program_that_cannot_exec_fails_at_once(
    launch: Launch, tmp_path: Path, content: bytes, status: int, why: str, workers: str
) -> None:
    program = tmp_path / "program"
    program.write_bytes(content)
    program.chmod(0o755)
    proc = launch("run", "--nproc-per-node", workers, str(program))
    code, _, err = finish(proc, timeout_s=30)  # it used to wait for a signal
    assert code == status, err
    assert why in err
    assert err.count("error:") == 1
    assert "Traceback" not in err
