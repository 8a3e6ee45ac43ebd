"""``xpulaunch llama --metrics-port``: the supervisor's metrics plus every replica's own.

Each replica runs with llama-server's ``--metrics`` and its ``/metrics`` text is fetched at
scrape time, parsed and relabelled with ``model`` and ``replica`` (each family declared once
for every replica), so one scrape target covers every replica (llama-swap users ask for
this: mostlygeek/llama-swap#262). A replica that does not answer (loading, restarting) is
left out of that scrape and counted in ``xpulaunch_replica_scrape_ok``.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator

from xpulaunch.joblog.metrics import JobCounters, MetricsServer
from xpulaunch.joblog.prometheus import Relabelled, Sample, relabel, render, render_relabelled
from xpulaunch.llamacpp.health import fetch_metrics
from xpulaunch.llamacpp.plan import LlamaPlan
from xpulaunch.llamacpp.server import LlamaServer

__all__ = ["JobCounters", "replica_metrics", "serving_metrics"]

SCRAPE_TIMEOUT_S = 2.0


def replica_metrics(server: LlamaServer, model: str) -> Callable[[], list[str]]:
    def scrape() -> list[str]:
        sources: list[list[Relabelled]] = []
        ok: list[Sample] = []
        for replica in server.replicas:
            labels = (("model", model), ("replica", replica.name))
            try:
                sources.append(relabel(fetch_metrics(replica.url, SCRAPE_TIMEOUT_S), labels))
                up = 1.0
            except (OSError, ValueError):
                up = 0.0
            ok.append(((("replica", replica.name),), up))
        help_text = "1 when the replica's own /metrics answered this scrape"
        family = ("xpulaunch_replica_scrape_ok", "gauge", help_text, ok)
        return [*render([family]).splitlines(), *render_relabelled(sources).splitlines()]

    return scrape


@contextlib.contextmanager
def serving_metrics(
    server: LlamaServer,
    plan: LlamaPlan,
    model: str,
    *,
    host: str,
    port: int | None,
    counters: JobCounters | None = None,
) -> Iterator[MetricsServer | None]:
    """Serve the metrics while the body runs (nothing without a ``port``); ``counters``
    must get the server's events (``LlamaServer(on_event=counters.on_event)``)."""
    if port is None:
        yield None
        return
    metrics = MetricsServer(
        server.supervisor,
        plan.plan,
        host=host,
        port=port,
        extra=replica_metrics(server, os.path.basename(model)),
        counters=counters,
    )
    server.supervisor.message(f"metrics on http://{host}:{metrics.port}/metrics")
    try:
        yield metrics
    finally:
        metrics.close()
