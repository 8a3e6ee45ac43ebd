"""``xpulaunch torchrun``: torchrun's command line (and its ``PET_*`` variables) translated into
``run``'s, every option by both spellings, unsupported ones refused by name (or by variable);
and the warning of plain ``run``."""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path

import pytest

from helpers import inventory_path
from xpulaunch.cli.main import main
from xpulaunch.cli.program import option_arity
from xpulaunch.cli.run import run
from xpulaunch.cli.torchrun_args import (
    FLAGS,
    NO_VARIABLE,
    REFUSED,
    VALUED,
    canonical,
    translate,
    variable,
)
from xpulaunch.errors import UsageError

PY = "/usr/bin/python3"
OURS = option_arity(run)
CPU_ONLY = str(inventory_path("cpu-only.json"))


def full(*args: str, env: dict[str, str] | None = None) -> list[str]:
    return translate(list(args), OURS, PY, env or {}, new_run_id=lambda: "UUID")


def t(*args: str, env: dict[str, str] | None = None) -> list[str]:
    """The translation without the log layout's arguments (tested on their own below)."""
    run_args = full(*args, env=env)
    if "--log-layout" in run_args[: run_args.index("--")]:
        at = run_args.index("--log-layout")
        assert run_args[at : at + 3] == ["--log-layout", "torchrun", "--log-run-id"]
        del run_args[at : at + 4]
    return run_args


@pytest.mark.parametrize("option", sorted(FLAGS | VALUED))
def test_both_spellings_are_known(option: str) -> None:
    assert canonical(option) == option
    assert canonical(option.replace("-", "_").replace("__", "--", 1)) == option


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--standalone", "--nproc_per_node=2", "train.py", "--lr", "1"],
         ["--nproc-per-node", "2", "--", "train.py", "--lr", "1"]),
        (["--nnodes=2", "--node_rank", "1", "--master_addr", "h0", "--master_port=29501", "t.py"],
         ["--nnodes", "2", "--node-rank", "1", "--master-addr", "h0", "--master-port", "29501",
          "--", "t.py"]),
        (["--nproc-per-node", "gpu", "t.py"],
         ["--backend", "cuda", "--nproc-per-node", "auto", "--", "t.py"]),
        (["--nproc-per-node", "xpu", "t.py"],
         ["--backend", "xpu", "--nproc-per-node", "auto", "--", "t.py"]),
        (["--nproc-per-node", "cpu", "t.py"],
         ["--gpus", "none", "--nproc-per-node", str(os.cpu_count()), "--", "t.py"]),
        (["-m", "pkg.train", "--x"], ["--", PY, "-m", "pkg.train", "--x"]),
        (["--run-path", "script"], ["--", PY, "script"]),
        (["--max_restarts", "3", "--monitor_interval", "5", "--rdzv_id", "j", "--tee", "3",
          "-r", "3", "--start_method", "fork", "--role", "default", "t.py"],
         ["--max-restarts", "3", "--", "t.py"]),
        (["--log_dir", "L", "--local_ranks_filter", "0", "--shutdown-timeout", "5", "t.py"],
         ["--log-dir", "L", "--ranks", "0", "--grace", "5", "--", "t.py"]),
        (["--rdzv-backend", "c10d", "--rdzv-endpoint", "localhost:0", "t.py"], ["--", "t.py"]),
        (["--rdzv-conf", "join_timeout=30", "t.py"], ["--join-timeout", "30", "--", "t.py"]),
        # torch's other c10d settings: for the agent of a multi-node c10d job ...
        (["--nnodes=1:2", "--rdzv-backend=c10d", "--rdzv-endpoint=h:1",
          "--rdzv-conf", "join_timeout=30, last_call_timeout=1,is_host=0", "t.py"],
         ["--nnodes", "1:2", "--rdzv-backend", "c10d", "--rdzv-endpoint", "h:1",
          "--join-timeout", "30", "--rdzv-conf", "last_call_timeout=1,is_host=0", "--", "t.py"]),
        # ... and changing nothing where no c10d rendezvous runs, as in torchrun
        (["--rdzv-conf", "read_timeout=5", "t.py"], ["--", "t.py"]),
        (["--standalone", "--rdzv-conf", "last_call_timeout=1", "t.py"], ["--", "t.py"]),
        (["--nnodes=1:2", "--rdzv_backend=c10d", "--rdzv_endpoint=h:29400", "--rdzv_id=7", "t.py"],
         ["--nnodes", "1:2", "--rdzv-backend", "c10d", "--rdzv-endpoint", "h:29400",
          "--rdzv-id", "7", "--", "t.py"]),
        (["--gpus", "2", "--isolate", "--dry-run", "t.py"],
         ["--gpus", "2", "--isolate", "--dry-run", "--", "t.py"]),
        (["t.py", "--nproc_per_node", "2"], ["--", "t.py", "--nproc_per_node", "2"]),
    ],
)  # fmt: skip
def test_translation(args: list[str], expected: list[str]) -> None:
    assert t(*args) == expected


