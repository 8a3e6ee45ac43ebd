"""What is known of a llama request before its devices are chosen: the binary's path and
build, its listing, whether it has ``--fit``, the model's need (:func:`prepare_llama`, which
takes seconds on a GPU host, so it runs outside the lease lock), and the quick planning that
runs under it (:func:`plan_prepared`)."""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from xpulaunch.core.backend import parse_backend
from xpulaunch.errors import UsageError
from xpulaunch.llamacpp import args as llama_args
from xpulaunch.llamacpp.binary import build_features, not_this_build, resolve_binary, which_build
from xpulaunch.llamacpp.devices import DeviceList, LlamaBackend
from xpulaunch.llamacpp.engine import Engine, plan_engine
from xpulaunch.llamacpp.estimate import estimate_model
from xpulaunch.llamacpp.health import free_port
from xpulaunch.llamacpp.plan import (
    LlamaPlan,
    LlamaRequest,
    Sizing,
    effective_model,
    make_llama_plan,
)
from xpulaunch.model import Inventory

BINARY_VAR = "XPULAUNCH_LLAMA_SERVER"  # what --binary defaults to, for the CLI and the API


def check_model(path: str) -> None:
    """Raise a one-line :class:`UsageError` for a model file that cannot be read (a dry run
    too: its estimate and device choice come from the file)."""
    try:
        st = os.stat(path)
    except OSError as exc:  # missing, a folder closed to us, a name too long...
        problem = "no such file" if exc.errno == errno.ENOENT else exc.strerror or str(exc)
    else:
        if stat.S_ISREG(st.st_mode) and os.access(path, os.R_OK):
            return
        problem = "is a directory" if stat.S_ISDIR(st.st_mode) else "cannot be read"
    raise UsageError(f"{problem}; expected the path of a .gguf file", option="model", value=path)


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
        ports.append(free_port(request.host, exclude=ports, start=request.first_port))
    return ports


@dataclass(frozen=True, slots=True)
class Prepared:
    """What is known before devices are chosen: the request with the binary's path, its
    build, its listing, how replicas are sized, and notes. Asking the binary and measuring
    the model take seconds on a GPU host, so this happens outside the lease lock."""

    request: LlamaRequest
    build: LlamaBackend
    listing: DeviceList | None
    sizing: Sizing
    notes: tuple[str, ...]
    engine: Engine | None = None  # a model's own server (``cmd``) instead of llama-server


def prepare_llama(
    request: LlamaRequest, parent_env: Mapping[str, str], *, dry_run: bool = False
) -> Prepared:
    """Resolve the binary and its build (asking it with ``--list-devices`` when needed),
    whether it has ``--fit``, and the model's need. A dry run tolerates a missing binary
    (with a note) when the build is given; a missing model file is an error."""
    binary, missing = resolve_binary(request.binary, parent_env, must_exist=not dry_run)
    notes = [missing] if missing else []
    model = effective_model(request, parent_env)
    if model is not None:
        check_model(model)
    wanted = parse_backend(request.backend)
    found = missing is None
    build, listing, build_notes = which_build(
        binary, found, request.llama_backend, wanted, parent_env
    )
    features = build_features(binary) if found else None
    fit = None if features is None else features.fit
    estimate = None
    if model is not None:
        other = not_this_build(binary, build, listing, parent_env) if found and dry_run else None
        estimate, estimate_notes = estimate_model(
            binary if found and not other else None,
            model,
            request.passthrough,
            parent_env,
            fit=bool(fit),
            device=_first_device(build, listing),
        )
        notes += [*estimate_notes, *([other] if other else [])]
    else:
        notes.append("the model is fetched by llama-server itself: no estimate of its size")
    return Prepared(
        replace(request, binary=binary),
        build,
        listing,
        Sizing(fit, estimate),
        (*build_notes, *notes),
    )


def _first_device(build: LlamaBackend, listing: DeviceList | None) -> str | None:
    """The device the estimate is for: the build's first one (None on a CPU build)."""
    if build is LlamaBackend.CPU:
        return None
    listed = listing.of(build) if listing is not None else ()
    if listed:
        return listed[0].name
    prefix = build.device_prefix
    return f"{prefix}0" if prefix else None


def plan_prepared(
    prepared: Prepared,
    inventory: Inventory,
    parent_env: Mapping[str, str],
    *,
    unavailable: Mapping[str, str] | None = None,
) -> LlamaPlan:
    """Ports and devices of every replica (quick: fit for the lease lock)."""
    if prepared.engine is not None:
        return plan_engine(
            prepared.engine,
            prepared.request,
            prepared.sizing.estimate,
            inventory,
            parent_env,
            ports=choose_ports(prepared.request),
            unavailable=unavailable,
        )
    return make_llama_plan(
        prepared.request,
        inventory,
        parent_env,
        build=prepared.build,
        listing=prepared.listing,
        ports=choose_ports(prepared.request),
        build_notes=prepared.notes,
        unavailable=unavailable,
        sizing=prepared.sizing,
    )


def cuda_settle(plan: LlamaPlan) -> Any | None:
    """On CUDA, wait for a dead replica's VRAM to be freed before its restart (the driver frees
    it after the process exits); the same NVML hook ``xpulaunch run`` uses (None elsewhere)."""
    from xpulaunch.launch.gpu_settle import gpu_settle

    return gpu_settle(plan.plan)
