"""``python -m xpulaunch.integrations.torch_agent [TORCHRUN OPTIONS] SCRIPT ...``: torch's
elastic agent (``python -m torch.distributed.run``) with one line of ours for every
rendezvous round.

Under ``--rdzv-backend c10d`` this is the one process that xpulaunch supervises on a node
(:mod:`xpulaunch.core.elastic`). torch's agent says who is in a round only in an INFO record
("Rendezvous complete for workers", ``SimpleElasticAgent._rendezvous`` in
``torch/distributed/elastic/agent/server/api.py``), and its loggers show WARNING and above
unless ``LOGLEVEL`` says otherwise. A filter on that one logger turns the record into a line
such as ``xpulaunch: c10d round 2: 1 node (was 2; a node left), ...`` on stderr and lets
through only what torch would have shown anyway. Then torchrun's ``main`` runs with the same
arguments, in this process: the same exit status, the same signal handling.

Nothing of xpulaunch imports this module; it imports torch, and only in the agent's process.
It never touches a GPU runtime (neither does torchrun's agent).
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TextIO

# The message of torch's record of a completed round (on its agent module's logger).
ROUND_MESSAGE = "Rendezvous complete for workers"


@dataclass(frozen=True, slots=True)
class Round:
    """What this node learnt from one completed rendezvous round."""

    nodes: int  # torch's group_world_size
    group_rank: int
    workers: int  # this node's
    world_size: int
    restart_count: int


def round_of(args: object) -> Round | None:
    """The round in the record's arguments (torch passes one dict of values), or None where a
    torch release logs other values: then no line is printed, and the agent goes on."""
    if not isinstance(args, Mapping):
        return None
    nodes, group_rank, restarts = (
        args.get(key) for key in ("group_world_size", "group_rank", "restart_count")
    )
    local_ranks, world_sizes = args.get("local_ranks"), args.get("global_world_sizes")
    if not (isinstance(nodes, int) and isinstance(group_rank, int)):
        return None
    if not (isinstance(restarts, int) and isinstance(local_ranks, list)):
        return None
    if not (isinstance(world_sizes, list) and world_sizes and isinstance(world_sizes[0], int)):
        return None
    return Round(nodes, group_rank, len(local_ranks), world_sizes[0], restarts)


def round_line(number: int, now: Round, before: Round | None) -> str:
    """``xpulaunch: c10d round 2: 1 node (was 2; a node left), this node is group rank 0,
    2 workers, world size 2``: the round's count on this node, and how it differs from the
    last (the rendezvous tells how many nodes, not which ones)."""
    changes = [] if before is None else [f"was {before.nodes}", _nodes_change(now, before)]
    if now.restart_count > 0:
        changes.append(f"restart {now.restart_count}")
    said = f" ({'; '.join(changes)})" if changes else ""
    return (
        f"xpulaunch: c10d round {number}: {_count(now.nodes, 'node')}{said}, this node is "
        f"group rank {now.group_rank}, {_count(now.workers, 'worker')}, "
        f"world size {now.world_size}"
    )


def _nodes_change(now: Round, before: Round) -> str:
    if now.nodes == before.nodes:
        return "the same number of nodes"
    gone = before.nodes - now.nodes
    many = abs(gone)
    who = "a node" if many == 1 else f"{many} nodes"
    return f"{who} {'left' if gone > 0 else 'joined'}"


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"


class RoundLines(logging.Filter):
    """On torch's agent logger: a round's record becomes our line on ``stream``; a record
    passes on only at ``shown_level`` or above (the level torch had set before we lowered
    the logger's to INFO to see the round's record at all)."""

    def __init__(self, shown_level: int, stream: TextIO) -> None:
        super().__init__()
        self.shown_level = shown_level
        self.stream = stream
        self.rounds = 0
        self.last: Round | None = None

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.msg, str) and ROUND_MESSAGE in record.msg:
            self._show(round_of(record.args))
        return record.levelno >= self.shown_level

    def _show(self, now: Round | None) -> None:
        if now is None:
            return
        self.rounds += 1
        line = round_line(self.rounds, now, self.last)
        self.last = now
        try:
            self.stream.write(line + "\n")
            self.stream.flush()
        except (OSError, ValueError):  # a closed stderr must not fail the agent's round
            pass


def install(logger: logging.Logger, stream: TextIO) -> RoundLines:
    """Attach :class:`RoundLines` to ``logger``, which then hands it INFO records too."""
    lines = RoundLines(logger.getEffectiveLevel(), stream)
    logger.addFilter(lines)
    if logger.getEffectiveLevel() > logging.INFO:
        logger.setLevel(logging.INFO)
    return lines


def main() -> None:
    # Importing torch's agent module set its logger's level (LOGLEVEL, else WARNING); install
    # lowers it only after that. torch's get_logger names a module's logger after the module.
    from torch.distributed import run
    from torch.distributed.elastic.agent.server import api

    install(logging.getLogger(api.__name__), sys.stderr)
    run.main()  # reads sys.argv[1:], our arguments, as `python -m torch.distributed.run` does


if __name__ == "__main__":
    main()