@pytest.mark.parametrize("option", sorted(REFUSED))
def test_each_unsupported_option_is_refused_by_name(option: str) -> None:
    with pytest.raises(UsageError) as caught:
        t(option.replace("-", "_").replace("__", "--", 1), "x", "t.py")
    assert str(caught.value).startswith(f"{option}: not supported")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--nnodes", "2", "--rdzv-backend", "etcd", "t.py"], "--rdzv-backend etcd"),
        (["--role", "trainer", "t.py"], "--role trainer"),
        (["--signals-to-handle", "SIGTERM,SIGUSR1", "t.py"], "--signals-to-handle SIGUSR1"),
        (["--rdzv-conf", "read_timout=5", "t.py"], "--rdzv-conf read_timout=5: unknown key"),
        (
            [
                "--nnodes",
                "2",
                "--rdzv-backend",
                "c10d",
                "--rdzv-endpoint",
                "h:1",
                "--rdzv-conf",
                "last_call_timeout=soon",
                "t.py",
            ],
            "--rdzv-conf last_call_timeout=soon: expected whole",
        ),
        (["--standalone", "--nnodes", "2", "t.py"], "--standalone"),
        (["--bogus", "t.py"], "--bogus: not an option of torchrun or xpulaunch run"),
        (["--nproc-per-node"], "--nproc-per-node: expected a value"),
        (["--standalone"], "no script given"),
        (["-m", "--no-python", "x"], "--module and --no-python"),
    ],
)
def test_mistakes(args: list[str], message: str) -> None:
    with pytest.raises(UsageError, match=message):
        t(*args)


@pytest.mark.parametrize(
    ("args", "run_id"),
    [
        (["t.py"], "none"),  # torchrun's default --rdzv-id
        (["--rdzv-id", "job7", "t.py"], "job7"),
        (["--standalone", "--rdzv-id", "job7", "t.py"], "UUID"),  # torchrun's: a new uuid4
        (["--rdzv-backend", "c10d", "--rdzv-endpoint", "localhost:0", "--rdzv-id", "j", "t.py"],
         "j"),
    ],
)  # fmt: skip
def test_log_dir_is_laid_out_as_torchrun_names_its_run(args: list[str], run_id: str) -> None:
    run_args = full(*args)
    assert run_args[-6:] == ["--log-layout", "torchrun", "--log-run-id", run_id, "--", "t.py"]


def test_a_multi_node_c10d_job_asks_for_torchruns_layout() -> None:
    """run then hands --log-dir to torch's agent (test_a_multi_node_c10d_dry_run_...)."""
    run_args = full("--nnodes", "1:2", "--rdzv-backend", "c10d", "--rdzv-endpoint", "h:1", "t.py")
    assert run_args[-6:] == ["--log-layout", "torchrun", "--log-run-id", "none", "--", "t.py"]


def test_the_standalone_run_id_is_a_uuid() -> None:
    first, second = (translate(["--standalone", "t.py"], OURS, PY, {}) for _ in range(2))
    at = first.index("--log-run-id") + 1
    assert re.fullmatch(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}", first[at])
    assert first[at] != second[at]


@pytest.mark.parametrize(
    ("option", "name"),
    [("--nproc-per-node", "PET_NPROC_PER_NODE"), ("--module", "PET_MODULE"),
     ("--rdzv-endpoint", "PET_RDZV_ENDPOINT"), ("--standalone", "PET_STANDALONE")],
)  # fmt: skip
def test_variable_names_are_torchruns(option: str, name: str) -> None:
    assert variable(option) == name


