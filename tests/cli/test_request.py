"""The options of ``xpulaunch run`` as the request they build: click converts and checks each
value (the same checks for a dry run and a real run), ``to_request`` turns them into one
:class:`~xpulaunch.launch.request.RunRequest`."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from helpers import run_refused as refused, run_request as parse
from xpulaunch.launch.request import Backoff, RunRequest
from xpulaunch.supervisor.restart import RestartMode


def test_defaults() -> None:
    request = parse()
    assert request.restart_mode is RestartMode.NO and request.restart_limit == 0
    assert (request.grace_s, request.gang, request.ranks, request.color) == (10.0, None, None, None)
    assert request.backoff == Backoff(1, 30, 2)
    assert (request.gpus, request.nproc_per_node, request.program) == ("auto", 1, ("prog",))


def test_max_restarts_alone_means_on_failure_like_torchrun() -> None:
    request = parse("--max-restarts", "3")
    assert (request.restart_mode, request.restart_count) == (RestartMode.ON_FAILURE, 3)
    assert parse("--max-restarts", "0").restart_mode is RestartMode.NO
    assert parse("--max-restarts", "-1").restart_count is None


def test_every_option(tmp_path: Path) -> None:
    request = parse(
        "--restart", "always", "--max-restarts", "5", "--backoff", "0.5:10:3",
        "--stable-window", "120", "--no-gang", "--grace", "2.5", "--log-dir", str(tmp_path),
        "--local-ranks-filter", "0,2", "--no-color", "--nproc-per-node", "auto",
        "--min-free-memory", "1EiB", "--max-utilization", "10", "--hang-timeout", "5",
        "--heartbeat", "--metrics-interval", "0.5", "--wait-timeout", "3",
    )  # fmt: skip
    assert (request.restart, request.max_restarts) == (RestartMode.ALWAYS, 5)
    assert request.backoff == Backoff(0.5, 10.0, 3.0)
    assert (request.stable_window_s, request.grace_s, request.gang) == (120.0, 2.5, False)
    assert (request.log_dir, request.ranks, request.color) == (
        str(tmp_path), frozenset({"0", "2"}), False,
    )  # fmt: skip
    assert request.nproc_per_node is None and request.min_free_memory_bytes == 2**60
    assert (request.max_utilization_percent, request.hang_timeout_s) == (10.0, 5.0)
    assert request.heartbeat and request.metrics_interval_s == 0.5
    assert request.wait and request.wait_timeout_s == 3.0


@pytest.mark.parametrize(
    ("args", "limit"),
    [
        ([], 0),
        (["--max-restarts", "3"], 3),
        (["--max-restarts", "-1"], None),
        (["--restart", "always"], None),  # always means without a limit, as in docker
        (["--restart", "on-failure"], 3),
        (["--restart", "always", "--max-restarts", "2"], 2),
        (["--restart", "no", "--max-restarts", "5"], 0),
    ],
)
def test_the_plan_gets_the_restart_limit_of_the_options(args: list[str], limit: int | None):
    assert parse(*args).restart_limit == limit


def test_environment_variables() -> None:
    request = parse(env={"XPULAUNCH_RESTART": "on-failure", "XPULAUNCH_GRACE": "1"})
    assert (request.restart_mode, request.grace_s) == (RestartMode.ON_FAILURE, 1.0)


@pytest.mark.parametrize(
    ("text", "expected"),
    [("0", (0, 30, 2)), ("2", (2, 30, 2)), ("60", (60, 60, 2)), ("1:5", (1, 5, 2))],
)
def test_backoff(text: str, expected: tuple[float, float, float]) -> None:
    assert parse("--backoff", text).backoff == Backoff(*expected)


@pytest.mark.parametrize("text", ["", "x", "1:2:3:4", "-1", "5:1", "1:5:0.5", "inf", "nan"])
def test_bad_backoff(text: str) -> None:
    assert "--backoff" in refused("--backoff", text)


def test_ranks() -> None:
    assert parse("--ranks", " ").ranks is None
    assert parse("--ranks", "1, 3").ranks == frozenset({"1", "3"})
    assert "comma-separated" in refused("--ranks", "1,,2")


@pytest.mark.parametrize(
    ("args", "option"),
    [
        (["--max-restarts", "-2"], "--max-restarts"),
        (["--max-restarts", "2.5"], "--max-restarts"),
        (["--grace", "-1"], "--grace"),
        (["--stable-window", "nan"], "--stable-window"),
        (["--hang-timeout", "0"], "--hang-timeout"),
        (["--metrics-interval", "0.001"], "--metrics-interval"),
        (["--nproc-per-node", "0"], "--nproc-per-node"),
        (["--min-free-memory", "lots"], "--min-free-memory"),
        (["--max-utilization", "101"], "--max-utilization"),
        (["--master-port", "99999"], "--master-port"),
    ],
)
def test_bad_values(args: list[str], option: str) -> None:
    assert option in refused(*args)


def test_a_lone_heartbeat_is_refused_by_the_request() -> None:
    from xpulaunch.errors import UsageError

    with pytest.raises(UsageError, match="--heartbeat needs --hang-timeout"):
        RunRequest(program=("x",), heartbeat=True)


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
