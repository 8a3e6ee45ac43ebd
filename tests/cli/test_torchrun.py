"""``xpulaunch torchrun``: torchrun's command line (and its ``PET_*`` variables) as the same
request ``run`` builds from our options, every option by both spellings, unsupported ones
refused by name (or by variable); and the warning of plain ``run``."""

from __future__ import annotations

import contextlib
import json
import os
import re
import select
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from helpers import cli_error, inventory_path, reap, request_of
from xpulaunch.cli.main import main
from xpulaunch.cli.torchrun import FLAGS, REFUSED, TORCHRUN_ONLY, torchrun
from xpulaunch.launch.request import RunRequest

PY = sys.executable
U = [PY, "-u"]  # torchrun runs a script or module with python -u: unbuffered output
CPU_ONLY = str(inventory_path("cpu-only.json"))


def t(*args: str, env: dict[str, str] | None = None) -> RunRequest:
    """The request of ``xpulaunch torchrun ARGS``, without torchrun's log layout (tested on
    its own below)."""
    request = request_of("torchrun", *args, env=env)
    assert request.log_layout.value == "torchrun"
    return replace(request, log_layout=RunRequest.__dataclass_fields__["log_layout"].default,
                   log_run_id=None)  # fmt: skip


def r(*args: str) -> RunRequest:
    """The request of ``xpulaunch run ARGS``."""
    return request_of("run", *args)


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--standalone", "--nproc_per_node=2", "train.py", "--lr", "1"],
         ["--nproc-per-node", "2", "--", *U, "train.py", "--lr", "1"]),
        (["--nnodes=2", "--node_rank", "1", "--master_addr", "h0", "--master_port=29501", "t.py"],
         ["--nnodes", "2", "--node-rank", "1", "--master-addr", "h0", "--master-port", "29501",
          "--", *U, "t.py"]),
        (["--nproc-per-node", "gpu", "t.py"],
         ["--backend", "cuda", "--nproc-per-node", "auto", "--", *U, "t.py"]),
        (["--nproc-per-node", "xpu", "t.py"],
         ["--backend", "xpu", "--nproc-per-node", "auto", "--", *U, "t.py"]),
        (["--nproc-per-node", "cpu", "t.py"],
         ["--gpus", "none", "--nproc-per-node", str(os.cpu_count()), "--", *U, "t.py"]),
        (["-m", "pkg.train", "--x"], ["--", *U, "-m", "pkg.train", "--x"]),
        (["--run-path", "script"], ["--", *U, "script"]),
        # --run-path wins over -m and --no-python, as in torchrun's config_from_args
        (["--run-path", "--no-python", "script"], ["--", *U, "script"]),
        (["--run-path", "-m", "script.py"], ["--", *U, "script.py"]),
        (["--max_restarts", "3", "--monitor_interval", "5", "--rdzv_id", "j", "--tee", "3",
          "-r", "3", "--start_method", "fork", "--role", "default", "t.py"],
         ["--max-restarts", "3", "--", *U, "t.py"]),
        (["--log_dir", "L", "--local_ranks_filter", "0", "--shutdown-timeout", "5", "t.py"],
         ["--log-dir", "L", "--ranks", "0", "--grace", "5", "--", *U, "t.py"]),
        (["--rdzv-backend", "c10d", "--rdzv-endpoint", "localhost:0", "t.py"], ["--", *U, "t.py"]),
        (["--rdzv-conf", "join_timeout=30", "t.py"], ["--join-timeout", "30", "--", *U, "t.py"]),
        # torch's other c10d settings: for the agent of a multi-node c10d job ...
        (["--nnodes=1:2", "--rdzv-backend=c10d", "--rdzv-endpoint=h:1",
          "--rdzv-conf", "join_timeout=30, last_call_timeout=1,is_host=0", "t.py"],
         ["--nnodes", "1:2", "--rdzv-backend", "c10d", "--rdzv-endpoint", "h:1",
          "--join-timeout", "30", "--rdzv-conf", "last_call_timeout=1,is_host=0",
          "--", *U, "t.py"]),
        # ... and changing nothing where no c10d rendezvous runs, as in torchrun
        (["--rdzv-conf", "read_timeout=5", "t.py"], ["--", *U, "t.py"]),
        (["--standalone", "--rdzv-conf", "last_call_timeout=1", "t.py"], ["--", *U, "t.py"]),
        (["--nnodes=1:2", "--rdzv_backend=c10d", "--rdzv_endpoint=h:29400", "--rdzv_id=7", "t.py"],
         ["--nnodes", "1:2", "--rdzv-backend", "c10d", "--rdzv-endpoint", "h:29400",
          "--rdzv-id", "7", "--", *U, "t.py"]),
        (["--gpus", "2", "--isolate", "t.py"], ["--gpus", "2", "--isolate", "--", *U, "t.py"]),
        (["t.py", "--nproc_per_node", "2"], ["--", *U, "t.py", "--nproc_per_node", "2"]),
    ],
)  # fmt: skip
def test_a_torchrun_line_is_the_run_line(args: list[str], expected: list[str]) -> None:
    assert t(*args) == r(*expected)


