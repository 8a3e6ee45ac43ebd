"""The click options of ``xpulaunch run`` and how they become RunOptions and the plan's
restart limit."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import click
import pytest
from click.testing import CliRunner

from xpulaunch.cli.supervision_options import supervision_options
from xpulaunch.core.restart import RestartMode
from xpulaunch.errors import UsageError
from xpulaunch.launch.options import parse_backoff, parse_ranks, plan_restart_limit
from xpulaunch.launch.run import RunOptions


def parse(*args: str, env: dict[str, str] | None = None) -> RunOptions:
    seen: list[RunOptions] = []

    @click.command()
    @supervision_options
    def run(**kwargs: Any) -> None:
        seen.append(RunOptions.from_cli(kwargs))

    result = CliRunner().invoke(run, list(args), env=env, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return seen[0]


def test_defaults() -> None:
    options = parse()
    assert options.restart is RestartMode.NO
    assert (options.grace_s, options.gang, options.console_ranks, options.color) == (
        10.0, None, None, None,
    )  # fmt: skip
    assert (options.backoff_initial_s, options.backoff_max_s, options.backoff_factor) == (1, 30, 2)


def test_max_restarts_alone_means_on_failure_like_torchrun() -> None:
    options = parse("--max-restarts", "3")
    assert (options.restart, options.max_restarts) == (RestartMode.ON_FAILURE, 3)
    assert parse("--max-restarts", "0").restart is RestartMode.NO
    assert parse("--max-restarts", "-1").max_restarts is None


def test_every_option(tmp_path: Path) -> None:
    options = parse(
        "--restart", "always", "--max-restarts", "5", "--backoff", "0.5:10:3",
        "--stable-window", "120", "--no-gang", "--grace", "2.5", "--log-dir", str(tmp_path),
        "--local-ranks-filter", "0,2", "--no-color",
    )  # fmt: skip
    assert options == RunOptions(
        restart=RestartMode.ALWAYS, max_restarts=5, backoff_initial_s=0.5,
        backoff_factor=3.0, backoff_max_s=10.0, stable_window_s=120.0, grace_s=2.5,
        gang=False, log_dir=str(tmp_path), console_ranks=frozenset({"0", "2"}), color=False,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("kwargs", "limit"),
    [
        ({}, 0),
        ({"max_restarts": 3}, 3),
        ({"max_restarts": -1}, None),
        ({"restart": "always"}, None),  # always means without a limit, as in docker
        ({"restart": "on-failure"}, 3),
        ({"restart": "always", "max_restarts": 2}, 2),
        ({"restart": "no", "max_restarts": 5}, 0),
    ],
)
def test_the_plan_gets_the_restart_limit_of_the_options(
    kwargs: dict[str, Any], limit: int | None
) -> None:
    assert plan_restart_limit(kwargs) == limit
    assert RunOptions.from_cli(kwargs).restart_limit == limit


def test_environment_variables() -> None:
    options = parse(env={"XPULAUNCH_RESTART": "on-failure", "XPULAUNCH_GRACE": "1"})
    assert (options.restart, options.grace_s) == (RestartMode.ON_FAILURE, 1.0)


@pytest.mark.parametrize(
    ("text", "expected"),
    [("0", (0, 30, 2)), ("2", (2, 30, 2)), ("60", (60, 60, 2)), ("1:5", (1, 5, 2))],
)
def test_backoff(text: str, expected: tuple[float, float, float]) -> None:
    assert parse_backoff(text) == expected


@pytest.mark.parametrize("text", ["", "x", "1:2:3:4", "-1", "5:1", "1:5:0.5", "inf", "nan"])
def test_bad_backoff(text: str) -> None:
    with pytest.raises(UsageError, match="--backoff"):
        parse_backoff(text)


def test_ranks() -> None:
    assert parse_ranks(None) is None
    assert parse_ranks(" ") is None
    assert parse_ranks("1, 3") == frozenset({"1", "3"})
    with pytest.raises(UsageError, match="comma-separated"):
        parse_ranks("1,,2")


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"max_restarts": -2}, "--max-restarts -2"),
        ({"grace": -1.0}, "--grace -1"),
        ({"stable_window": float("nan")}, "--stable-window nan"),
    ],
)
def test_bad_values(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(UsageError, match=message):
        RunOptions.from_cli(kwargs)


def test_the_options_module_does_not_load_the_supervisor() -> None:
    import subprocess
    import sys

    code = (
        "import sys, xpulaunch.launch.options; print('xpulaunch.supervisor.engine' in sys.modules)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "False"


def run_marking(tmp_path: Path, *options: str) -> tuple[subprocess.CompletedProcess[str], Path]:
    """``xpulaunch run --gpus none OPTIONS -- python`` that creates a marker file if it runs."""
    xpulaunch = Path(sys.executable).parent / "xpulaunch"
    marker = tmp_path / "ran"
    done = subprocess.run(
        [str(xpulaunch), "run", "--gpus", "none", *options, "--",
         sys.executable, "-c", f"open({str(marker)!r}, 'w')"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    return done, marker


def test_an_unusable_log_dir_is_a_one_line_error_before_anything_starts(tmp_path: Path) -> None:
    done, marker = run_marking(tmp_path, "--log-dir", "/proc/no/such/dir")
    assert done.returncode == 2
    assert done.stderr.startswith("xpulaunch: error: --log-dir /proc/no/such/dir: cannot create")
    assert done.stderr.count("\n") == 1 and not marker.exists()


def test_an_unknown_rank_is_one_line_before_the_summary_and_starts_nothing(
    tmp_path: Path,
) -> None:
    done, marker = run_marking(tmp_path, "--ranks", "0,3")
    assert done.returncode == 2
    assert done.stderr == "xpulaunch: error: --ranks 3: no such worker; the workers are 0\n"
    assert not marker.exists()
