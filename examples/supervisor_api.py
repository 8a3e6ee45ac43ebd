"""The Supervisor from Python: two small HTTP servers with readiness probes and restarts.

    python examples/supervisor_api.py

Each server is ``python -m http.server`` on a port chosen by ``prepare`` before every start
(a restarted server gets a fresh port, as a llama-server would after a failed bind). The
readiness probe polls it until it answers; then one server is killed from outside, and the
supervisor restarts just that one (independent restarts, no gang), waits for it to be ready
again, and finally stops everything.
"""

from __future__ import annotations

import os
import signal
import socket
import sys
import urllib.request
from dataclasses import replace

from xpulaunch import (
    Event,
    Exited,
    HealthCheck,
    LogConfig,
    Ready,
    Restarting,
    RestartPolicy,
    Supervisor,
    WorkerSpec,
)

ports: dict[str, int] = {}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def http_ok(name: str) -> bool:
    with urllib.request.urlopen(f"http://127.0.0.1:{ports[name]}/", timeout=1) as response:
        return response.status == 200


def server(name: str) -> WorkerSpec:
    base = WorkerSpec(name, [], env=dict(os.environ))

    def prepare(attempt: int) -> WorkerSpec:
        ports[name] = free_port()
        argv = [sys.executable, "-m", "http.server", str(ports[name]), "--bind", "127.0.0.1"]
        return replace(base, argv=argv)

    probe = HealthCheck(lambda: http_ok(name), interval_s=0.2, timeout_s=1.0, start_deadline_s=30)
    return replace(base, argv=["(set by prepare)"], readiness=probe, prepare=prepare)


def report(event: Event) -> None:
    if isinstance(event, (Ready, Exited, Restarting)):
        print(f"event: {event}", flush=True)


def main() -> int:
    policy = RestartPolicy(max_restarts=3, backoff_initial_s=0.2, gang=False)
    logs = LogConfig(console=False)  # keep the servers' access logs off the console
    with Supervisor([server("a"), server("b")], policy, logs=logs, on_event=report) as sup:
        if not sup.wait_ready(timeout=60):
            print("servers did not become ready:", sup.tail("a"), sup.tail("b"))
            return 1
        for status in sup.status():
            print(f"{status.name}: {status.state.value} pid {status.pid} port {ports[status.name]}")
        victim = next(s for s in sup.status() if s.name == "a")
        assert victim.pid is not None
        os.kill(victim.pid, signal.SIGKILL)  # a crash the supervisor did not ask for
        print("killed server a; waiting for its restart", flush=True)
        while next(s for s in sup.status() if s.name == "a").restarts == 0:
            sup.wait(timeout=0.1)
        if not sup.wait_ready(timeout=60):
            return 1
        restarted = next(s for s in sup.status() if s.name == "a")
        print(f"a: {restarted.state.value} again, restarts {restarted.restarts}, "
              f"port {ports['a']}")  # fmt: skip
        status = sup.stop()
    print(f"stopped, exit status {status}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
