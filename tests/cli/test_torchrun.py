"""``xpulaunch torchrun``: torchrun's command line translated into ``run``'s, every option by
both spellings, unsupported ones refused by name; and the warning of plain ``run``."""

from __future__ import annotations

import json
import os
import sys

import pytest

from helpers import inventory_path
from xpulaunch.cli.main import main
from xpulaunch.cli.program import option_arity
from xpulaunch.cli.run import run
from xpulaunch.cli.torchrun_args import FLAGS, REFUSED, VALUED, canonical, translate
from xpulaunch.errors import UsageError

PY = "/usr/bin/python3"
OURS = option_arity(run)
CPU_ONLY = str(inventory_path("cpu-only.json"))


def t(*args: str) -> list[str]:
    return translate(list(args), OURS, PY)


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
        (["--rdzv-conf", "read_timeout=5", "t.py"], "--rdzv-conf read_timeout"),
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