@pytest.mark.parametrize(
    ("value", "mode", "noted"),
    [("node", "numa", False), ("socket", "numa", True), ("exclusive", "exclusive", False),
     ("core-complex", "exclusive", True)],
)  # fmt: skip
def test_numa_binding_is_cpu_bind(value: str, mode: str, noted: bool) -> None:
    request = t("--numa-binding", value, "t.py")
    assert request.cpu_bind == mode
    assert bool(request.notes) is noted
    code, err = cli_error("torchrun", "--numa-binding", "rack", "t.py")
    assert code == 2 and "--numa-binding" in err and len(err.splitlines()) == 1


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_each_unsupported_option_is_refused_by_name(name: str) -> None:
    option = "--" + name
    value = [] if name in FLAGS else ["x"]
    code, err = cli_error("torchrun", option, *value, "t.py")
    assert code == 2
    assert err.startswith(f"xpulaunch: error: --{name.replace('_', '-')}")
    assert "not supported" in err and len(err.splitlines()) == 1


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--nnodes", "2", "--rdzv-backend", "etcd", "t.py"], "--rdzv-backend etcd"),
        (["--role", "trainer", "t.py"], "--role"),
        (["--signals-to-handle", "SIGTERM,SIGALRM", "t.py"], "--signals-to-handle SIGALRM"),
        (["--rdzv-conf", "read_timout=5", "t.py"], "--rdzv-conf read_timout=5: unknown key"),
        (["--nnodes", "2", "--rdzv-backend", "c10d", "--rdzv-endpoint", "h:1",
          "--rdzv-conf", "last_call_timeout=soon", "t.py"],
         "--rdzv-conf last_call_timeout=soon: expected whole"),
        (["--standalone", "--nnodes", "2", "t.py"], "--standalone"),
        (["--bogus", "t.py"], "--bogus"),
        (["--nproc-per-node"], "--nproc-per-node"),
        (["--standalone"], "Missing argument"),
        (["-m", "--no-python", "x"], "--module and --no-python"),
        (["--nproc-per-node", "two", "t.py"], "expected auto, gpu, xpu, cpu or a count"),
    ],
)  # fmt: skip
def test_mistakes_are_one_line(args: list[str], message: str) -> None:
    code, err = cli_error("torchrun", *args)
    assert code == 2 and len(err.splitlines()) == 1, err
    assert message in err


@pytest.mark.parametrize(
    ("args", "run_id"),
    [
        (["--master-port", "29500", "t.py"], "none"),  # torchrun's default --rdzv-id
        (["--rdzv-id", "job7", "--master-port", "29500", "t.py"], "job7"),
        (["--nnodes", "2", "t.py"], "none"),
        (["--rdzv-endpoint", "h:29500", "--rdzv-id", "j", "t.py"], "j"),
        (["--rdzv-backend", "c10d", "--rdzv-endpoint", "localhost:0", "--rdzv-id", "j", "t.py"],
         "j"),
        (["--nnodes", "1:2", "--rdzv-backend", "c10d", "--rdzv-endpoint", "h:1", "t.py"], "none"),
    ],
)  # fmt: skip
def test_log_dir_is_laid_out_as_torchrun_names_its_run(args: list[str], run_id: str) -> None:
    request = request_of("torchrun", *args)
    assert (request.log_layout.value, request.log_run_id) == ("torchrun", run_id)


@pytest.mark.parametrize(
    "args",
    [
        ["--standalone"],
        [],  # torchrun runs a one-node line that names no port as --standalone
        ["--rdzv-id", "job7"],  # ... and gives it a new uuid even then
        ["--nnodes=1:1", "--rdzv-backend=static", "--master-addr", "127.0.0.1"],
    ],
)
def test_the_standalone_run_id_is_a_new_uuid(args: list[str]) -> None:
    first, second = (request_of("torchrun", *args, "t.py").log_run_id for _ in "ab")
    uuid = r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"
    assert re.fullmatch(uuid, first or "") and first != second


