"""torchrun's ``--log-dir`` layout: ``<run>/attempt_<n>/<local_rank>/stdout.log``, ``stderr.log``
and ``error.json``, the lines as written; read back by ``xpulaunch logs``."""

from __future__ import annotations

import io
import json
import os
import sys
import textwrap
from pathlib import Path

import pytest

from xpulaunch.errors import UsageError
from xpulaunch.events import Event, Exited
from xpulaunch.joblog.log_reader import LogFollower, open_run
from xpulaunch.joblog.logs import (
    KEEP_ATTEMPTS,
    LogConfig,
    LogLayout,
    LogSink,
    make_run_log_dir,
    rank_folders,
)
from xpulaunch.supervisor.spec import WorkerSpec
from xpulaunch.supervisor.supervisor import RestartPolicy, Supervisor

TORCHRUN = LogLayout.TORCHRUN


def torchrun_sink(run_dir: Path, folders: dict[str, str]) -> tuple[LogSink, io.BytesIO]:
    out = io.BytesIO()
    config = LogConfig(log_dir=run_dir, layout=TORCHRUN, color=False)
    return LogSink(config, list(folders), out=out, err=out, folders=folders), out


def test_each_stream_has_its_file_in_the_local_ranks_folder(tmp_path: Path) -> None:
    logs, console = torchrun_sink(tmp_path, {"2": "0", "3": "1"})  # node 1 of 2, 2 per node
    folder = logs.open_attempt("2", 0)
    logs.open_attempt("3", 0)
    logs.write("2", False, [b"step 1", b"step 2"])
    logs.write("2", True, [b"a warning"])
    logs.write("3", True, [b"Traceback (most recent call last):"])
    logs.close()
    assert folder == tmp_path / "attempt_0" / "0"
    assert logs.log_path("2") == folder
    assert (folder / "stdout.log").read_bytes() == b"step 1\nstep 2\n"  # no time stamps
    assert (folder / "stderr.log").read_bytes() == b"a warning\n"
    assert (tmp_path / "attempt_0" / "1" / "stdout.log").read_bytes() == b""
    assert (tmp_path / "attempt_0" / "1" / "stderr.log").read_bytes().startswith(b"Traceback")
    assert console.getvalue().startswith(b"[2] step 1\n")  # the console keeps our prefix


def test_error_file_sits_beside_the_logs_in_torchruns_layout_only(tmp_path: Path) -> None:
    logs, _ = torchrun_sink(tmp_path / "run", {"3": "1"})
    private = tmp_path / "private"
    assert logs.error_file(private, "3", 2) == tmp_path / "run" / "attempt_2" / "1" / "error.json"
    ours = LogSink(LogConfig(log_dir=tmp_path / "run"), ["3"], out=io.BytesIO())
    assert ours.error_file(tmp_path / "run", "3", 2) == tmp_path / "run/attempt_2/3.error.json"
    no_dir = LogSink(LogConfig(layout=TORCHRUN), ["3"], out=io.BytesIO())
    assert no_dir.error_file(private, "3", 0) == private / "attempt_0" / "3.error.json"


def test_a_crash_loop_keeps_the_first_and_the_last_attempts(tmp_path: Path) -> None:
    logs, _ = torchrun_sink(tmp_path, {"0": "0"})
    for attempt in range(KEEP_ATTEMPTS + 3):
        logs.open_attempt("0", attempt)
        logs.write("0", True, [f"attempt {attempt}".encode()])
    logs.close()
    kept = sorted(int(p.name.split("_")[1]) for p in tmp_path.glob("attempt_*"))
    assert kept == [0, *range(3, KEEP_ATTEMPTS + 3)]
    assert (tmp_path / "attempt_0" / "0" / "stderr.log").read_bytes() == b"attempt 0\n"


def test_the_run_directory_is_named_as_torchrun_names_it(tmp_path: Path) -> None:
    root = str(tmp_path)
    first = make_run_log_dir(root, TORCHRUN, "job7")
    second = make_run_log_dir(root, TORCHRUN, None)
    assert first is not None and second is not None
    assert Path(first).parent == tmp_path and Path(first).name.startswith("job7_")
    assert Path(second).name.startswith("none_") and Path(second).is_dir()
    assert make_run_log_dir(root, LogLayout.XPULAUNCH, "job7") == root
    assert make_run_log_dir(None, TORCHRUN, "job7") is None


def test_an_unwritable_log_dir_is_one_line(tmp_path: Path) -> None:
    missing = str(tmp_path / "gone")
    with pytest.raises(UsageError, match=r"^--log-dir .*gone: cannot create the run's dir"):
        make_run_log_dir(missing, TORCHRUN, "x")


