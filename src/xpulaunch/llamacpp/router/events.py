"""What the router reports about its models (``--events``, ``on_event``), besides each
replica's supervisor events, which it passes on with the model's id.

In the ``--events`` stream these are ``model_loading``, ``model_loaded``, ``model_load_failed``
and ``model_unloaded`` lines; a replica's events carry a ``model`` key.
"""

from __future__ import annotations

from dataclasses import dataclass

from xpulaunch.events import Event


@dataclass(frozen=True, slots=True)
class ModelLoading(Event):
    model: str
    devices: tuple[str, ...]  # labels of the leased devices (empty: the CPU)
    evicted: tuple[str, ...]  # models unloaded to make room


@dataclass(frozen=True, slots=True)
class ModelLoaded(Event):
    model: str
    urls: tuple[str, ...]
    load_s: float


@dataclass(frozen=True, slots=True)
class ModelLoadFailed(Event):
    model: str
    reason: str


@dataclass(frozen=True, slots=True)
class ModelUnloaded(Event):
    """``reason``: ``ttl``, ``evicted`` (for ``by``), ``request`` (``/models/unload``),
    ``failed`` (every replica gave up) or ``stop`` (the router stops)."""

    model: str
    reason: str
    by: str | None = None
