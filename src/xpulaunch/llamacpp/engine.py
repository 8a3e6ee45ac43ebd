"""Servers other than llama-server behind the model router: a model's ``cmd`` (vLLM, SGLang,
whisper.cpp's server, a TEI embedder, anything that speaks OpenAI's HTTP API). Pure.

An engine is a command line with ``${PORT}`` and ``${MODEL}`` in it, and the path that says
it is ready. The router plans its devices as for llama-server (the shared planner writes the
masks of the devices' vendor into each replica's environment), leases them, and supervises
the replicas as :class:`~xpulaunch.llamacpp.server.LlamaServer` does llama-server's; only the
command line and the readiness path differ.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from xpulaunch.core.plan import LaunchRequest
from xpulaunch.core.selection import GpuMode, parse_gpus
from xpulaunch.core.units import format_bytes
from xpulaunch.errors import UsageError
from xpulaunch.llamacpp.devices import LlamaBackend
from xpulaunch.llamacpp.fit import Estimate
from xpulaunch.llamacpp.placement import plan_replicas
from xpulaunch.llamacpp.plan import LlamaPlan, LlamaRequest, Replica
from xpulaunch.model import Backend, Inventory

PORT, MODEL = "${PORT}", "${MODEL}"
# /health first (vLLM, SGLang, TEI, llama-server); an engine without it answers 404 there,
# and then /v1/models says it is up (what every OpenAI-compatible server has).
DEFAULT_CHECKS = ("/health", "/v1/models")
NO_CHECK = "none"  # llama-swap's checkEndpoint: none
_DEVICE_MAP_VARS = frozenset({"XPULAUNCH_DEVICE_MAP", "XPULAUNCH_MAX_MEMORY"})
# Which build's habits (the CUDA settle after a crash, the replica words) a plan's backend has.
_BUILD = {
    Backend.CUDA: LlamaBackend.CUDA,
    Backend.XPU: LlamaBackend.SYCL,
    Backend.ROCM: LlamaBackend.ROCM,
    Backend.CPU: LlamaBackend.CPU,
}


@dataclass(frozen=True, slots=True)
class Engine:
    """A model's own server: ``cmd`` with ``${PORT}``/``${MODEL}`` in it, ``model`` the
    text ``${MODEL}`` stands for, ``check`` the readiness path (None: :data:`DEFAULT_CHECKS`)."""

    cmd: tuple[str, ...]
    model: str
    check: str | None = None

    @property
    def name(self) -> str:
        """How messages name it: the program's file name (``vllm``, ``python``)."""
        return self.cmd[0].rsplit("/", 1)[-1]

    @property
    def checks(self) -> tuple[str, ...]:
        """The paths to ask, in turn; none (``check = "none"``): ready once its port
        accepts a connection."""
        if self.check == NO_CHECK:
            return ()
        return DEFAULT_CHECKS if self.check is None else (self.check,)

    def argv(self, port: int) -> tuple[str, ...]:
        """The command line for a replica on ``port``."""
        return tuple(a.replace(PORT, str(port)).replace(MODEL, self.model) for a in self.cmd)


def split_cmd(value: object, where: str) -> tuple[str, ...]:
    """A ``cmd`` as a list of strings, or one string split as a shell would (no shell runs
    it: no pipes, no ``$VAR`` but ``${PORT}`` and ``${MODEL}``)."""
    if isinstance(value, str):
        try:
            words = shlex.split(value)
        except ValueError as exc:  # an unclosed quote
            raise UsageError(f"{where}: cannot be split into words ({exc})") from None
    elif isinstance(value, list) and all(isinstance(v, str) for v in value):
        words = list(value)
    else:
        raise UsageError(f'{where}: expected a list of strings, e.g. ["vllm", "serve", ...]')
    if not words or not words[0].strip():
        raise UsageError(f"{where}: empty; expected the engine's command line")
    if any("\0" in w for w in words):
        raise UsageError(f"{where}: a word holds a NUL character")
    if not any(PORT in w for w in words):
        raise UsageError(
            f"{where}: no {PORT}; the router chooses the port each replica listens on, "
            f'e.g. "--port", "{PORT}"'
        )
    return tuple(words)


def check_path(value: object, where: str) -> str:
    if value == NO_CHECK:
        return NO_CHECK
    if not isinstance(value, str) or not value.startswith("/") or any(c.isspace() for c in value):
        raise UsageError(f'{where}: expected a path such as "/health", or "none", got {value!r}')
    return value


def plan_engine(
    engine: Engine,
    request: LlamaRequest,
    estimate: Estimate | None,
    inventory: Inventory,
    parent_env: Mapping[str, str],
    *,
    ports: Sequence[int],
    unavailable: Mapping[str, str] | None,
) -> LlamaPlan:
    """Plan ``request.replicas`` engine servers on disjoint devices, each with the masks of
    its devices' vendor, as for a llama-server of that vendor's build."""
    gpus, notes = request.gpus, []
    if estimate is None and parse_gpus(gpus).mode is GpuMode.AUTO and inventory.devices:
        # Nothing says how much it needs (vLLM takes a share of the whole card by itself):
        # one whole device per replica, not every free one.
        gpus = str(request.replicas)
        notes.append(
            "gpus auto without memory: one whole device per replica "
            '(memory = "6GiB" lets it share one; gpus = "N" gives it more)'
        )
    launch = LaunchRequest(
        argv=(engine.cmd[0],),
        gpus=gpus,
        backend=request.backend,
        isolate=True,
        distributed=False,  # a replica is not a rank (as for llama-server)
        share=request.share,  # its memory, packed beside other models (the router's)
    )
    placed = plan_replicas(
        launch,
        request.replicas,
        inventory,
        parent_env,
        unavailable=unavailable,
        estimate=estimate,
        margin_bytes=0,  # the memory given is the engine's whole share
    )
    plan = placed.plan
    workers, replicas = [], []
    notes += placed.notes
    if estimate is not None:
        memory = format_bytes(estimate.weights_bytes)
        notes.insert(0, f"{engine.name} needs {memory} (its memory in models.toml)")
    for worker, port in zip(plan.workers, ports, strict=True):
        replica = Replica(worker.name, request.host, port, False, ())
        env = {k: v for k, v in worker.env.items() if k not in _DEVICE_MAP_VARS}
        workers.append(replace(worker, argv=engine.argv(port), env=env))
        replicas.append(replica)
        where = ", ".join(plan.devices[i].label() for i in worker.units) or "the CPU"
        notes.append(f"replica {worker.name}: {replica.url} ({engine.name}) on {where}")
    # The planner speaks of workers and --isolate; these are servers, each on its devices.
    shared = [n for n in plan.notes if not n.startswith("visibility: ")]
    if plan.devices:
        shared.append("visibility: each replica sees only its own devices, numbered from 0")
    final = replace(plan, workers=tuple(workers), notes=(*shared, *notes), device_map=None)
    build = _BUILD.get(plan.backend, LlamaBackend.CPU)
    return LlamaPlan(final, tuple(replicas), build, estimate, placed.fits)


def memory_estimate(memory_bytes: int | None) -> Estimate | None:
    """What a model's ``memory`` says it needs, as the placement reads an estimate."""
    if memory_bytes is None:
        return None
    return Estimate(memory_bytes, 0, 0, None, "memory in models.toml")
