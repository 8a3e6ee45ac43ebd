"""The agent module's round lines, from synthetic records shaped as torch's agent logs them
(``SimpleElasticAgent._rendezvous``), and its changes to torch's agent (``admit_joiners``,
``stop_with_the_others``), on agent classes, rendezvous handlers and stores of ours with torch's
own result types; the real agent's are in tests/multinode/test_c10d.py."""

from __future__ import annotations

import io
import logging
import subprocess
import sys
from typing import Any

import pytest

from xpulaunch.integrations.torch_agent import (
    GAVE_UP_KEY,
    RoundLines,
    admit_joiners,
    install,
    nodes_waiting,
    stop_with_the_others,
)

# torch's message (torch/distributed/elastic/agent/server/api.py), values as a dict argument.
MESSAGE = (
    "[%(role)s] Rendezvous complete for workers. Result:\n  restart_count=%(restart_count)s\n"
    "  master_addr=%(master_addr)s\n  master_port=%(master_port)s\n"
    "  group_rank=%(group_rank)s\n  group_world_size=%(group_world_size)s\n"
    "  local_ranks=%(local_ranks)s\n  role_ranks=%(role_ranks)s\n"
    "  global_ranks=%(global_ranks)s\n  role_world_sizes=%(role_world_sizes)s\n"
    "  global_world_sizes=%(global_world_sizes)s\n  event_log_handler=%(event_log_handler)s\n"
)


def values(nodes: int, group_rank: int = 0, nproc: int = 2, restarts: int = 0) -> dict[str, Any]:
    world = nodes * nproc
    return {
        "role": "default", "restart_count": restarts, "master_addr": "h", "master_port": 1,
        "group_rank": group_rank, "group_world_size": nodes, "local_ranks": list(range(nproc)),
        "role_ranks": [group_rank * nproc + i for i in range(nproc)],
        "global_ranks": [group_rank * nproc + i for i in range(nproc)],
        "role_world_sizes": [world] * nproc, "global_world_sizes": [world] * nproc,
        "event_log_handler": "null",
    }  # fmt: skip


def record(args: object, message: str = MESSAGE, level: int = logging.INFO) -> logging.LogRecord:
    return logging.LogRecord("torch.agent", level, "api.py", 553, message, (args,), None)


def lines_of(*args: object) -> list[str]:
    stream = io.StringIO()
    rounds = RoundLines(logging.WARNING, stream)
    for each in args:
        rounds.filter(record(each))
    return stream.getvalue().splitlines()


def test_the_first_round_says_who_is_in() -> None:
    assert lines_of(values(2, group_rank=1)) == [
        "xpulaunch: c10d round 1: 2 nodes, this node is group rank 1, 2 workers, world size 4"
    ]


def test_a_node_that_left_and_the_restart_spent() -> None:
    assert lines_of(values(2), values(1, restarts=1))[1] == (
        "xpulaunch: c10d round 2: 1 node (was 2; a node left; restart 1), this node is "
        "group rank 0, 2 workers, world size 2"
    )


@pytest.mark.parametrize(
    ("before", "now", "said"),
    [
        (2, 3, "(was 2; a node joined)"),
        (1, 3, "(was 1; 2 nodes joined)"),
        (4, 2, "(was 4; 2 nodes left)"),
        (2, 2, "(was 2; the same number of nodes)"),
    ],
)
def test_what_changed_between_rounds(before: int, now: int, said: str) -> None:
    assert f"round 2: {now} nodes {said}, " in lines_of(values(before), values(now))[1]


@pytest.mark.parametrize(
    "args",
    [
        ("a", "tuple"),  # a future torch passing values another way
        {"group_world_size": 2},  # or other values
        {**values(2), "group_rank": "0"},
        {**values(2), "global_world_sizes": []},
        {**values(2), "local_ranks": None},
    ],
)
def test_a_changed_record_prints_nothing_and_raises_nothing(args: object) -> None:
    assert lines_of(args) == []


def test_other_records_pass_only_at_the_level_torch_had_set() -> None:
    logger = logging.getLogger("xpulaunch-test.torch-agent")
    logger.setLevel(logging.WARNING)
    seen: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda r: seen.append(r.getMessage())  # type: ignore[method-assign]
    logger.addHandler(handler)
    stream = io.StringIO()
    lines = install(logger, stream)
    try:
        logger.info(MESSAGE, values(2))
        logger.info("some other INFO line of torch's")
        logger.warning("a warning of torch's")
    finally:
        logger.removeFilter(lines)
        logger.removeHandler(handler)
    assert seen == ["a warning of torch's"]
    assert stream.getvalue().startswith("xpulaunch: c10d round 1: 2 nodes, ")


