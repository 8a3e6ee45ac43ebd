"""What every model of one router shares (:class:`Setup`), and the ``xpulaunch llama``
request each model is (:func:`model_request`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from xpulaunch.llamacpp.plan import LlamaRequest
from xpulaunch.llamacpp.server import HealthOptions
from xpulaunch.model import Inventory
from xpulaunch.supervisor.restart import RestartPolicy

if TYPE_CHECKING:
    from xpulaunch.llamacpp.devices import LlamaBackend
    from xpulaunch.llamacpp.router.config import ModelConfig


@dataclass(frozen=True, slots=True)
class Setup:
    """What every model of one router shares."""

    inventory: Inventory
    parent_env: Mapping[str, str]
    health: HealthOptions
    policy: RestartPolicy
    binary: str | None = None
    llama_backend: LlamaBackend | None = None
    backend: str | None = None
    lock_dir: str | None = None
    grace_s: float = 10.0
    log_dir: str | None = None
    record_dir: str | None = None
    # Probe the host again before each placement (the inventory is this host's, not a file):
    # other programs come and go on the GPUs while a router runs for days.
    reprobe: bool = False


def model_request(model: ModelConfig, setup: Setup) -> LlamaRequest:
    """What ``xpulaunch llama`` would be asked for this model (free ports, 127.0.0.1)."""
    return LlamaRequest(
        model=model.model, replicas=model.replicas, binary=setup.binary or "llama-server",
        llama_backend=setup.llama_backend, passthrough=_server_args(model), gpus=model.gpus,
        backend=setup.backend, topology=model.topology,
    )  # fmt: skip


def _server_args(model: ModelConfig) -> tuple[str, ...]:
    """The model's args, plus llama-server's own ``/metrics`` (which the router's relabels)
    and ``--alias ID`` (answers then name the model as the client did), unless given."""
    args = model.args
    extra: tuple[str, ...] = () if "--metrics" in args else ("--metrics",)
    if not {"-a", "--alias"} & set(args):
        extra += ("--alias", model.id)
    return (*args, *extra)
