"""The REAL llama-server under :class:`LlamaServer`: health, completion, restarts, ports.

Each test starts CPU llama-server processes on the tiny model (see conftest.py); kill -9,
SIGSTOP and a held port are real. Health settings are short so that each test takes a few
seconds.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from helpers import wait_for
from xpulaunch.errors import ServerStartError
from xpulaunch.events import Event, Exited, Unhealthy
from xpulaunch.joblog.logs import LogConfig
from xpulaunch.llamacpp.devices import LlamaBackend
from xpulaunch.llamacpp.health import health_status
from xpulaunch.llamacpp.plan import LlamaPlan, LlamaRequest, Replica, make_llama_plan
from xpulaunch.llamacpp.serve import plan_llama
from xpulaunch.llamacpp.server import HealthOptions, LlamaServer
from xpulaunch.model import Inventory
from xpulaunch.supervisor.restart import RestartMode, RestartPolicy

pytestmark = [pytest.mark.llama, pytest.mark.slow, pytest.mark.timeout(60)]

FAST = HealthOptions(ready_timeout_s=20, ready_interval_s=0.1, interval_s=0.3, timeout_s=0.5,
                     failure_threshold=2)  # fmt: skip
POLICY = RestartPolicy(mode=RestartMode.ALWAYS, max_restarts=3, backoff_initial_s=0.1, gang=False)
ARGS = ("-c", "256", "-t", "1")  # small context, one thread: the machine is shared


class Recorder:
    """Collects ready replicas and messages from the supervisor's thread."""

    def __init__(self) -> None:
        self.ready: list[Replica] = []
        self.messages: list[str] = []
        self._cond = threading.Condition()

    def on_ready(self, replica: Replica) -> None:
        with self._cond:
            self.ready.append(replica)
            self._cond.notify_all()

    def on_message(self, text: str) -> None:
        self.messages.append(text)

    def wait_ready(self, count: int, timeout_s: float = 20.0) -> list[Replica]:
        with self._cond:
            assert self._cond.wait_for(lambda: len(self.ready) >= count, timeout_s), (
                f"{len(self.ready)} ready events, expected {count}; messages: {self.messages}"
            )
            return list(self.ready)


Start = Callable[..., tuple[LlamaServer, Recorder]]