def test_rank_folders_are_local_ranks() -> None:
    assert rank_folders({"2": {"LOCAL_RANK": "0"}, "server": {}}) == {"2": "0", "server": "server"}


def test_logs_reads_the_latest_run_of_a_torchrun_log_dir(tmp_path: Path) -> None:
    for run_id, line in (("old", b"old run"), ("new", b"new run")):
        run_dir = Path(make_run_log_dir(str(tmp_path), TORCHRUN, run_id) or "")
        logs, _ = torchrun_sink(run_dir, {"0": "0", "1": "1"})
        for name in ("0", "1"):
            logs.open_attempt(name, 0)
            logs.write(name, False, [line + b" " + name.encode()])
            logs.write(name, True, [b"err " + name.encode()])
        logs.close()
        stamp = 1_700_000_000 if run_id == "old" else 1_800_000_000
        os.utime(run_dir, (stamp, stamp))
    run = open_run(tmp_path)
    assert (run.layout, run.runs, run.root.name[:4]) == (TORCHRUN, 2, "new_")
    assert open_run(run.root).layout is TORCHRUN
    assert run.workers(0) == ["0", "1"]
    files = [(name, path) for name in run.workers(0) for path in run.files(0, name)]
    follower = LogFollower(files, stamped=run.stamped)
    assert follower.read() == [("0", b"new run 0"), ("0", b"err 0"),
                               ("1", b"new run 1"), ("1", b"err 1")]  # fmt: skip
    assert follower.read() == []


def test_our_layout_is_still_recognised(tmp_path: Path) -> None:
    logs = LogSink(LogConfig(log_dir=tmp_path), ["0"], out=io.BytesIO())
    logs.open_attempt("0", 0)
    logs.close()
    run = open_run(tmp_path)
    assert (run.layout, run.stamped, run.workers(0)) == (LogLayout.XPULAUNCH, True, ["0"])
    with pytest.raises(UsageError, match="no attempt_N directories"):
        open_run(tmp_path / "attempt_0")


WORKER = """
    import json, os, sys
    rank = os.environ["LOCAL_RANK"]
    print("hello from local rank", rank, flush=True)
    print("a warning from", rank, file=sys.stderr, flush=True)
    if rank == "1":  # what torch's @record writes
        failure = {"message": {"message": "ValueError: bad batch", "extraInfo": {
            "py_callstack": 'Traceback (most recent call last):\\n  File "w.py", line 9, in '
                            'main\\n    step()\\nValueError: bad batch\\n', "timestamp": "1"}}}
        with open(os.environ["TORCHELASTIC_ERROR_FILE"], "w") as handle:
            json.dump(failure, handle)
        sys.exit(1)
"""


def test_a_real_run_in_torchruns_layout(tmp_path: Path, record_dir: Path) -> None:
    script = tmp_path / "w.py"
    script.write_text(textwrap.dedent(WORKER))
    run_dir = tmp_path / "logs" / "none_abc"
    workers = [WorkerSpec(str(2 + r), [sys.executable, str(script)], {**os.environ,
               "LOCAL_RANK": str(r)}) for r in (0, 1)]  # fmt: skip
    events: list[Event] = []
    config = LogConfig(log_dir=run_dir, layout=TORCHRUN, console=False)
    policy = RestartPolicy(max_restarts=1, backoff_initial_s=0)  # a gang restart: attempt_1
    with Supervisor(workers, policy, logs=config, on_event=events.append,
                    record_dir=record_dir) as supervisor:  # fmt: skip
        assert supervisor.wait(timeout=60) == 1
    # Beside the attempts: the lock its supervisor held while it ran (for `logs -f`).
    assert sorted(p.name for p in run_dir.iterdir()) == [".running.lock", "attempt_0", "attempt_1"]
    for attempt in (run_dir / "attempt_0", run_dir / "attempt_1"):
        assert sorted(p.name for p in attempt.iterdir()) == ["0", "1"]
        assert (attempt / "0" / "stdout.log").read_text() == "hello from local rank 0\n"
        assert (attempt / "0" / "stderr.log").read_text() == "a warning from 0\n"
        assert not (attempt / "0" / "error.json").exists()
        error = json.loads((attempt / "1" / "error.json").read_text())
        assert error["message"]["message"] == "ValueError: bad batch"
    failed = [e for e in events if isinstance(e, Exited) and e.name == "3"]
    assert len(failed) == 2
    assert [e.root_cause.source if e.root_cause else None for e in failed] == ["error_file"] * 2
