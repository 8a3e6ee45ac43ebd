"""``run --rdzv-backend c10d``'s options for torch's agent, in dry runs: ``--rdzv-conf``
(torch's rendezvous settings), ``--ranks`` and ``--log-dir`` in torchrun's layout."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from helpers import inventory_path
from xpulaunch.cli.main import main

CPU_ONLY = str(inventory_path("cpu-only.json"))
C10D = ["--rdzv-backend", "c10d", "--rdzv-endpoint", "h:29400", "--nnodes", "1:2"]


def agent_options(capsys: pytest.CaptureFixture[str], *args: str) -> list[str]:
    """The agent's options after ``--max-restarts N``, up to the program (``t.py``)."""
    with pytest.raises(SystemExit) as caught:
        main(["--inventory", CPU_ONLY, "--dry-run", "--json", *args, "t.py"])
    assert caught.value.code == 0, capsys.readouterr().err
    (agent,) = json.loads(capsys.readouterr().out)["workers"]
    argv: list[str] = agent["argv"]
    assert argv[1:3] == ["-m", "xpulaunch.integrations.torch_agent"]
    return argv[argv.index("--max-restarts") + 2 : argv.index("t.py")]


def refusal(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    with pytest.raises(SystemExit) as caught:
        main(["--inventory", CPU_ONLY, "--dry-run", *args, "t.py"])
    assert caught.value.code == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1, err
    return err


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        ([], ["--rdzv-conf", "join_timeout=600"]),
        (["--rdzv-conf", "last_call_timeout=1,keep_alive_interval=2"],
         ["--rdzv-conf", "join_timeout=600,last_call_timeout=1,keep_alive_interval=2"]),
        # torchrun's spelling of --join-timeout replaces its default ...
        (["--rdzv-conf", "join_timeout=30,read_timeout=9"],
         ["--rdzv-conf", "join_timeout=30,read_timeout=9"]),
        # ... and may repeat a --join-timeout of the same value
        (["--join-timeout", "30", "--rdzv-conf", "join_timeout=30"],
         ["--rdzv-conf", "join_timeout=30"]),
        (["--join-timeout", "0", "--rdzv-conf", "is_host=1"], ["--rdzv-conf", "is_host=1"]),
        (["--ranks", "0,1"], ["--rdzv-conf", "join_timeout=600", "--local-ranks-filter", "0,1"]),
    ],
)  # fmt: skip
def test_settings_reach_the_agent(
    capsys: pytest.CaptureFixture[str], args: list[str], expected: list[str]
) -> None:
    assert agent_options(capsys, *C10D, *args) == expected


def test_the_rdzv_conf_variable(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XPULAUNCH_RDZV_CONF", "close_timeout=7")
    assert agent_options(capsys, *C10D) == ["--rdzv-conf", "join_timeout=600,close_timeout=7"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ([*C10D, "--rdzv-conf", "last_call=1"], "--rdzv-conf last_call=1: unknown key 'last_call'"),
        ([*C10D, "--rdzv-conf", "read_timeout=0.5"],
         "--rdzv-conf read_timeout=0.5: expected whole seconds"),
        ([*C10D, "--join-timeout", "120", "--rdzv-conf", "join_timeout=30"],
         "--rdzv-conf join_timeout=30 and --join-timeout 120: give one of them"),
        (["--rdzv-conf", "last_call_timeout=1"],
         "--rdzv-conf last_call_timeout=1: only with --rdzv-backend c10d"),
        (["--nnodes", "2", "--rdzv-conf", "last_call_timeout=1"],
         "--rdzv-conf last_call_timeout=1: only with --rdzv-backend c10d"),
        ([*C10D, "--ranks", "agent"], "--ranks agent: with --rdzv-backend c10d, expected local"),
    ],
)  # fmt: skip
def test_mistakes_are_one_line(
    capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    assert refusal(capsys, *args).startswith(f"xpulaunch: error: {message}")


def test_a_join_timeout_variable_clashes_too(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XPULAUNCH_JOIN_TIMEOUT", "120")
    err = refusal(capsys, *C10D, "--rdzv-conf", "join_timeout=30")
    assert "--rdzv-conf join_timeout=30 and --join-timeout 120: give one" in err


def test_our_layout_keeps_the_agents_log_and_torchruns_goes_to_the_agent(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    logs = str(tmp_path / "logs")
    assert "--log-dir" not in agent_options(capsys, *C10D, "--log-dir", logs)
    torchrun = agent_options(capsys, *C10D, "--log-dir", logs, "--log-layout", "torchrun")
    assert torchrun[-6:] == ["--log-dir", logs, "--redirects", "3", "--tee", "3"]


def test_c10d_without_torch_is_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "torch" else real(name, *a)
    )
    with pytest.raises(SystemExit) as caught:
        main(["run", "--gpus", "none", "--rdzv-backend", "c10d", "--nnodes", "1:2",
              "--rdzv-endpoint", "127.0.0.1:1", "true"])  # fmt: skip
    assert caught.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("xpulaunch: error: --rdzv-backend c10d runs torch's elastic agent")
    assert len(err.splitlines()) == 1
