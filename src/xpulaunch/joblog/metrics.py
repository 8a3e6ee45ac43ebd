"""``--metrics-port``: the job's state as Prometheus text, for a dashboard to scrape.

``GET /metrics`` answers the text exposition format (version 0.0.4): workers up, restarts and
exits by worker, hangs, lease wait, and for each of the job's devices its memory and
utilisation, re-probed every ``interval_s`` by ``xpulaunch devices --json`` in a child
process (so no GPU library is ever loaded into the supervisor). Extra sources (a llama
replica's own ``/metrics``) are fetched at scrape time and relabelled.

No metrics library: the format is a few lines of text (:mod:`xpulaunch.joblog.prometheus`);
the tests parse what is served with ``prometheus_client``'s parser.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Protocol

from xpulaunch.errors import UsageError
from xpulaunch.events import Event, Exited, HangDetected, LeaseAcquired
from xpulaunch.joblog.prometheus import CONTENT_TYPE, Family, Labels, Sample, render

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping, Sequence

    from xpulaunch.events import WorkerStatus
    from xpulaunch.model import Plan

PROBE_TIMEOUT_S = 60.0


class StatusSource(Protocol):
    """Whose workers are counted (a :class:`~xpulaunch.supervisor.supervisor.Supervisor`)."""

    def status(self) -> list[WorkerStatus]: ...


class JobCounters:
    """What the events say that statuses do not: exits by code, hangs, lease wait."""

    def __init__(self) -> None:
        self.exits: Counter[tuple[str, str]] = Counter()
        self.hangs: Counter[str] = Counter()
        self.lease_wait_s: float | None = None

    def on_event(self, event: Event) -> None:
        if isinstance(event, Exited):
            self.exits[(event.name, str(event.exit_code))] += 1
        elif isinstance(event, HangDetected):
            self.hangs[event.name] += 1
        elif isinstance(event, LeaseAcquired):
            self.lease_wait_s = event.waited_s


def job_families(supervisor: StatusSource, counters: JobCounters) -> list[Family]:
    statuses = supervisor.status()
    up: list[Sample] = [(_worker(s.name), 1.0 if s.pid is not None else 0.0) for s in statuses]
    restarts: list[Sample] = [(_worker(s.name), float(s.restarts)) for s in statuses]
    exits: list[Sample] = [
        ((*_worker(w), ("code", c)), float(n)) for (w, c), n in counters.exits.items()
    ]
    hangs: list[Sample] = [(_worker(w), float(n)) for w, n in counters.hangs.items()]
    wait: list[Sample] = [((), counters.lease_wait_s)] if counters.lease_wait_s is not None else []
    return [
        ("xpulaunch_worker_up", "gauge", "1 while the worker's process runs", up),
        ("xpulaunch_worker_restarts_total", "counter", "Restarts of the worker", restarts),
        ("xpulaunch_worker_exits_total", "counter", "Exits of the worker by exit status", exits),
        ("xpulaunch_worker_hangs_total", "counter", "Hangs detected (--hang-timeout)", hangs),
        ("xpulaunch_lease_wait_seconds", "gauge", "Time waited in line for the devices", wait),
    ]


def _worker(name: str) -> Labels:
    return (("worker", name),)


def device_families(devices: Sequence[Mapping[str, object]]) -> list[Family]:
    """Memory and utilisation of the job's devices (inventory document entries); unknown
    values (null) are left out, never reported as 0."""
    fields = (
        ("xpulaunch_device_memory_used_bytes", "memory_used_bytes", "Device memory in use"),
        ("xpulaunch_device_memory_total_bytes", "memory_total_bytes", "Device memory in all"),
        ("xpulaunch_device_utilization_percent", "utilization_percent", "Device utilisation"),
    )
    families: list[Family] = []
    for name, key, help_text in fields:
        samples = [
            (_device_labels(d), float(value))
            for d in devices
            if isinstance(value := d.get(key), int | float)
        ]
        families.append((name, "gauge", help_text, samples))
    return families


def _device_labels(device: Mapping[str, object]) -> Labels:
    return (
        ("vendor", str(device.get("vendor"))),
        ("index", str(device.get("index"))),
        ("pci_bus_id", str(device.get("pci_bus_id") or "")),
    )


def probe_devices(env: Mapping[str, str] | None = None) -> list[dict[str, object]]:
    """The host's devices, from ``xpulaunch devices --json`` run in a child process."""
    argv = [sys.executable, "-m", "xpulaunch", "devices", "--json"]
    try:
        done = subprocess.run(
            argv, capture_output=True, timeout=PROBE_TIMEOUT_S, env=env, check=False
        )
        devices = json.loads(done.stdout).get("devices", [])
    except (OSError, subprocess.TimeoutExpired, ValueError, AttributeError):
        return []
    return [d for d in devices if isinstance(d, dict)]


def planned(plan: Plan, devices: Sequence[dict[str, object]]) -> list[dict[str, object]]:
    """The probed devices that the plan uses (by PCI address, else UUID, else index)."""
    keys = {(u.device.pci_bus_id, u.device.uuid, u.device.index) for u in plan.devices}

    def used(d: Mapping[str, object]) -> bool:
        return any(
            (pci and d.get("pci_bus_id") == pci)
            or (uuid and d.get("uuid") == uuid)
            or (not pci and not uuid and d.get("index") == index)
            for pci, uuid, index in keys
        )

    return [d for d in devices if used(d)]


class MetricsServer:
    """Serves ``/metrics`` on ``host:port`` from a daemon thread until :meth:`close`."""

    def __init__(
        self,
        supervisor: StatusSource,
        plan: Plan,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        interval_s: float = 10.0,
        probe: Callable[[], list[dict[str, object]]] = probe_devices,
        extra: Callable[[], list[str]] | None = None,
        counters: JobCounters | None = None,
    ) -> None:
        self.counters = counters or JobCounters()
        self._supervisor, self._plan, self._probe, self._extra = supervisor, plan, probe, extra
        self._devices: list[dict[str, object]] = []
        self._closed = threading.Event()
        self._interval_s = interval_s
        try:
            self.server = ThreadingHTTPServer((host, port), _handler(self.text))
        except OSError as exc:
            raise UsageError(
                f"--metrics-port {port}: cannot listen on {host}:{port} ({exc.strerror}); "
                "choose a free port"
            ) from exc
        self.server.daemon_threads = True
        self.port: int = self.server.server_address[1]
        threading.Thread(
            target=self.server.serve_forever, name="xpulaunch-metrics", daemon=True
        ).start()
        if plan.devices:
            threading.Thread(
                target=self._reprobe, name="xpulaunch-metrics-probe", daemon=True
            ).start()

    def on_event(self, event: Event) -> None:
        self.counters.on_event(event)

    def _reprobe(self) -> None:
        while not self._closed.is_set():
            self._devices = planned(self._plan, self._probe())
            self._closed.wait(self._interval_s)

    def text(self) -> str:
        families = job_families(self._supervisor, self.counters)
        body = render([*families, *device_families(self._devices)])
        if self._extra is not None:
            body += "".join(line + "\n" for line in self._extra())
        return body

    def close(self) -> None:
        self._closed.set()
        self.server.shutdown()
        self.server.server_close()


def _handler(text: Callable[[], str]) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path.split("?")[0] not in ("/metrics", "/"):
                self.send_error(404, "only /metrics is served here")
                return
            body = text().encode()
            self.send_response(200)
            self.send_header("Content-Type", CONTENT_TYPE)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            return  # a scrape every few seconds is not news for the job's console

    return Handler