def complete(url: str, prompt: str, *, n_predict: int = 8) -> Any:
    """``POST /completion`` to a replica, the decoded JSON answer."""
    body = json.dumps({"prompt": prompt, "n_predict": n_predict}).encode()
    request = urllib.request.Request(
        f"{url}/completion", body, {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=30) as answer:
        return json.loads(answer.read())


@pytest.fixture
def start_server(tmp_path: Path) -> Iterator[Start]:
    servers: list[LlamaServer] = []

    def start(plan: LlamaPlan, **options: Any) -> tuple[LlamaServer, Recorder]:
        recorder = Recorder()
        options = {"health": FAST, "policy": POLICY, "grace_s": 0.5, **options}
        server = LlamaServer(
            plan, dict(os.environ), logs=LogConfig(console=False),
            on_ready=recorder.on_ready, on_message=recorder.on_message,
            record_dir=tmp_path / "records", **options,
        )  # fmt: skip
        servers.append(server)
        server.start()
        return server, recorder

    yield start
    for server in servers:
        server.stop(0)


def cpu_plan(binary: str, model: Path, ports: list[int], **fields: Any) -> LlamaPlan:
    request = LlamaRequest(model=str(model), binary=binary, replicas=len(ports),
                           passthrough=ARGS, **fields)  # fmt: skip
    return make_llama_plan(request, Inventory(), dict(os.environ), build=LlamaBackend.CPU,
                           listing=None, ports=ports)  # fmt: skip


def pid_of(server: LlamaServer, name: str = "0") -> int:
    pid = next(s.pid for s in server.supervisor.status() if s.name == name)
    assert pid is not None
    return pid


def gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_two_replicas_start_answer_and_stop(
    llama_server: str, tiny_model: Path, start_server: Start
) -> None:
    request = LlamaRequest(model=str(tiny_model), binary=llama_server, replicas=2,
                           passthrough=ARGS)  # fmt: skip
    # The real binary is asked with --list-devices: a CPU build lists "(none)".
    plan = plan_llama(request, Inventory(), dict(os.environ))
    assert plan.build is LlamaBackend.CPU
    server, recorder = start_server(plan)
    urls = server.urls
    assert len(set(urls)) == 2
    assert sorted(r.url for r in recorder.wait_ready(2)) == sorted(urls)
    for replica in server.replicas:
        assert health_status(replica.host, replica.port, 2.0) == 200
    answer = complete(urls[0], "Hello", n_predict=4)
    assert answer["tokens_predicted"] == 4 and isinstance(answer["content"], str)
    pids = [pid_of(server, "0"), pid_of(server, "1")]
    server.stop()
    assert all(gone(pid) for pid in pids)


def test_kill_9_is_restarted_on_the_same_port(
    llama_server: str, tiny_model: Path, start_server: Start
) -> None:
    server, recorder = start_server(_free_plan(llama_server, tiny_model))
    (url,) = server.urls
    first = pid_of(server)
    os.kill(first, signal.SIGKILL)
    ready = recorder.wait_ready(2)
    assert ready[1].url == url
    second = pid_of(server)
    assert second != first and gone(first)
    assert health_status(ready[1].host, ready[1].port, 2.0) == 200
    assert any("SIGKILL" in m for m in recorder.messages), recorder.messages


def test_a_stopped_server_fails_liveness_and_is_replaced_well_within_the_grace(
    llama_server: str, tiny_model: Path, start_server: Start
) -> None:
    events: list[Event] = []
    # A long grace: only SIGCONT with the SIGTERM lets the stopped server go before it ends.
    server, recorder = start_server(
        _free_plan(llama_server, tiny_model), grace_s=30.0, on_event=events.append
    )
    first = pid_of(server)
    stopped_at = time.monotonic()
    os.kill(first, signal.SIGSTOP)  # still accepts connections, never answers
    ready = recorder.wait_ready(2, timeout_s=25.0)
    took_s = time.monotonic() - stopped_at
    assert took_s < 20.0, f"replaced after {took_s:.1f} s: it waited for the SIGKILL deadline"
    assert gone(first), "the stopped server must be gone"
    assert pid_of(server) != first
    assert health_status(ready[1].host, ready[1].port, 2.0) == 200
    assert any("unhealthy" in m for m in recorder.messages), recorder.messages
    (exited,) = [e for e in events if isinstance(e, Exited) and e.pid == first]
    assert exited.expected and exited.signal != "SIGKILL"  # it acted on the SIGTERM itself


def test_a_lost_port_race_moves_the_replica_to_a_free_port(
    llama_server: str, tiny_model: Path, start_server: Start
) -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        taken = holder.getsockname()[1]
        # As if bind-and-close had found `taken` free and another program took it since.
        server, recorder = start_server(cpu_plan(llama_server, tiny_model, [taken]))
        (replica,) = server.replicas
        assert replica.port != taken and not replica.port_fixed
        assert health_status(replica.host, replica.port, 2.0) == 200
        assert recorder.ready[-1].port == replica.port
        assert any(f"port {taken} was taken" in m for m in recorder.messages)


def test_a_fixed_busy_port_fails_the_start_and_leaves_nothing(
    llama_server: str, tiny_model: Path, start_server: Start
) -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        taken = holder.getsockname()[1]
        plan = cpu_plan(llama_server, tiny_model, [taken], port=taken)
        with pytest.raises(ServerStartError, match=f"port {taken} on 127.0.0.1 is already in use"):
            start_server(plan)
    assert not _llama_children()


def test_a_model_that_fails_to_load_shows_its_error(
    llama_server: str, tmp_path: Path, start_server: Start
) -> None:
    broken = tmp_path / "broken.gguf"
    broken.write_bytes(b"GGUF" + b"\0" * 64)
    with pytest.raises(ServerStartError, match="exited with code 1 before it was ready") as info:
        start_server(_free_plan(llama_server, broken))
    # The first error line of llama.cpp's log, not a generic "failed".
    assert info.value.message.endswith("gguf_init_from_reader: bad GGUF version: 0")
    assert not _llama_children()


def _free_plan(binary: str, model: Path) -> LlamaPlan:
    from xpulaunch.llamacpp.health import free_port

    return cpu_plan(binary, model, [free_port("127.0.0.1")])


def _llama_children() -> list[psutil.Process]:
    me = psutil.Process()
    return [p for p in me.children(recursive=True) if "llama-server" in p.name()]


def test_serve_llama_is_the_python_api(llama_server: str, tiny_model: Path, tmp_path: Path) -> None:
    from xpulaunch.llamacpp import serve_llama

    with serve_llama(str(tiny_model), binary=llama_server, inventory=Inventory(), args=ARGS,
                     health=FAST, logs=LogConfig(console=False),
                     record_dir=tmp_path / "records") as server:  # fmt: skip
        (replica,) = server.replicas
        assert server.urls == (replica.url,)
        assert health_status(replica.host, replica.port, 2.0) == 200
        pid = pid_of(server)
    assert gone(pid)


def test_without_restarts_a_lost_port_race_is_a_clear_error(
    llama_server: str, tiny_model: Path, start_server: Start
) -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        taken = holder.getsockname()[1]
        no_restarts = RestartPolicy(mode=RestartMode.NO, gang=False)
        with pytest.raises(ServerStartError, match=r"couldn't bind.*no restarts were requested"):
            start_server(cpu_plan(llama_server, tiny_model, [taken]), policy=no_restarts)
    assert not _llama_children()


def test_a_server_killed_while_loading_is_restarted_under_the_policy(
    llama_server: str, tiny_model: Path, start_server: Start, tmp_path: Path
) -> None:
    # The first attempt is killed from outside before it ever answers (as the OOM killer
    # would); the second loads the model. A crash of its own would still fail the start.
    wrapper = tmp_path / "llama-server-killed-once"
    wrapper.write_text(
        "#!/bin/sh\n"
        'if [ "$TORCHELASTIC_RESTART_COUNT" = 0 ]; then kill -KILL $$; fi\n'
        f'exec {llama_server} "$@"\n'
    )
    wrapper.chmod(0o755)
    server, recorder = start_server(_free_plan(str(wrapper), tiny_model))
    (ready,) = recorder.wait_ready(1)
    assert health_status(ready.host, ready.port, 2.0) == 200
    killed = [e for e in server.supervisor.events() if isinstance(e, Exited)]
    assert [e.signal for e in killed] == ["SIGKILL"]


def _held_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_another_program_answering_on_the_port_is_not_the_server(
    llama_server: str, tiny_model: Path, start_server: Start, tmp_path: Path
) -> None:
    """A program that took the replica's port answers /health with 200 before a late-binding
    llama-server (a wrapper script) gets there: the replica is not ready on it; its
    llama-server cannot bind, and moves to a free port."""
    from router_kit import Impostor, slow_binder

    binary = slow_binder(tmp_path / "bin", llama_server, delay_s=1.0)
    port = _held_port()
    with Impostor(port).listening() as other:
        server, recorder = start_server(cpu_plan(binary, tiny_model, [port]))
        (replica,) = server.replicas
        assert replica.port != port
        assert [r.port for r in recorder.ready] == [replica.port]
        assert complete(replica.url, "Hello", n_predict=2)["tokens_predicted"] == 2
        assert any(f"port {port} was taken by pid {other.pid} (" in m for m in recorder.messages)


def test_a_fixed_port_answered_by_another_program_fails_the_start_naming_it(
    llama_server: str, tiny_model: Path, start_server: Start, tmp_path: Path
) -> None:
    from router_kit import Impostor, slow_binder

    binary = slow_binder(tmp_path / "bin", llama_server, delay_s=5.0)
    port = _held_port()
    with Impostor(port).listening() as other:
        plan = cpu_plan(binary, tiny_model, [port], port=port)
        began = time.monotonic()
        with pytest.raises(ServerStartError) as raised:
            start_server(plan)
        message = raised.value.message
        assert f"127.0.0.1:{port} is held by pid {other.pid} (" in message, message
        assert "choose another --port" in message and "\n" not in message
        assert time.monotonic() - began < 5.0  # refused at the answer, not at llama's own bind
    assert not _llama_children()


def test_after_a_crash_another_program_on_the_port_is_never_the_server(
    llama_server: str, tiny_model: Path, start_server: Start, tmp_path: Path
) -> None:
    from router_kit import Impostor, slow_binder

    binary = slow_binder(tmp_path / "bin", llama_server, delay_s=1.0)
    events: list[Event] = []
    server, recorder = start_server(_free_plan(binary, tiny_model), on_event=events.append)
    (first,) = server.replicas
    with Impostor(first.port) as other:  # waits for the port
        os.kill(pid_of(server), signal.SIGKILL)
        other.listening()
        (_, again) = recorder.wait_ready(2)
        assert again.port != first.port  # moved before its own bind could fail
        assert complete(again.url, "Hello", n_predict=2)["tokens_predicted"] == 2
        said = f"port {first.port} was taken by pid {other.pid} ("
        assert any(said in m for m in recorder.messages), recorder.messages
    bind_failures = [e for e in events if isinstance(e, Exited) and e.exit_code == 1]
    assert bind_failures == []


def test_a_port_taken_while_the_started_process_lives_on_is_unhealthy_at_once(
    llama_server: str, tiny_model: Path, start_server: Start, tmp_path: Path
) -> None:
    """A wrapper that forks llama-server (its session's member holds the port: trusted) and
    outlives it: when llama-server dies and another program takes the port, the replica is
    unhealthy at the next check, not after ``failure_threshold`` of them."""
    from router_kit import Impostor

    wrapper = tmp_path / "forking-llama-server"
    wrapper.write_text(f'#!/bin/sh\n{llama_server} "$@"\nsleep 600\n')
    wrapper.chmod(0o755)
    events: list[Event] = []
    patient = HealthOptions(
        ready_timeout_s=20,
        ready_interval_s=0.1,
        interval_s=0.3,
        timeout_s=0.5,
        failure_threshold=1000,
    )
    server, recorder = start_server(
        _free_plan(str(wrapper), tiny_model), health=patient, on_event=events.append
    )
    (replica,) = server.replicas
    [child] = psutil.Process(pid_of(server)).children()
    with Impostor(replica.port) as other:
        child.kill()
        other.listening()
        wait_for(lambda: [e for e in events if isinstance(e, Unhealthy)], "the check", 10)
        [unhealthy] = [e for e in events if isinstance(e, Unhealthy)]
        assert f"is held by pid {other.pid} (" in unhealthy.reason, unhealthy
        assert any("is unhealthy" in m and f"pid {other.pid}" in m for m in recorder.messages)