@pytest.mark.parametrize(
    ("env", "args", "expected"),
    [
        ({"PET_NPROC_PER_NODE": "2"}, [], ["--nproc-per-node", "2", "--", "t.py"]),
        ({"PET_NPROC_PER_NODE": "2"}, ["--nproc_per_node=3"],  # the command line wins
         ["--nproc-per-node", "3", "--", "t.py"]),
        ({"PET_NNODES": "2", "PET_NODE_RANK": "1", "PET_MASTER_ADDR": "h0",
          "PET_MASTER_PORT": "29501"}, [],
         ["--master-addr", "h0", "--master-port", "29501", "--nnodes", "2", "--node-rank", "1",
          "--", "t.py"]),
        ({"PET_NNODES": "2", "PET_NODE_RANK": "1"}, ["--node-rank", "0"],
         ["--nnodes", "2", "--node-rank", "0", "--", "t.py"]),
        ({"PET_MAX_RESTARTS": "3", "PET_LOG_DIR": "L", "PET_LOCAL_RANKS_FILTER": "0"}, [],
         ["--ranks", "0", "--log-dir", "L", "--max-restarts", "3", "--", "t.py"]),
        ({"PET_NNODES": "1:2", "PET_RDZV_BACKEND": "c10d", "PET_RDZV_ENDPOINT": "h:29400",
          "PET_RDZV_ID": "7"}, [],
         ["--nnodes", "1:2", "--rdzv-backend", "c10d", "--rdzv-endpoint", "h:29400",
          "--rdzv-id", "7", "--", "t.py"]),
        ({"PET_RDZV_BACKEND": "etcd"}, ["--rdzv-backend", "static"], ["--", "t.py"]),
        ({"PET_NNODES": "1:2", "PET_RDZV_BACKEND": "c10d", "PET_RDZV_ENDPOINT": "h:29400",
          "PET_RDZV_CONF": "last_call_timeout=2"}, [],
         ["--nnodes", "1:2", "--rdzv-backend", "c10d", "--rdzv-conf", "last_call_timeout=2",
          "--rdzv-endpoint", "h:29400", "--", "t.py"]),
        ({"PET_STANDALONE": "1", "PET_NPROC_PER_NODE": "2"}, [],
         ["--nproc-per-node", "2", "--", "t.py"]),
        ({"PET_STANDALONE": "0", "PET_NNODES": "2"}, [], ["--nnodes", "2", "--", "t.py"]),
        ({"PET_MODULE": "1"}, [], ["--", PY, "-m", "t.py"]),
        ({"PET_NO_PYTHON": "1"}, [], ["--", "t.py"]),
        ({"PET_TEE": "3", "PET_REDIRECTS": "3", "PET_MONITOR_INTERVAL": "0.5",
          "PET_START_METHOD": "fork", "PET_ROLE": "default"}, [], ["--", "t.py"]),
        # torchrun reads no variable for these two, and an empty variable is no value.
        ({"PET_NUMA_BINDING": "node", "PET_LOGS_SPECS": "x", "PET_NPROC_PER_NODE": ""}, [],
         ["--", "t.py"]),
        ({"PET_VIRTUAL_LOCAL_RANK": "0"}, [], ["--", "t.py"]),
        ({"XPULAUNCH_NNODES": "2", "NNODES": "2"}, [], ["--", "t.py"]),
    ],
)  # fmt: skip
def test_pet_variables_are_defaults(
    env: dict[str, str], args: list[str], expected: list[str], tmp_path: Path
) -> None:
    script = "t.py"
    if "PET_NO_PYTHON" in env:  # --no-python looks the program up; give it one
        script = str(tmp_path / "t.py")
        expected = ["--", script]
    assert t(*args, script, env=env) == expected


@pytest.mark.parametrize("option", sorted(FLAGS | VALUED))
def test_every_option_but_two_has_its_variable(option: str) -> None:
    env = {variable(option): "1"}
    try:
        run_args = full("t.py", env=env)
    except UsageError as refused:  # refused, or a value "1" does not fit: named by variable
        assert str(refused).startswith(f"{variable(option)}=1")
        assert option not in NO_VARIABLE
        return
    assert (run_args == full("t.py")) is (option in NO_VARIABLE or option in _NO_EFFECT)


# Options whose value "1" changes nothing in the translation (accepted, or torchrun's default).
_NO_EFFECT = {"--monitor-interval", "--tee", "--redirects", "--event-log-handler",
              "--run-path"}  # fmt: skip


@pytest.mark.parametrize(
    ("env", "args", "message"),
    [
        ({"PET_NNODES": "2", "PET_RDZV_BACKEND": "etcd"}, [],
         "PET_RDZV_BACKEND=etcd: not supported by xpulaunch torchrun"),
        ({"PET_LOCAL_ADDR": "10.0.0.1"}, [], "PET_LOCAL_ADDR=10.0.0.1: not supported"),
        ({"PET_VIRTUAL_LOCAL_RANK": "1"}, [], "PET_VIRTUAL_LOCAL_RANK=1: not supported"),
        ({"PET_STANDALONE": "yes"}, [], "PET_STANDALONE=yes: expected 1 .on. or 0 .off.$"),
        ({"PET_MASTER_PORT": "http"}, [], "PET_MASTER_PORT=http: expected an integer$"),
        ({"PET_MONITOR_INTERVAL": "soon"}, [], "PET_MONITOR_INTERVAL=soon: expected a number$"),
        ({"PET_NPROC_PER_NODE": "two"}, [], "PET_NPROC_PER_NODE=two: expected auto, gpu"),
        ({"PET_ROLE": "trainer"}, [], "PET_ROLE=trainer: not supported"),
        ({"PET_RDZV_CONF": "join_timeout=9,bogus=5"}, [],
         "PET_RDZV_CONF=join_timeout=9,bogus=5: unknown key 'bogus'"),
        ({"PET_SIGNALS_TO_HANDLE": "SIGUSR1"}, [], "PET_SIGNALS_TO_HANDLE=SIGUSR1: not supp"),
        ({"PET_STANDALONE": "1"}, ["--nnodes", "2"],
         "PET_STANDALONE=1: a standalone job has one node; drop --nnodes 2$"),
        ({"PET_NNODES": "2"}, ["--standalone"], "--standalone: .* drop PET_NNODES=2$"),
        ({"PET_MASTER_PORT": "http"}, ["--master-port", "x"], "--master-port x: expected an"),
    ],
)  # fmt: skip
def test_pet_refusals_name_the_variable(env: dict[str, str], args: list[str], message: str) -> None:
    with pytest.raises(UsageError, match=message):
        t(*args, "t.py", env=env)