@pytest.mark.parametrize(
    ("env", "args", "expected"),
    [
        ({"PET_NPROC_PER_NODE": "2"}, [], ["--nproc-per-node", "2", "--", *U, "t.py"]),
        ({"PET_NPROC_PER_NODE": "2"}, ["--nproc_per_node=3"],  # the command line wins
         ["--nproc-per-node", "3", "--", *U, "t.py"]),
        ({"PET_NNODES": "2", "PET_NODE_RANK": "1", "PET_MASTER_ADDR": "h0",
          "PET_MASTER_PORT": "29501"}, [],
         ["--master-addr", "h0", "--master-port", "29501", "--nnodes", "2", "--node-rank", "1",
          "--", *U, "t.py"]),
        ({"PET_NNODES": "2", "PET_NODE_RANK": "1"}, ["--node-rank", "0"],
         ["--nnodes", "2", "--node-rank", "0", "--", *U, "t.py"]),
        ({"PET_MAX_RESTARTS": "3", "PET_LOG_DIR": "L", "PET_LOCAL_RANKS_FILTER": "0"}, [],
         ["--ranks", "0", "--log-dir", "L", "--max-restarts", "3", "--", *U, "t.py"]),
        ({"PET_NNODES": "1:2", "PET_RDZV_BACKEND": "c10d", "PET_RDZV_ENDPOINT": "h:29400",
          "PET_RDZV_ID": "7"}, [],
         ["--nnodes", "1:2", "--rdzv-backend", "c10d", "--rdzv-endpoint", "h:29400",
          "--rdzv-id", "7", "--", *U, "t.py"]),
        ({"PET_RDZV_BACKEND": "etcd"}, ["--rdzv-backend", "static"], ["--", *U, "t.py"]),
        ({"PET_NNODES": "1:2", "PET_RDZV_BACKEND": "c10d", "PET_RDZV_ENDPOINT": "h:29400",
          "PET_RDZV_CONF": "last_call_timeout=2"}, [],
         ["--nnodes", "1:2", "--rdzv-backend", "c10d", "--rdzv-conf", "last_call_timeout=2",
          "--rdzv-endpoint", "h:29400", "--", *U, "t.py"]),
        ({"PET_STANDALONE": "1", "PET_NPROC_PER_NODE": "2"}, [],
         ["--nproc-per-node", "2", "--", *U, "t.py"]),
        ({"PET_STANDALONE": "0", "PET_NNODES": "2"}, [], ["--nnodes", "2", "--", *U, "t.py"]),
        ({"PET_MODULE": "1"}, [], ["--", *U, "-m", "t.py"]),
        ({"PET_TEE": "3", "PET_REDIRECTS": "3", "PET_MONITOR_INTERVAL": "0.5",
          "PET_START_METHOD": "fork", "PET_ROLE": "default"}, [], ["--", *U, "t.py"]),
        # torchrun reads no variable for these two, and an empty variable is no value.
        ({"PET_NUMA_BINDING": "node", "PET_LOGS_SPECS": "x", "PET_NPROC_PER_NODE": ""}, [],
         ["--", *U, "t.py"]),
        ({"PET_VIRTUAL_LOCAL_RANK": "0"}, [], ["--", *U, "t.py"]),
        ({"XPULAUNCH_NNODES": "2", "NNODES": "2"}, [], ["--nnodes", "2", "--", *U, "t.py"]),
    ],
)  # fmt: skip
def test_pet_variables_are_defaults(
    env: dict[str, str], args: list[str], expected: list[str]
) -> None:
    assert t(*args, "t.py", env=env) == r(*expected)


def test_a_no_python_program_is_looked_up_on_path(tmp_path: Path) -> None:
    program = tmp_path / "tool"
    program.write_text("#!/bin/sh\n")
    program.chmod(0o755)
    env = {"PATH": f"{tmp_path}:{os.environ['PATH']}", "PET_NO_PYTHON": "1"}
    assert t("tool", env=env).program == (str(program),)


def test_a_line_printed_without_a_flush_reaches_the_console_at_once(tmp_path: Path) -> None:
    """As under torchrun (python -u): a worker's line is on the console while the worker still
    runs (here until the test has seen it), not only when its buffer fills or it ends."""
    go = tmp_path / "go"
    script = tmp_path / "prints.py"
    script.write_text(
        f"import os, time\nprint('up')\nwhile not os.path.exists({str(go)!r}):\n"
        "    time.sleep(0.05)\n"
    )
    env = {name: value for name, value in os.environ.items() if name != "PYTHONUNBUFFERED"}
    proc = subprocess.Popen(
        [PY, "-m", "xpulaunch", "torchrun", "--gpus", "none", str(script)],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        readable, _, _ = select.select([proc.stdout], [], [], 60)
        assert readable, "no line from the worker while it runs"
        assert proc.stdout.readline().endswith("up\n")
    finally:
        go.touch()
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=60)
        reap([proc])
    assert proc.returncode == 0


