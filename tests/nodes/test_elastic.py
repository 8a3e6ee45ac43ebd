"""``agent_plan``: this node's plan as one torchrun agent (pure; no torch, no processes)."""

from __future__ import annotations

from typing import Any

import pytest

from xpulaunch.errors import UsageError
from xpulaunch.model import Backend, Plan, WorkerPlan
from xpulaunch.nodes.elastic import (
    AGENT_NAME,
    DISABLE_SHARED_STORE,
    agent_argv,
    agent_plan,
    local_ranks_filter,
)
from xpulaunch.nodes.settings import ElasticSpec, parse_rdzv_conf

PY = "/usr/bin/python3"


def node_plan(nproc: int = 2, *, isolate: bool = False) -> Plan:
    workers = tuple(
        WorkerPlan(str(i), i, i, (PY, "train.py", "--lr", "1"),
                   {"RANK": str(i), "LOCAL_RANK": str(i), "OMP_NUM_THREADS": "1"})
        for i in range(nproc)
    )  # fmt: skip
    return Plan(Backend.CPU, (), workers, None, isolate=isolate)


def spec(nnodes: str) -> ElasticSpec:
    low, _, high = nnodes.partition(":")
    return ElasticSpec(int(low), int(high or low), "10.0.0.1:29400", "job")


def agent(nnodes: str, max_restarts: int | None, *, isolate: bool = False) -> WorkerPlan:
    plan = agent_plan(node_plan(isolate=isolate), spec(nnodes), python=PY,
                      max_restarts=max_restarts, join_timeout_s=30)  # fmt: skip
    assert len(plan.workers) == 1
    return plan.workers[0]


def test_one_agent_runs_the_nodes_workers_with_torchruns_options() -> None:
    got = agent("1:2", 3)
    assert got.name == AGENT_NAME
    assert got.argv == (
        PY, "-m", "xpulaunch.integrations.torch_agent", "--nnodes", "1:2", "--nproc-per-node", "2",
        "--rdzv-backend", "c10d", "--rdzv-endpoint", "10.0.0.1:29400", "--rdzv-id", "job",
        "--max-restarts", "3", "--rdzv-conf", "join_timeout=30", "train.py", "--lr", "1",
    )  # fmt: skip
    assert "RANK" not in got.env and "LOCAL_RANK" not in got.env  # the agent's to set
    assert got.env["OMP_NUM_THREADS"] == "1"


@pytest.mark.parametrize(
    ("nnodes", "max_restarts", "fresh_store"),
    [
        ("2", 0, False),  # one round: torch's default, the agent's store
        ("2:2", 0, False),
        ("2", 1, True),  # a restart is a second round
        ("2", None, True),  # unlimited restarts
        ("1:2", 0, True),  # a node joining below MAX starts a new round without a restart
        ("2:3", 0, True),
    ],
)
def test_a_fresh_worker_store_per_round_only_where_a_second_round_can_come(
    nnodes: str, max_restarts: int | None, fresh_store: bool
) -> None:
    env = agent(nnodes, max_restarts).env
    assert (env.get(DISABLE_SHARED_STORE) == "1") is fresh_store


def test_isolate_is_refused_in_one_line() -> None:
    with pytest.raises(UsageError, match="--isolate with --rdzv-backend c10d"):
        agent("2", 0, isolate=True)


def argv(**options: Any) -> tuple[str, ...]:
    """The agent's options, between ``--max-restarts N`` and the program."""
    got = agent_argv((PY, "t.py"), 2, spec("1:2"), python=PY, max_restarts=0, **options)
    return got[got.index("--max-restarts") + 2 : got.index("t.py")]


@pytest.mark.parametrize(
    ("options", "expected"),
    [
        ({"join_timeout_s": 0}, ()),  # torch's own join timeout
        ({"join_timeout_s": 0.5}, ("--rdzv-conf", "join_timeout=1")),  # torch reads int()
        ({"join_timeout_s": 30, "rdzv_conf": (("last_call_timeout", "1"), ("is_host", "0"))},
         ("--rdzv-conf", "join_timeout=30,last_call_timeout=1,is_host=0")),
        ({"join_timeout_s": 0, "rdzv_conf": (("read_timeout", "9"),)},
         ("--rdzv-conf", "read_timeout=9")),
        ({"join_timeout_s": 30, "rdzv_conf": (("join_timeout", "5"),)},  # join_timeout_s wins
         ("--rdzv-conf", "join_timeout=30")),
        ({"join_timeout_s": 0, "log_dir": "/l"},
         ("--log-dir", "/l", "--redirects", "3", "--tee", "3")),
        ({"join_timeout_s": 0, "log_dir": "/l", "local_ranks": "0,2"},
         ("--log-dir", "/l", "--redirects", "3", "--tee", "3", "--local-ranks-filter", "0,2")),
        ({"join_timeout_s": 0, "local_ranks": "1"}, ("--local-ranks-filter", "1")),
    ],
)  # fmt: skip
def test_the_agents_rendezvous_settings_logs_and_console(
    options: dict[str, Any], expected: tuple[str, ...]
) -> None:
    assert argv(**options) == expected


