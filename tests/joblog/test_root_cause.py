"""Root causes: torch's @record error file, the stderr traceback, summary.json."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from run_kit import xpulaunch
from xpulaunch.root_cause import from_error_file, from_stderr

TORCH_FILE = {
    "message": {
        "message": "ValueError: bad value",
        "extraInfo": {
            "py_callstack": 'Traceback (most recent call last):\n  File "/x/train.py", line 9, '
            'in main\n    step()\n  File "/x/train.py", line 3, in step\n    raise '
            'ValueError("bad value")\nValueError: bad value\n',
            "timestamp": "1700000000",
        },
    }
}


def test_the_torch_error_file_format_is_read() -> None:
    cause = from_error_file(json.dumps(TORCH_FILE))
    assert cause is not None
    assert (cause.type, cause.message, cause.source) == ("ValueError", "bad value", "error_file")
    assert cause.frames == (
        'File "/x/train.py", line 9, in main: step()',
        'File "/x/train.py", line 3, in step: raise ValueError("bad value")',
    )


def test_a_plain_string_message_and_garbage() -> None:
    cause = from_error_file('{"message": "RuntimeError: NCCL timeout"}')
    assert cause is not None and cause.headline() == "RuntimeError: NCCL timeout"
    assert from_error_file("not json") is None
    assert from_error_file('{"message": {"message": ""}}') is None
    assert from_error_file("[1, 2]") is None


def test_the_last_traceback_on_stderr() -> None:
    tail = [
        "warming up",
        "Traceback (most recent call last):",
        '  File "a.py", line 1, in <module>',
        "    f()",
        "ZeroDivisionError: old one",
        "Traceback (most recent call last):",
        '  File "b.py", line 2, in <module>',
        "    g()",
        "torch.distributed.DistBackendError: NCCL error: unhandled system error",
    ]
    cause = from_stderr(tail)
    assert cause is not None
    assert cause.type == "torch.distributed.DistBackendError"
    assert cause.message == "NCCL error: unhandled system error"
    assert cause.frames == ('File "b.py", line 2, in <module>: g()',)
    assert from_stderr(["just a line", "Error without a traceback"]) is None


def test_a_record_script_raising_shows_the_exception(
    script: Callable[[str], str], tmp_path: Path
) -> None:
    logs = tmp_path / "logs"
    done = xpulaunch("--log-dir", str(logs), script("record_fails.py"))
    assert done.returncode == 1, done.stderr
    assert "worker 0 failed first: it raised ValueError: bad learning rate -1" in done.stderr
    assert "in check: raise ValueError(" in done.stderr  # the frame it was raised in
    summary = json.loads((logs / "summary.json").read_text())
    assert summary["schema"] == "xpulaunch.run/1"
    assert summary["exit_code"] == 1 and summary["restarts"] == {"0": 0}
    cause = summary["root_cause"]
    assert (cause["worker"], cause["attempt"], cause["source"]) == ("0", 0, "error_file")
    assert (cause["type"], cause["message"]) == ("ValueError", "bad learning rate -1")
    (attempt,) = summary["attempts"]
    run = attempt["workers"]["0"]
    assert run["exit_code"] == 1 and run["signal"] is None and run["duration_s"] > 0
    assert run["root_cause"]["type"] == "ValueError"
    written = json.loads((logs / "attempt_0" / "0.error.json").read_text())
    assert written["message"]["message"] == "ValueError: bad learning rate -1"


def test_without_record_the_stderr_traceback_is_the_root_cause(
    script: Callable[[str], str], tmp_path: Path
) -> None:
    logs = tmp_path / "logs"
    done = xpulaunch("--log-dir", str(logs), script("plain_fails.py"))
    assert done.returncode == 1
    assert "it raised KeyError: 'missing-shard'" in done.stderr
    cause = json.loads((logs / "summary.json").read_text())["root_cause"]
    assert (cause["type"], cause["source"]) == ("KeyError", "stderr")


def test_a_run_that_succeeds_has_no_root_cause(
    script: Callable[[str], str], tmp_path: Path
) -> None:
    logs = tmp_path / "logs"
    done = xpulaunch("--log-dir", str(logs), "--max-restarts", "1", "--backoff", "0",
                     script("crash_once.py"))  # fmt: skip
    assert done.returncode == 0, done.stderr
    summary = json.loads((logs / "summary.json").read_text())
    assert summary["root_cause"] is None and summary["restarts"] == {"0": 1}
    first, second = summary["attempts"]
    assert first["workers"]["0"]["root_cause"]["type"] == "RuntimeError"
    assert second["workers"]["0"]["exit_code"] == 0
