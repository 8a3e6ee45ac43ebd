"""The multi-node options of ``run``, with torchrun's names and meanings.

:func:`xpulaunch.core.nodes.resolve_nodes` says what the values mean; ``--master-addr`` and
``--master-port`` are declared with the other rank options in :mod:`xpulaunch.cli.run`.
"""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING, Any

import click

from xpulaunch.cli.options import option_group
from xpulaunch.core.elastic import RDZV_CONF_KEYS, local_ranks_filter, parse_rdzv_conf
from xpulaunch.core.nodes import NodeRequest, resolve_nodes
from xpulaunch.errors import UsageError
from xpulaunch.model import Plan

if TYPE_CHECKING:
    from xpulaunch.launch.nodes import Meeting

DEFAULT_JOIN_TIMEOUT_S = 600.0  # torchrun's rendezvous join_timeout

multinode_options = option_group(
    click.option(
        "--nnodes",
        envvar="XPULAUNCH_NNODES",
        metavar="N|MIN:MAX|auto",
        help="Nodes in the job, one xpulaunch on each (default 1); auto: from Slurm, "
        "Kubeflow PyTorchJob or MPI variables; MIN:MAX with --rdzv-backend c10d.",
    ),
    click.option(
        "--node-rank",
        type=click.IntRange(min=0),
        envvar="XPULAUNCH_NODE_RANK",
        help="This node's rank, 0 to nnodes - 1 (default 0). Global RANK = node_rank * "
        "nproc-per-node + LOCAL_RANK.",
    ),
    click.option(
        "--rdzv-backend",
        metavar="static|c10d",
        help="Rendezvous: static (MASTER_ADDR/MASTER_PORT, torch's env://; the default) or "
        "c10d (torch's elastic rendezvous and agent; --nnodes MIN:MAX allowed).",
    ),
    click.option(
        "--rdzv-id",
        metavar="ID",
        help="The job's id on a c10d rendezvous (the same on every node).",
    ),
    click.option(
        "--rdzv-endpoint",
        metavar="HOST:PORT",
        help="static: node 0's address (instead of --master-addr/--master-port); c10d: "
        "where the rendezvous store is (the first node there hosts it).",
    ),
    click.option(
        "--join-timeout",
        type=float,
        default=DEFAULT_JOIN_TIMEOUT_S,
        show_default=True,
        envvar="XPULAUNCH_JOIN_TIMEOUT",
        metavar="SECONDS",
        help="How long nodes wait for each other before starting workers; 0 skips the check.",
    ),
    click.option(
        "--rdzv-conf",
        envvar="XPULAUNCH_RDZV_CONF",
        metavar="KEY=VALUE[,...]",
        help="c10d: torch's rendezvous settings, e.g. last_call_timeout=5 (whole seconds); "
        "keys: " + ", ".join(RDZV_CONF_KEYS) + ". join_timeout here replaces --join-timeout.",
    ),
)


def pop_node_request(options: dict[str, Any]) -> tuple[NodeRequest, float]:
    """Take the multi-node values out of the command's keyword arguments; the join timeout
    is ``--join-timeout``'s, or ``--rdzv-conf join_timeout``'s (see :func:`_join_timeout`).
    The other rendezvous settings stay in ``options["rdzv_settings"]``."""
    request = NodeRequest(
        nnodes=options.pop("nnodes"),
        node_rank=options.pop("node_rank"),
        master_addr=options.get("master_addr"),
        master_port=options.get("master_port"),
        rdzv_backend=options.pop("rdzv_backend"),
        rdzv_endpoint=options.pop("rdzv_endpoint"),
        rdzv_id=options.pop("rdzv_id"),
    )
    text = options.pop("rdzv_conf", None)
    settings = dict(parse_rdzv_conf(text or ""))
    if text and request.rdzv_backend != "c10d":
        raise UsageError(
            f"--rdzv-conf {text}: only with --rdzv-backend c10d (torch's rendezvous settings)"
        )
    options["rdzv_settings"] = tuple(settings.items())
    return request, _join_timeout(options.pop("join_timeout"), settings.pop("join_timeout", None))


def _join_timeout(option: float, setting: str | None) -> float:
    """``--rdzv-conf join_timeout=S`` is torchrun's spelling of ``--join-timeout S``: it
    replaces the default; beside a ``--join-timeout`` given (also by variable or config file)
    with another value it is refused, as neither would be sure to win."""
    if setting is None:
        return option
    source = click.get_current_context().get_parameter_source("join_timeout")
    if source not in (None, click.core.ParameterSource.DEFAULT) and float(setting) != option:
        raise UsageError(
            f"--rdzv-conf join_timeout={setting} and --join-timeout {option:g}: give one of them"
        )
    return float(setting)


