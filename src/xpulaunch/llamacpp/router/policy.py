"""The router's decisions: which idle model to unload (ttl), which to evict to make room, and
which replica answers next. Pure: the state comes as snapshots and the clock as a number.

Eviction order (when a model cannot be placed): models idle past their ``ttl`` first (they
would go soon anyway), then the least recently used. Never a ``pinned`` model, never one with
requests in flight or waiting, never one that is loading; and only models of this router:
another job's lease (a training run) is never taken.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from enum import Enum

from xpulaunch.model import Device, Inventory


class ModelState(str, Enum):
    UNLOADED = "unloaded"
    LOADING = "loading"
    READY = "ready"
    UNLOADING = "unloading"


@dataclass(frozen=True, slots=True)
class ModelView:
    """What the decisions need of one model. ``in_flight`` counts requests being answered
    and those waiting for its load."""

    id: str
    state: ModelState
    pinned: bool = False
    ttl_s: float = 0.0
    in_flight: int = 0
    last_used_s: float = 0.0

    @property
    def idle(self) -> bool:
        return self.state is ModelState.READY and self.in_flight == 0

    def expires_at(self) -> float | None:
        """When an idle model's ttl runs out (None: no ttl, or not idle)."""
        if self.ttl_s <= 0 or not self.idle:
            return None
        return self.last_used_s + self.ttl_s


def expired(views: Sequence[ModelView], now_s: float) -> list[str]:
    """Idle models whose ttl has run out, oldest first."""
    due = [(at, v.id) for v in views if (at := v.expires_at()) is not None and at <= now_s]
    return [model for _, model in sorted(due)]


def next_expiry(views: Sequence[ModelView]) -> float | None:
    """The earliest time a ttl runs out (None: none will)."""
    times = [at for v in views if (at := v.expires_at()) is not None]
    return min(times) if times else None


def eviction_order(views: Sequence[ModelView], now_s: float, *, exclude: str) -> list[str]:
    """Models that may be evicted for ``exclude``, in the order they would be."""
    candidates = [v for v in views if v.idle and not v.pinned and v.id != exclude]

    def key(view: ModelView) -> tuple[bool, float]:
        at = view.expires_at()
        return (not (at is not None and at <= now_s), view.last_used_s)

    return [v.id for v in sorted(candidates, key=key)]


class Outcome(str, Enum):
    """How a placement attempt ends: every replica holds the model, some only partly (a build
    with ``--fit`` keeps the rest on the CPU), or no plan at all (no free device)."""

    FITS = "fits"
    PARTIAL = "partial"
    NONE = "none"


def choose_evictions(
    attempt: Callable[[frozenset[str]], Outcome], order: Sequence[str]
) -> tuple[str, ...] | None:
    """The fewest models to evict, taken from the front of ``order``, so that
    ``attempt(evicted)`` fits; else so that it places at all. ``()``: none needed; None:
    nothing in ``order`` makes room."""
    now = attempt(frozenset())
    if now is Outcome.FITS:
        return ()
    found = _first_prefix(attempt, order, Outcome.FITS)
    if found is not None:
        return found
    if now is Outcome.PARTIAL:
        return ()  # evicting cannot make it fit: keep what runs
    return _first_prefix(attempt, order, Outcome.PARTIAL)


def _first_prefix(
    attempt: Callable[[frozenset[str]], Outcome], order: Sequence[str], wanted: Outcome
) -> tuple[str, ...] | None:
    for end in range(1, len(order) + 1):
        if attempt(frozenset(order[:end])) is wanted:
            return _pruned(attempt, list(order[:end]), wanted)
    return None


def _pruned(
    attempt: Callable[[frozenset[str]], Outcome], chosen: list[str], wanted: Outcome
) -> tuple[str, ...]:
    """``chosen`` without the models whose eviction does not help (a model on a device the
    new one cannot use), most recently used first."""
    for model in reversed(list(chosen)):
        rest = [m for m in chosen if m != model]
        if attempt(frozenset(rest)) is wanted:
            chosen = rest
    return tuple(chosen)


def next_replica(up: Sequence[bool], turn: int) -> int | None:
    """Round robin: the first replica that is up at or after ``turn`` (None: none is up)."""
    count = len(up)
    for step in range(count):
        index = (turn + step) % count
        if up[index]:
            return index
    return None


def with_readings(inventory: Inventory, readings: Mapping[str, Device]) -> Inventory:
    """``inventory`` with the devices in ``readings`` (by key) as they were then: a device
    that one of the router's own models holds shows that model's memory in a fresh probe, and
    would look busy to a plan that considers evicting the model."""
    if not readings:
        return inventory
    devices = tuple(readings.get(d.key, d) for d in inventory.devices)
    return replace(inventory, devices=devices)


def no_room(model: str, reason: str, views: Sequence[ModelView]) -> str:
    """Why ``model`` cannot be placed: the planner's ``reason``, and the loaded models that
    could not make room (busy, pinned, loading)."""
    others = [v for v in views if v.id != model]
    ready = [v for v in others if v.state is ModelState.READY]
    groups = (
        ("busy", [f"{v.id} ({v.in_flight} request(s) in flight)" for v in ready if v.in_flight]),
        ("pinned", [v.id for v in ready if v.pinned]),
        ("loading", [v.id for v in others if v.state is ModelState.LOADING]),
    )
    parts = [f"{name}: {', '.join(ids)}" for name, ids in groups if ids]
    held = f"; no loaded model can make room ({'; '.join(parts)})" if parts else ""
    return f"model {model} cannot be placed: {reason}{held}"