@pytest.mark.parametrize(
    ("program", "expected"),
    [
        ((PY, "t.py", "--x"), ("t.py", "--x")),
        ((PY, "-u", "t.py", "--x"), ("t.py", "--x")),  # xpulaunch torchrun's; the agent adds -u
        ((PY, "-u", "-m", "pkg"), ("--no-python", PY, "-u", "-m", "pkg")),
        (("/bin/tool", "-u"), ("--no-python", "/bin/tool", "-u")),
    ],
)  # fmt: skip
def test_the_agent_runs_a_script_of_this_python_itself(
    program: tuple[str, ...], expected: tuple[str, ...]
) -> None:
    got = agent_argv(program, 2, spec("1:2"), python=PY, max_restarts=0, join_timeout_s=0)
    assert got[got.index("--max-restarts") + 2 :] == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("", ()),
        ("last_call_timeout=1", (("last_call_timeout", "1"),)),
        (" close_timeout = 5 , heartbeat_timeout=10.0,", (("close_timeout", "5"),
                                                          ("heartbeat_timeout", "10"))),
        ("keep_alive_interval=2,keep_alive_max_attempt=4,read_timeout=60,is_host=True",
         (("keep_alive_interval", "2"), ("keep_alive_max_attempt", "4"), ("read_timeout", "60"),
          ("is_host", "true"))),
        ("join_timeout=30,join_timeout=40", (("join_timeout", "40"),)),  # torch's: the last
    ],
)  # fmt: skip
def test_rdzv_conf_keys_torch_reads(text: str, expected: tuple[tuple[str, str], ...]) -> None:
    assert parse_rdzv_conf(text) == expected


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("last_cal_timeout=1", "--rdzv-conf last_cal_timeout=1: unknown key 'last_cal_timeout'; "
         "torch's c10d rendezvous reads close_timeout, heartbeat_timeout, is_host, "
         "join_timeout, keep_alive_interval, keep_alive_max_attempt, last_call_timeout, "
         "read_timeout"),
        ("timeout=5", "--rdzv-conf timeout=5: unknown key 'timeout'"),  # not read by c10d
        ("store_type=file", "unknown key 'store_type'"),  # needs a file, not HOST:PORT
        ("join_timeout=soon", "--rdzv-conf join_timeout=soon: expected whole seconds of at "
         "least 1 .torch reads an integer.$"),
        ("last_call_timeout=1.5", "last_call_timeout=1.5: expected whole seconds"),
        ("close_timeout=0", "close_timeout=0: expected whole seconds"),  # torch: must be > 0
        ("read_timeout=nan", "read_timeout=nan: expected whole seconds"),
        ("heartbeat_timeout=inf", "heartbeat_timeout=inf: expected whole seconds"),
        ("keep_alive_max_attempt=x", "keep_alive_max_attempt=x: expected a count of at least 1"),
        ("is_host=maybe", "is_host=maybe: expected 1 or 0 .true or false.$"),
        ("last_call_timeout", "last_call_timeout: expected whole seconds"),
    ],
)  # fmt: skip
def test_rdzv_conf_mistakes_are_one_line_naming_the_key(text: str, message: str) -> None:
    with pytest.raises(UsageError, match=message):
        parse_rdzv_conf(text)


@pytest.mark.parametrize(("text", "expected"), [("0", "0"), (" 0, 2 ", "0,2"), ("3,", "3")])
def test_local_ranks_filter(text: str, expected: str) -> None:
    assert local_ranks_filter(text) == expected


@pytest.mark.parametrize("text", ["", "a", "0,x", "-1"])
def test_local_ranks_filter_mistakes(text: str) -> None:
    with pytest.raises(UsageError, match=f"--ranks {text}: with --rdzv-backend c10d, expected"):
        local_ranks_filter(text)