def test_with_torchs_info_on_the_record_is_shown_as_well() -> None:
    stream = io.StringIO()
    assert RoundLines(logging.INFO, stream).filter(record(values(2))) is True
    assert stream.getvalue().count("\n") == 1


def test_a_closed_stderr_does_not_fail_the_agent() -> None:
    stream = io.StringIO()
    stream.close()
    assert RoundLines(logging.WARNING, stream).filter(record(values(2))) is False


def test_importing_it_imports_no_torch() -> None:
    code = "import sys, xpulaunch.integrations.torch_agent; print('torch' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, check=True)  # fmt: skip
    assert done.stdout == "False\n"


class Handler:
    """A rendezvous handler whose answers to ``num_nodes_waiting`` are given in turn (the last
    one repeated): torch's handler answers from a state read up to a second earlier."""

    def __init__(self, *answers: int) -> None:
        self.answers = list(answers)
        self.asked = 0

    def num_nodes_waiting(self) -> int:
        self.asked += 1
        return self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]


def test_a_node_waiting_is_seen_once_the_answer_is_fresh() -> None:
    handler = Handler(0, 0, 1)
    assert nodes_waiting(handler, fresh_after_s=5.0) is True
    assert handler.asked == 3


def test_without_a_node_waiting_it_asks_until_an_answer_is_fresh() -> None:
    handler = Handler(0)
    assert nodes_waiting(handler, fresh_after_s=0.25) is False
    assert handler.asked >= 3  # every 0.1 s until past 0.25 s


def agent_with(state_name: str, handler: Handler) -> tuple[Any, Any, io.StringIO]:
    """An agent class whose monitor reports ``state_name``, with ``admit_joiners`` applied,
    and the worker group it is asked about."""
    api = pytest.importorskip("torch.distributed.elastic.agent.server.api")

    class Agent:
        def _monitor_workers(self, worker_group: Any) -> Any:
            return api.RunResult(state=api.WorkerState[state_name], failures={0: "the failure"})

    stream = io.StringIO()
    admit_joiners(Agent, stream, fresh_after_s=0.25)
    group = type("Group", (), {"spec": type("Spec", (), {"rdzv_handler": handler})})()
    return Agent(), group, stream


@pytest.mark.parametrize("state_name", ["FAILED", "UNHEALTHY"])
def test_workers_failing_while_a_node_waits_are_restarted_as_healthy_ones(state_name: str):
    agent, group, stream = agent_with(state_name, Handler(0, 1))
    result = agent._monitor_workers(group)
    assert result.state.name == "HEALTHY"  # torch's agent then restarts for the newcomer
    assert not result.failures
    assert stream.getvalue() == (
        "xpulaunch: c10d: this node's workers failed while a node waits to join; they start "
        "again in the next round, without spending a restart\n"
    )


def test_a_failure_with_no_node_waiting_is_torchs_to_handle() -> None:
    agent, group, stream = agent_with("FAILED", Handler(0))
    result = agent._monitor_workers(group)
    assert result.state.name == "FAILED"
    assert result.failures == {0: "the failure"}
    assert stream.getvalue() == ""


def test_a_rendezvous_that_cannot_answer_leaves_the_failure_to_torch() -> None:
    class Gone(Handler):
        def num_nodes_waiting(self) -> int:
            raise RuntimeError("Connection reset by peer")  # as torch's store client raises

    agent, group, stream = agent_with("FAILED", Gone(0))
    assert agent._monitor_workers(group).state.name == "FAILED"
    assert stream.getvalue() == ""


@pytest.mark.parametrize("state_name", ["HEALTHY", "SUCCEEDED"])
def test_other_states_pass_without_asking_the_rendezvous(state_name: str) -> None:
    handler = Handler(1)
    agent, group, stream = agent_with(state_name, handler)
    assert agent._monitor_workers(group).state.name == state_name
    assert handler.asked == 0
    assert stream.getvalue() == ""