def test_every_torchrun_option_has_both_spellings_and_its_variable() -> None:
    names = {opt for p in torchrun.params for opt in getattr(p, "opts", ())}
    for spec in TORCHRUN_ONLY:
        long = next(d for d in spec.decls if d.startswith("--"))
        assert long.replace("-", "_").replace("__", "--", 1) in names
    variables = {v for p in torchrun.params for v in _envvars(p)}
    for name in ("NNODES", "NODE_RANK", "MASTER_ADDR", "MASTER_PORT", "NPROC_PER_NODE",
                 "RDZV_BACKEND", "RDZV_ENDPOINT", "RDZV_ID", "RDZV_CONF", "MAX_RESTARTS",
                 "LOG_DIR", "LOCAL_RANKS_FILTER", "MONITOR_INTERVAL", "START_METHOD", "ROLE",
                 "REDIRECTS", "TEE", "SIGNALS_TO_HANDLE", "SHUTDOWN_TIMEOUT", "LOCAL_ADDR",
                 "EVENT_LOG_HANDLER", "DUPLICATE_STDOUT_FILTERS"):  # fmt: skip
        assert f"PET_{name}" in variables, name
    assert not {"PET_NUMA_BINDING", "PET_LOGS_SPECS"} & variables  # torchrun has none either


def _envvars(param: object) -> list[str]:
    envvar = getattr(param, "envvar", None)
    return [envvar] if isinstance(envvar, str) else list(envvar or ())


@pytest.mark.parametrize(
    ("env", "args", "message"),
    [
        ({"PET_NNODES": "2", "PET_RDZV_BACKEND": "etcd"}, [],
         "PET_RDZV_BACKEND=etcd: not supported by xpulaunch torchrun"),
        ({"PET_LOCAL_ADDR": "10.0.0.1"}, [], "PET_LOCAL_ADDR=10.0.0.1: not supported"),
        ({"PET_VIRTUAL_LOCAL_RANK": "1"}, [], "PET_VIRTUAL_LOCAL_RANK=1: not supported"),
        ({"PET_STANDALONE": "yes"}, [], "PET_STANDALONE=yes: expected 1 (on) or 0 (off)"),
        ({"PET_MASTER_PORT": "http"}, [], "PET_MASTER_PORT"),
        ({"PET_MONITOR_INTERVAL": "soon"}, [], "PET_MONITOR_INTERVAL"),
        ({"PET_NPROC_PER_NODE": "two"}, [], "PET_NPROC_PER_NODE"),
        ({"PET_ROLE": "trainer"}, [], "PET_ROLE"),
        ({"PET_RDZV_CONF": "join_timeout=9,bogus=5"}, [], "unknown key 'bogus'"),
        ({"PET_SIGNALS_TO_HANDLE": "SIGALRM"}, [], "PET_SIGNALS_TO_HANDLE=SIGALRM: not supp"),
        ({"PET_STANDALONE": "1"}, ["--nnodes", "2"],
         "a standalone job has one node; drop --nnodes 2"),
        ({"PET_NNODES": "2"}, ["--standalone"], "drop PET_NNODES=2"),
        ({"PET_MASTER_PORT": "http"}, ["--master-port", "x"], "--master-port"),
    ],
)  # fmt: skip
def test_pet_refusals_name_the_variable(env: dict[str, str], args: list[str], message: str) -> None:
    code, err = cli_error("torchrun", *args, "t.py", env=env)
    assert code == 2 and len(err.splitlines()) == 1, err
    assert message in err


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


def test_python_exec_is_the_interpreter_of_a_script_or_module(tmp_path: Path) -> None:
    # torchrun's config_from_args: os.getenv("PYTHON_EXEC", sys.executable)
    other = str(tmp_path / "python3.12")
    env = {"PYTHON_EXEC": other}
    assert t("t.py", "--x", env=env).program == (other, "-u", "t.py", "--x")
    assert t("-m", "pkg.train", env=env).program == (other, "-u", "-m", "pkg.train")
    assert t("--run-path", "t.py", env=env).program == (PY, "-u", "t.py")  # runpy, in torchrun


def test_the_readme_lists_as_refused_only_what_is_refused() -> None:
    """The README listed ``--numa-binding`` as refused while it maps onto ``--cpu-bind``."""
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    said = readme.replace("\n", " ").split("or refused by name in one line (", 1)[1]
    named = re.findall(r"`--([a-z-]+)`", said.split(")", 1)[0])
    assert named and all(name.replace("-", "_") in REFUSED for name in named), named
    for value in ("node", "exclusive"):  # and what it says it maps, it maps
        assert t("--numa-binding", value, "t.py").cpu_bind == {"node": "numa"}.get(value, value)
