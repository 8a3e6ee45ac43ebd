"""``GET /metrics`` of the router: each model's and replica's state and traffic, and every
ready replica's own llama-server metrics relabelled with ``model`` and ``replica``.

A replica's ``/metrics`` (llama-server runs with ``--metrics``) is fetched at scrape time,
all of them at once, each within :data:`SCRAPE_TIMEOUT_S`; one that does not answer is
counted in ``xpulaunch_replica_scrape_ok`` and left out of that scrape.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

import aiohttp

from xpulaunch.joblog.prometheus import (
    Family,
    Relabelled,
    Sample,
    relabel,
    render,
    render_relabelled,
)
from xpulaunch.llamacpp.router.policy import ModelState

if TYPE_CHECKING:
    from collections.abc import Iterable

    from xpulaunch.llamacpp.plan import Replica
    from xpulaunch.llamacpp.router.slot import Slot

SCRAPE_TIMEOUT_S = 2.0


def model_families(slots: Iterable[Slot]) -> list[Family]:
    loaded: list[Sample] = []
    in_flight: list[Sample] = []
    loads: list[Sample] = []
    failures: list[Sample] = []
    load_s: list[Sample] = []
    unloads: list[Sample] = []
    requests: list[Sample] = []
    seconds: list[Sample] = []
    up: list[Sample] = []
    restarts: list[Sample] = []
    for slot in slots:
        model = (("model", slot.id),)
        counters = slot.counters
        loaded.append((model, 1.0 if slot.state is ModelState.READY else 0.0))
        in_flight.append((model, float(slot.in_flight)))
        loads.append((model, float(counters.loads)))
        failures.append((model, float(counters.load_failures)))
        if counters.last_load_s is not None:
            load_s.append((model, counters.last_load_s))
        unloads += [((*model, ("reason", r)), float(n)) for r, n in counters.unloads.items()]
        requests += [
            ((*model, ("replica", replica), ("code", str(code))), float(n))
            for (replica, code), n in sorted(counters.requests.items())
        ]
        seconds.append((model, counters.request_seconds))
        up += [
            ((*model, ("replica", r.name)), 1.0 if slot.up.get(r.name) else 0.0)
            for r in slot.replicas
        ]
        if slot.server is not None:
            restarts += [
                ((*model, ("replica", s.name)), float(s.restarts))
                for s in slot.server.supervisor.status()
            ]
    return [
        ("xpulaunch_model_loaded", "gauge", "1 while the model's servers are loaded", loaded),
        (
            "xpulaunch_model_requests_in_flight",
            "gauge",
            "Requests being answered or waiting for the model's load",
            in_flight,
        ),
        ("xpulaunch_model_loads_total", "counter", "Loads of the model that succeeded", loads),
        (
            "xpulaunch_model_load_failures_total",
            "counter",
            "Loads of the model that failed or found no room",
            failures,
        ),
        ("xpulaunch_model_load_seconds", "gauge", "How long the last load took", load_s),
        (
            "xpulaunch_model_unloads_total",
            "counter",
            "Unloads of the model by reason (ttl, evicted, request, failed, stop)",
            unloads,
        ),
        (
            "xpulaunch_requests_total",
            "counter",
            "Requests by model, replica and HTTP status (499: the client left)",
            requests,
        ),
        (
            "xpulaunch_request_seconds_total",
            "counter",
            "Seconds spent answering the model's requests, loads included",
            seconds,
        ),
        ("xpulaunch_replica_up", "gauge", "1 while the replica answers", up),
        ("xpulaunch_replica_restarts_total", "counter", "Restarts of the replica", restarts),
    ]


async def scrape(session: aiohttp.ClientSession, slots: Iterable[Slot]) -> str:
    """The router's families and every ready replica's own, as one exposition."""
    ready = [s for s in slots if s.state is ModelState.READY]
    targets = [(slot, replica) for slot in ready for replica in slot.replicas]
    results = await asyncio.gather(*(_one(session, s, r) for s, r in targets))
    ok: list[Sample] = [
        ((("model", slot.id), ("replica", replica.name)), float(families is not None))
        for (slot, replica), families in zip(targets, results, strict=True)
    ]
    sources = [families for families in results if families is not None]
    ours = [
        *model_families(slots),
        (
            "xpulaunch_replica_scrape_ok",
            "gauge",
            "1 when the replica's own /metrics answered this scrape",
            ok,
        ),
    ]
    return render(ours) + render_relabelled(sources)


async def _one(
    session: aiohttp.ClientSession, slot: Slot, replica: Replica
) -> list[Relabelled] | None:
    timeout = aiohttp.ClientTimeout(total=SCRAPE_TIMEOUT_S)
    try:
        async with session.get(f"{replica.url}/metrics", timeout=timeout) as answer:
            if answer.status != 200:
                return None
            text = await answer.text()
    except (aiohttp.ClientError, asyncio.TimeoutError):
        return None
    try:
        return relabel(text, (("model", slot.id), ("replica", replica.name)))
    except ValueError:
        return None