def test_a_refused_pet_value_is_one_line_and_status_2(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PET_NNODES", "2")
    monkeypatch.setenv("PET_RDZV_BACKEND", "etcd")
    with pytest.raises(SystemExit) as caught:
        main(["torchrun", "--nproc_per_node=2", "train.py"])
    assert caught.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("xpulaunch: error: PET_RDZV_BACKEND=etcd: not supported")
    assert len(err.splitlines()) == 1


def test_pet_variables_reach_the_plan(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    pet = {"PET_NNODES": "2", "PET_NODE_RANK": "1", "PET_NPROC_PER_NODE": "2",
           "PET_MASTER_ADDR": "10.1.2.3", "PET_MASTER_PORT": "29511"}  # fmt: skip
    for name, value in pet.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(SystemExit) as caught:
        main(["torchrun", "--inventory", CPU_ONLY, "--dry-run", "--json", sys.executable])
    assert caught.value.code == 0
    plan = json.loads(capsys.readouterr().out)
    assert [w["rank"] for w in plan["workers"]] == [2, 3]
    assert plan["workers"][0]["env"]["MASTER_ADDR"] == "10.1.2.3"
    assert plan["workers"][0]["env"]["MASTER_PORT"] == "29511"


def test_cli_refusal_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as caught:
        main(["torchrun", "--numa_binding", "node", "train.py"])
    assert caught.value.code != 0
    err = capsys.readouterr().err
    assert err.startswith("xpulaunch: error: --numa-binding: not supported")
    assert len(err.splitlines()) == 1


def test_cli_torchrun_dry_run_plans_torchrun_ranks(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as caught:
        main(["torchrun", "--nnodes=2", "--node_rank=1", "--nproc_per_node=2",
              "--inventory", CPU_ONLY, "--dry-run", "--json", sys.executable])  # fmt: skip
    assert caught.value.code == 0
    plan = json.loads(capsys.readouterr().out)
    assert [w["rank"] for w in plan["workers"]] == [2, 3]
    assert plan["workers"][1]["env"]["WORLD_SIZE"] == "4"


def test_plain_run_warns_about_torchrun_options_after_program(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit):
        main(["--inventory", CPU_ONLY, "--dry-run", sys.executable, "--nproc_per_node=2",
              "--standalone", "--", "--tee", "3"])  # fmt: skip
    err = capsys.readouterr().err
    assert err.count("warning") == 2
    assert "warning: --nproc_per_node (a torchrun option) goes to python" in err
    assert "--standalone (a torchrun option)" in err
    assert "--tee" not in err  # after --: meant for the program


def test_a_multi_node_c10d_dry_run_hands_settings_logs_and_filter_to_the_agent(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    logs = tmp_path / "logs"
    with pytest.raises(SystemExit) as caught:
        main(["torchrun", "--nnodes=1:2", "--rdzv-backend=c10d", "--rdzv-endpoint=h:29400",
              "--rdzv-id=j", "--rdzv-conf=last_call_timeout=1", "--log-dir", str(logs),
              "--local-ranks-filter=0", "--nproc-per-node=2", "--inventory", CPU_ONLY,
              "--dry-run", "--json", "t.py"])  # fmt: skip
    assert caught.value.code == 0
    (agent,) = json.loads(capsys.readouterr().out)["workers"]
    options = agent["argv"][agent["argv"].index("--max-restarts") + 2 :]
    assert agent["argv"][1:3] == ["-m", "xpulaunch.integrations.torch_agent"]
    assert options == [
        "--rdzv-conf", "join_timeout=600,last_call_timeout=1", "--log-dir", str(logs),
        "--redirects", "3", "--tee", "3", "--local-ranks-filter", "0", "t.py",
    ]  # fmt: skip
    assert not logs.exists()  # a dry run creates nothing
