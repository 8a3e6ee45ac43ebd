"""The variables a worker gets when it starts, beyond its spec's environment."""

from __future__ import annotations

from xpulaunch.model import SET_AT_START
from xpulaunch.supervisor.spec import start_env


def test_start_env_adds_exactly_the_set_at_start_variables() -> None:
    base = {"PATH": "/bin", "TORCHELASTIC_RESTART_COUNT": "stale"}
    env = start_env(
        base, job_id="job-1", worker="w0", attempt=3, error_file="/run/e.json",
        heartbeat_file="/run/w0.heartbeat",
    )  # fmt: skip
    assert set(env) - set(base) == set(SET_AT_START) - set(base)
    assert env["XPULAUNCH_JOB_ID"] == "job-1"
    assert env["XPULAUNCH_WORKER"] == "w0"
    assert env["TORCHELASTIC_RESTART_COUNT"] == "3"  # the attempt number, as torchrun sets it
    assert env["TORCHELASTIC_ERROR_FILE"] == "/run/e.json"
    assert env["XPULAUNCH_HEARTBEAT_FILE"] == "/run/w0.heartbeat"
    assert base["TORCHELASTIC_RESTART_COUNT"] == "stale"  # the caller's dict is not changed