def test_room_to_grow_says_how_long_the_first_round_waits_for_late_nodes() -> None:
    from xpulaunch.integrations.torch_agent import late_nodes_line

    assert late_nodes_line(2, 2, "") is None
    line = late_nodes_line(2, 4, "")
    assert line is not None and "waiting for 2 to 4 nodes" in line and "30 s more" in line
    assert "waits 5 s more" in (late_nodes_line(1, 2, "join_timeout=9,last_call_timeout=5") or "")


@pytest.mark.torch
def test_the_agent_says_it_waits_for_late_nodes_before_the_silence() -> None:
    pytest.importorskip("torch")
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    argv = [sys.executable, "-m", "xpulaunch.integrations.torch_agent", "--nnodes", "1:2",
            "--nproc-per-node", "1", "--rdzv-backend", "c10d",
            "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-conf", "last_call_timeout=1",
            "--no-python", "true"]  # fmt: skip
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "c10d: waiting for 1 to 2 nodes; once 1 is here, torch waits 1 s more" in done.stderr


class Store:
    """A round's store as torch's agent uses it: check, get (bytes) and set."""

    def __init__(self, **keys: str) -> None:
        self.keys = {key: value.encode() for key, value in keys.items()}
        self.checked = 0

    def check(self, keys: list[str]) -> bool:
        self.checked += 1
        return all(key in self.keys for key in keys)

    def get(self, key: str) -> bytes:
        return self.keys[key]

    def set(self, key: str, value: str) -> None:
        self.keys[key] = value.encode()


class GoneStore(Store):
    def check(self, keys: list[str]) -> bool:
        raise RuntimeError("Connection reset by peer")  # as torch's store client raises

    def set(self, key: str, value: str) -> None:
        raise RuntimeError("Connection reset by peer")


def watching_agent(store: Store, final: str = "FAILED") -> tuple[Any, io.StringIO]:
    """An agent with ``stop_with_the_others`` applied: its workers are healthy until stopped,
    and its run ends ``final``."""
    api = pytest.importorskip("torch.distributed.elastic.agent.server.api")

    class Agent:
        def __init__(self) -> None:
            self.stopped = 0
            self._worker_group = type("Group", (), {"store": store, "group_rank": 1})()

        def _invoke_run(self, role: str = "default") -> Any:
            return api.RunResult(state=api.WorkerState[final])

        def _monitor_workers(self, worker_group: Any) -> Any:
            if self.stopped:
                return api.RunResult(state=api.WorkerState.FAILED, failures={0: "SIGTERM"})
            return api.RunResult(state=api.WorkerState.HEALTHY)

        def _stop_workers(self, worker_group: Any) -> None:
            self.stopped += 1

    stream = io.StringIO()
    stop_with_the_others(Agent, stream, check_every_s=60.0)
    return Agent(), stream


def test_an_agent_that_gives_up_tells_the_others() -> None:
    store = Store()
    agent, _ = watching_agent(store, final="FAILED")
    assert agent._invoke_run().state.name == "FAILED"
    assert store.keys == {GAVE_UP_KEY: b"1"}


def test_an_agent_that_succeeds_tells_nothing() -> None:
    store = Store()
    agent, _ = watching_agent(store, final="SUCCEEDED")
    agent._invoke_run()
    assert store.keys == {}


def test_workers_are_stopped_when_another_node_gave_up() -> None:
    agent, stream = watching_agent(Store(**{GAVE_UP_KEY: "1"}))
    group = agent._worker_group
    result = agent._monitor_workers(group)
    assert (result.state.name, result.failures, agent.stopped) == ("FAILED", {0: "SIGTERM"}, 1)
    assert stream.getvalue() == (
        "xpulaunch: c10d: the node of group rank 1 gave up (its workers failed, with no "
        "restarts left); stopping this node's workers\n"
    )


def test_while_no_node_gave_up_the_store_is_asked_once_a_period() -> None:
    store = Store()
    agent, stream = watching_agent(store)
    for _ in range(3):
        assert agent._monitor_workers(agent._worker_group).state.name == "HEALTHY"
    assert (store.checked, agent.stopped, stream.getvalue()) == (1, 0, "")


def test_a_store_that_cannot_answer_leaves_the_workers_to_torch() -> None:
    agent, stream = watching_agent(GoneStore(), final="FAILED")
    assert agent._monitor_workers(agent._worker_group).state.name == "HEALTHY"
    assert agent._invoke_run().state.name == "FAILED"  # telling the others cannot fail it
    assert (agent.stopped, stream.getvalue()) == (0, "")
