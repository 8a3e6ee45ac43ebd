"""supervise: child environments, failure summary, console filters, program checks."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from process_kit import make_plan
from xpulaunch.core.plan import LaunchRequest, make_plan as plan_request
from xpulaunch.errors import LaunchError, UsageError
from xpulaunch.launch.request import Backoff, RunRequest
from xpulaunch.launch.run import specs_for_plan, supervise
from xpulaunch.model import Inventory
from xpulaunch.supervisor.restart import RestartMode

Argv = Callable[..., list[str]]


def request(**fields: object) -> RunRequest:
    """A request whose supervision fields matter (supervise takes the plan as made)."""
    return RunRequest(program=("job",), **fields)  # type: ignore[arg-type]


def run_plan(plan: object, env: dict[str, str], asked: RunRequest, **kw: object) -> int:
    return supervise(plan, asked, env, **kw)  # type: ignore[arg-type]


@pytest.fixture(autouse=True)
def _private_runtime_dir(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))


def env_lines(out: str) -> dict[str, dict[str, str | None]]:
    found = {}
    for line in out.splitlines():
        prefix, _, rest = line.partition(" ENV ")
        if rest:
            found[prefix.strip("[] ")] = json.loads(rest)
    return found


def test_children_get_plan_env_and_markers(child: Argv, capfd: pytest.CaptureFixture) -> None:
    names = ["RANK", "XPULAUNCH_JOB_ID", "XPULAUNCH_WORKER", "TORCHELASTIC_RESTART_COUNT",
             "TORCHELASTIC_MAX_RESTARTS", "EXTRA"]  # fmt: skip
    plan = make_plan(
        [child("print_env.py", *names)] * 2,
        env={"EXTRA": "x", "TORCHELASTIC_MAX_RESTARTS": "0"},  # as a plan without restarts
    )
    assert run_plan(plan, dict(os.environ), request()) == 0
    seen = env_lines(capfd.readouterr().out)
    assert set(seen) == {"0", "1"}
    for name, env in seen.items():
        assert env["RANK"] == name and env["XPULAUNCH_WORKER"] == name
        assert env["TORCHELASTIC_RESTART_COUNT"] == "0"
        assert env["TORCHELASTIC_MAX_RESTARTS"] == "0"
        assert env["EXTRA"] == "x"
    assert seen["0"]["XPULAUNCH_JOB_ID"] == seen["1"]["XPULAUNCH_JOB_ID"]
    assert len(seen["0"]["XPULAUNCH_JOB_ID"] or "") == 16


def test_a_given_job_id_is_the_workers_marker(child: Argv, capfd: pytest.CaptureFixture) -> None:
    plan = make_plan([child("print_env.py", "XPULAUNCH_JOB_ID")])
    assert run_plan(plan, dict(os.environ), request(), job_id="lease-0a1b") == 0
    assert env_lines(capfd.readouterr().out)["0"] == {"XPULAUNCH_JOB_ID": "lease-0a1b"}


@pytest.mark.parametrize("job_id", ["", "../x", "a b", "id\n", "jöb"])
def test_a_job_id_unsafe_in_a_file_name_is_refused(child: Argv, job_id: str) -> None:
    plan = make_plan([child("print_env.py", "XPULAUNCH_JOB_ID")])
    with pytest.raises(UsageError, match="job id"):
        run_plan(plan, dict(os.environ), request(), job_id=job_id)


def test_parent_env_is_the_base_and_is_not_changed(child: Argv, capfd: pytest.CaptureFixture):
    parent = {"PATH": os.environ["PATH"], "ONLY_IN_PARENT": "p"}
    before = dict(parent)
    plan = make_plan([child("print_env.py", "ONLY_IN_PARENT", "HOME")])
    assert run_plan(plan, parent, request()) == 0
    seen = env_lines(capfd.readouterr().out)["0"]
    assert seen == {"ONLY_IN_PARENT": "p", "HOME": None}
    assert parent == before


def test_failure_summary_names_the_first_failure(
    child: Argv, capfd: pytest.CaptureFixture, tmp_path: Path
) -> None:
    plan = make_plan([child("sleeper.py"), child("exit_with.py", 3)])
    options = request(log_dir=str(tmp_path / "logs"), grace_s=2)
    assert run_plan(plan, dict(os.environ), options) == 3
    err = capfd.readouterr().err
    assert "xpulaunch: worker 1 failed first: it exited with code 3" in err
    assert "xpulaunch: gave up: no restarts were requested" in err
    assert "xpulaunch:   error: going to exit 3" in err
    assert f"full log: {tmp_path / 'logs' / 'attempt_0' / '1.log'}" in err
    assert "worker 0 failed" not in err  # the stopped sleeper is not a failure


def test_failure_summary_names_the_signal(child: Argv, capfd: pytest.CaptureFixture) -> None:
    plan = make_plan([child("exit_with.py", 0, "SIGSEGV")])
    assert run_plan(plan, dict(os.environ), request()) == 139
    assert "worker 0 failed first: it was killed by SIGSEGV (exit status 139)" in (
        capfd.readouterr().err
    )


def test_restart_is_announced_and_counted(
    child: Argv, capfd: pytest.CaptureFixture, tmp_path: Path
) -> None:
    plan = make_plan([child("flaky.py", tmp_path, 2), child("flaky.py", tmp_path, 0)])
    options = request(restart=RestartMode.ON_FAILURE, max_restarts=1, backoff=Backoff(0, 30, 2))
    assert run_plan(plan, dict(os.environ), options) == 0
    captured = capfd.readouterr()
    assert "worker 0 exited with code 2; restarting all workers: restart 1 of 1 in 0 s" in (
        captured.err
    )
    assert "[0] restart count 1" in captured.out
    assert "[1] restart count 1" in captured.out  # gang: the healthy worker restarted too


def test_console_ranks_filter(child: Argv, capfd: pytest.CaptureFixture, tmp_path: Path) -> None:
    plan = make_plan([child("exit_with.py", 0)] * 3)
    options = request(ranks=frozenset({"1"}), log_dir=str(tmp_path))
    assert run_plan(plan, dict(os.environ), options) == 0
    out = capfd.readouterr().out
    assert out == "[1] out line from 1\n"
    assert "out line from 2" in (tmp_path / "attempt_0" / "2.log").read_text()


def test_unknown_console_rank_is_a_usage_error(child: Argv) -> None:
    plan = make_plan([child("exit_with.py", 0)])
    with pytest.raises(UsageError, match="--ranks 7: no such worker; the workers are 0"):
        run_plan(plan, dict(os.environ), request(ranks=frozenset({"7"})))


def test_isolate_means_independent_restarts(child: Argv) -> None:
    isolated = make_plan([child("exit_with.py", 0)], isolate=True)
    assert request().policy(isolated.isolate).gang is False
    assert request().policy(False).gang is True
    assert request(gang=True).policy(isolated.isolate).gang is True


def test_unlimited_restarts_reach_the_child_as_minus_one(child: Argv) -> None:
    options = request(restart=RestartMode.ALWAYS)
    launch = LaunchRequest(tuple(child("exit_with.py", 0)), max_restarts=options.restart_limit)
    plan = plan_request(launch, Inventory(), {})
    (spec,) = specs_for_plan(plan, {"PATH": os.defpath})
    assert spec.env["TORCHELASTIC_MAX_RESTARTS"] == "-1"


@pytest.mark.parametrize(
    ("options", "limit"),
    [
        (request(), 0),  # restart policy "no"
        (request(restart=RestartMode.ON_FAILURE, max_restarts=2), 2),
        (request(restart=RestartMode.ALWAYS), None),
        (request(restart=RestartMode.NO), 0),
    ],
)
def test_the_restart_limit_the_plan_holds(options: RunRequest, limit: int | None) -> None:
    assert options.restart_limit == limit


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["/nonexistent/prog"], "/nonexistent/prog: no such file"),
        (["no-such-program-xyz"], "no-such-program-xyz: command not found on PATH"),
        ([sys.executable, "missing_train.py"], "missing_train.py: no such script"),
        ([__file__], "not executable"),
    ],
)
def test_programs_are_checked_before_anything_starts(argv: list[str], message: str) -> None:
    with pytest.raises(LaunchError, match=message):
        run_plan(make_plan([argv]), dict(os.environ), request())


def test_a_plans_program_is_looked_up_on_the_child_path_and_from_its_cwd(
    tmp_path: Path,
) -> None:
    tool = tmp_path / "mytool"
    tool.write_text("#!/bin/sh\n")
    tool.chmod(0o755)
    (spec,) = specs_for_plan(make_plan([["mytool"]]), {"PATH": str(tmp_path)})
    assert spec.argv == (str(tool),)
    with pytest.raises(LaunchError, match="mytool: command not found on PATH"):
        specs_for_plan(make_plan([["mytool"]]), {"PATH": "/nonexistent"})
    (tmp_path / "train.py").write_text("")
    (spec,) = specs_for_plan(make_plan([[sys.executable, "train.py"]]), {}, cwd=str(tmp_path))
    assert spec.argv == (sys.executable, "train.py") and spec.cwd == str(tmp_path)


def test_long_lines_of_two_fast_writers_are_never_cut(
    child: Argv, capfd: pytest.CaptureFixture
) -> None:
    # Each worker writes 300 lines of 5,000 bytes in 1,000-byte writes, as fast as it can.
    plan = make_plan([child("flood.py", 300, 5000)] * 2)
    assert run_plan(plan, dict(os.environ), request(color=False)) == 0
    lines = capfd.readouterr().out.splitlines()
    assert len(lines) == 600
    seen: dict[str, list[int]] = {"0": [], "1": []}
    for line in lines:
        prefix, body = line[:4], line[4:]
        name = prefix[1]
        assert prefix == f"[{name}] "
        head, number, _ = body.split(":", 2)
        assert head == name
        assert body == (f"{name}:{number}:" + name * 5000)[:5000]
        seen[name].append(int(number))
    assert seen == {"0": list(range(300)), "1": list(range(300))}


def test_the_launch_path_imports_nothing_heavy() -> None:
    # The supervisor must stay small (RSS goal) and never touch a GPU runtime itself.
    code = (
        "import sys, xpulaunch.launch.run\n"
        "heavy = {'torch', 'pynvml', 'numpy'}\n"
        "print(sorted(heavy & set(sys.modules)))\n"
    )
    import subprocess

    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"
