"""``plan_llama`` and ``serve_llama``: what ``xpulaunch llama`` does, as Python calls::

from xpulaunch.llamacpp import serve_llama
with serve_llama("model.gguf", replicas=2, gpus="2") as server:
    print(server.urls)          # every replica answers /health with 200 here
    server.wait()               # supervised (restarted) until stopped
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from xpulaunch.core.backend import parse_backend
from xpulaunch.errors import UsageError
from xpulaunch.llamacpp import args as llama_args
from xpulaunch.llamacpp.binary import resolve_binary, which_build
from xpulaunch.llamacpp.devices import DeviceList, LlamaBackend, parse_llama_backend
from xpulaunch.llamacpp.health import free_port
from xpulaunch.llamacpp.plan import LlamaPlan, LlamaRequest, effective_model, make_llama_plan
from xpulaunch.model import Inventory

if TYPE_CHECKING:
    from xpulaunch.llamacpp.server import LlamaServer


def check_model(path: str, *, must_exist: bool) -> str | None:
    """Raise a one-line :class:`UsageError` for a model file that cannot be read (a note
    instead when ``must_exist`` is False: a dry run for another machine)."""
    model = Path(path)
    if model.is_file() and os.access(model, os.R_OK):
        return None
    problem = "no such file"
    if model.is_dir():
        problem = "is a directory"
    elif model.exists():
        problem = "cannot be read"
    if must_exist:
        raise UsageError(
            f"{problem}; expected the path of a .gguf file", option="model", value=path
        )
    return f"model {path}: {problem} here"


def choose_ports(request: LlamaRequest) -> list[int]:
    """One port per replica: ``--port P`` gives P, P+1, ...; otherwise free ports now."""
    count = request.replicas
    if llama_args.passthrough_value(request.passthrough, "port") is not None:
        return [0] * count  # the user's port wins (make_llama_plan reads it)
    if request.port is not None:
        last = request.port + count - 1
        if request.port < 1 or last > 65535:
            raise UsageError(
                f"{count} replica(s) need ports {request.port}-{last}; "
                "expected ports from 1 to 65535",
                option="port",
                value=request.port,
            )
        return list(range(request.port, last + 1))
    ports: list[int] = []
    for _ in range(count):
        ports.append(free_port(request.host, exclude=ports))
    return ports


@dataclass(frozen=True, slots=True)
class LlamaBuild:
    """What the binary is, asked once (:func:`ask_binary`) before any device is leased."""

    request: LlamaRequest  # with the binary's resolved path
    build: LlamaBackend
    listing: DeviceList | None
    notes: tuple[str, ...]


def ask_binary(
    request: LlamaRequest, parent_env: Mapping[str, str], *, dry_run: bool = False
) -> LlamaBuild:
    """Resolve the binary and its build (asking it with ``--list-devices`` when needed) and
    check the model: the slow part of planning (a SYCL or ROCm runtime can take many seconds
    to list its devices), done before the lock directory's lock is taken, never under it."""
    binary, missing = resolve_binary(request.binary, parent_env, must_exist=not dry_run)
    notes = [missing] if missing else []
    model = effective_model(request, parent_env)
    if model is not None:
        note = check_model(model, must_exist=not dry_run)
        notes += [note] if note else []
    wanted = parse_backend(request.backend)
    found = missing is None
    build, listing, build_notes = which_build(
        binary, found, request.llama_backend, wanted, parent_env
    )
    return LlamaBuild(replace(request, binary=binary), build, listing, (*build_notes, *notes))


def plan_for_build(
    asked: LlamaBuild,
    inventory: Inventory,
    parent_env: Mapping[str, str],
    *,
    unavailable: Mapping[str, str] | None = None,
) -> LlamaPlan:
    """The ports and the devices of every replica, for a binary already asked: quick, so it
    may run under the lock directory's lock."""
    return make_llama_plan(
        asked.request, inventory, parent_env, build=asked.build, listing=asked.listing,
        ports=choose_ports(asked.request), build_notes=list(asked.notes),
        unavailable=unavailable,
    )  # fmt: skip


def plan_llama(
    request: LlamaRequest,
    inventory: Inventory,
    parent_env: Mapping[str, str],
    *,
    dry_run: bool = False,
    unavailable: Mapping[str, str] | None = None,
) -> LlamaPlan:
    """Resolve the binary and its build (asking it with ``--list-devices`` when needed), the
    model, the ports and the devices of every replica. A dry run tolerates a missing binary
    or model (with a note) when the build is given."""
    asked = ask_binary(request, parent_env, dry_run=dry_run)
    return plan_for_build(asked, inventory, parent_env, unavailable=unavailable)


def cuda_settle(plan: LlamaPlan) -> Any | None:
    """On CUDA, wait for a dead replica's VRAM to be freed before its restart (the driver frees
    it after the process exits); the same NVML hook ``xpulaunch run`` uses (None elsewhere)."""
    from xpulaunch.launch.gpu_settle import gpu_settle

    return gpu_settle(plan.plan)


def serve_llama(
    model: str | None,
    *,
    replicas: int = 1,
    gpus: str = "auto",
    backend: str | None = None,
    host: str = "127.0.0.1",
    port: int | None = None,
    binary: str | None = None,
    llama_backend: LlamaBackend | str | None = None,
    args: Sequence[str] = (),
    inventory: Inventory | None = None,
    parent_env: Mapping[str, str] | None = None,
    **server_options: Any,
) -> LlamaServer:
    """Plan and start llama-server replicas; returns once every one is ready (the URLs are
    ``server.urls``). ``args`` go to llama-server and win over xpulaunch's options;
    ``server_options`` go to :class:`LlamaServer` (health, policy, grace_s, logs, ...)."""
    env = dict(os.environ) if parent_env is None else dict(parent_env)
    if inventory is None:
        from xpulaunch.probing.host import probe_host

        inventory = probe_host(env=env)
    if isinstance(llama_backend, str):
        llama_backend = parse_llama_backend(llama_backend)
    request = LlamaRequest(
        model=model, replicas=replicas, host=host, port=port, binary=binary or "llama-server",
        llama_backend=llama_backend, passthrough=tuple(args), gpus=gpus, backend=backend,
    )  # fmt: skip
    from xpulaunch.llamacpp.server import LlamaServer

    plan = plan_llama(request, inventory, env)  # leases nothing: no lock to keep it short
    server_options.setdefault("settle", cuda_settle(plan))
    server = LlamaServer(plan, env, **server_options)
    server.start()
    return server