def node_kwargs(
    request: NodeRequest, parent_env: dict[str, str], options: dict[str, Any]
) -> dict[str, Any]:
    """``api.plan``'s keyword arguments for where this node stands in the job. For c10d,
    ``options`` learn the spec, and restarts become the agent's (see :func:`final_plan`)."""
    from xpulaunch.probing.slurm import checked_expander

    expand = checked_expander(parent_env, lambda text: click.echo(f"xpulaunch: {text}", err=True))
    settings = resolve_nodes(request, parent_env, expand)
    options["elastic"] = settings.elastic
    if settings.elastic is not None:  # restarts are the agent's: ours would restart it too
        options["restart"], options["max_restarts"] = "no", None
        _agent_console_and_logs(options)
    return {
        "nodes": settings.nodes,
        "master_addr": settings.master_addr,
        "master_port": settings.master_port,
    }


def _agent_console_and_logs(options: dict[str, Any]) -> None:
    """Under c10d the workers are the agent's children, so two options become the agent's.
    ``--ranks``: torchrun's ``--local-ranks-filter`` (our console sees one worker, the agent).
    ``--log-dir`` in torchrun's layout: the agent writes it (a run directory, an attempt per
    restart, a folder per local rank with error.json), and our supervisor writes nothing
    there, so that ``xpulaunch logs DIR`` finds torch's run alone. Our own layout stays ours:
    the agent's output, the workers' lines included, in ``attempt_N/agent.log`` (with
    ``--ranks``, only those ranks': torch drops a filtered rank's lines that go to no file)."""
    if options.get("ranks") is not None:
        options["agent_ranks"] = local_ranks_filter(options.pop("ranks"))
    if options.get("log_layout") == "torchrun" and options.get("log_dir") is not None:
        log_dir = options.pop("log_dir")
        if not click.get_current_context().params.get("dry_run"):
            from xpulaunch.launch.options import make_log_dir

            make_log_dir(log_dir)  # a bad one fails in one line before anything is leased
        options["agent_log_dir"] = log_dir


def node_meeting(plan: Plan, kwargs: dict[str, Any], timeout_s: float) -> Meeting | None:
    """With several static nodes, how they meet (bounded) before the workers start and
    before every restart: see :mod:`xpulaunch.launch.nodes`. None for one node (and for
    c10d, whose plan is one agent on one node as far as the supervisor sees)."""
    if plan.nodes.nnodes < 2:
        return None
    from xpulaunch.launch.nodes import Meeting

    return Meeting(
        nnodes=plan.nodes.nnodes,
        node_rank=plan.nodes.node_rank,
        master_addr=kwargs["master_addr"],
        master_port=kwargs["master_port"],
        timeout_s=timeout_s,
    )


def warn_torchrun_options(program: tuple[str, ...]) -> None:
    """One line for each torchrun option written after PROGRAM (not after ``--``): it goes
    to PROGRAM, which is what ``run`` does with an argument it does not know."""
    from xpulaunch.cli.program import AFTER_DASHDASH
    from xpulaunch.cli.torchrun_args import torchrun_options_in

    explicit = click.get_current_context().meta.get(AFTER_DASHDASH, 0)
    script = os.path.basename(program[0])
    for name in torchrun_options_in(program[1 : len(program) - explicit]):
        click.echo(
            f"xpulaunch: warning: {name} (a torchrun option) goes to {script}; put it after "
            f"-- if it is meant for {script}, or run xpulaunch torchrun ... {script}",
            err=True,
        )


def final_plan(plan: Plan, options: dict[str, Any], max_restarts: int | None) -> Plan:
    """For c10d, ``plan`` run by torch's elastic agent (:mod:`xpulaunch.core.elastic`):
    the agent restarts the gang on every node, so our supervisor never restarts it."""
    spec = options.get("elastic")
    if spec is None:
        return plan
    from xpulaunch.core.elastic import agent_plan

    return agent_plan(
        plan,
        spec,
        python=sys.executable,
        max_restarts=max_restarts,
        join_timeout_s=options.get("join_timeout_s") or 0.0,
        rdzv_conf=options.get("rdzv_settings") or (),
        log_dir=options.get("agent_log_dir"),
        local_ranks=options.get("agent_ranks"),
    )
