"""``python -m xpulaunch.integrations.torch_agent [TORCHRUN OPTIONS] SCRIPT ...``: torch's
elastic agent (``python -m torch.distributed.run``) with one line of ours for every
rendezvous round.

Under ``--rdzv-backend c10d`` this is the one process that xpulaunch supervises on a node
(:mod:`xpulaunch.nodes.elastic`). torch's agent says who is in a round only in an INFO record
("Rendezvous complete for workers", ``SimpleElasticAgent._rendezvous`` in
``torch/distributed/elastic/agent/server/api.py``), and its loggers show WARNING and above
unless ``LOGLEVEL`` says otherwise. A filter on that one logger turns the record into a line
such as ``xpulaunch: c10d round 2: 1 node (was 2; a node left), ...`` on stderr and lets
through only what torch would have shown anyway. Then torchrun's ``main`` runs with the same
arguments, in this process: the same exit status, the same signal handling.

With room to grow (``--nnodes MIN:MAX``, MIN < MAX), one decision of torch's agent is changed
(:func:`admit_joiners`): workers that fail while a node waits to join start again in the next
round without spending a restart, as torch's agent does for workers that are still healthy.
And an agent that gives up tells the others through the round's store, which then stop their
workers (:func:`stop_with_the_others`): torch's agents would leave workers that do not notice
the failure (NCCL's) running for ever.

Nothing of xpulaunch imports this module; it imports torch, and only in the agent's process.
It never touches a GPU runtime (neither does torchrun's agent).
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TextIO

# The message of torch's record of a completed round (on its agent module's logger).
ROUND_MESSAGE = "Rendezvous complete for workers"
# How long torch's rendezvous handler answers from its last read of the shared state
# (_BackendRendezvousStateHolder's cache_duration, 1 s, in dynamic_rendezvous.py), and how
# often it is asked again until an answer is younger than the failure.
STATE_CACHE_S = 1.0
ASK_EVERY_S = 0.1
# How much longer than its join timeout the agent may take to complete its first round
# before it is given up: torch's own join timeout fires first wherever a c10d store answers.
START_MARGIN_S = 15.0
# torch's default join timeout (dynamic_rendezvous.py), when --rdzv-conf names none.
TORCH_JOIN_TIMEOUT_S = 600.0
# The exit status of an agent that never met the others (xpulaunch.errors.NODES_FAILED_STATUS;
# not imported: this module runs in the agent's process, beside torch, and imports nothing
# of xpulaunch).
NO_RENDEZVOUS_STATUS = 125


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
    who = "a node" if abs(gone) == 1 else f"{abs(gone)} nodes"
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
        self.first_round = threading.Event()  # set by the first completed round

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.msg, str) and ROUND_MESSAGE in record.msg:
            self.first_round.set()
            now = round_of(record.args)
            if now is not None:
                self.rounds += 1
                _say(self.stream, round_line(self.rounds, now, self.last))
                self.last = now
        return record.levelno >= self.shown_level


def install(logger: logging.Logger, stream: TextIO) -> RoundLines:
    """Attach :class:`RoundLines` to ``logger``, which then hands it INFO records too."""
    lines = RoundLines(logger.getEffectiveLevel(), stream)
    logger.addFilter(lines)
    if logger.getEffectiveLevel() > logging.INFO:
        logger.setLevel(logging.INFO)
    return lines


def admit_joiners(agent_class: Any, stream: TextIO, fresh_after_s: float = STATE_CACHE_S) -> None:
    """Make ``agent_class`` (torch's ``LocalElasticAgent``) treat workers that failed while a
    node waits to join as torch treats healthy ones then: stopped, and started again in the
    next round, without spending a restart.

    Why: a node that comes below MAX waits for the next round; each agent sees it when its
    monitor asks the rendezvous how many nodes wait, and then stops its workers for that
    round. torch's handler answers that question from a state read up to a second earlier.
    The first agent to see the newcomer stops its workers, so the workers on the other nodes
    fail at their next collective, often before their own agent's answer is fresh. torch's
    agent checks the workers first, counts that failure as a restart, and with none left ends
    the job and closes the rendezvous for every node. Here a failure is first checked against
    an answer read after it (asked again for ``fresh_after_s``); with a node waiting, the
    monitor reports the group healthy, and torch's own next step is the membership restart.
    Without one, or where the rendezvous cannot answer (its store gone), the failure is
    torch's to handle, as before.
    """
    from torch.distributed.elastic.agent.server.api import RunResult, WorkerState

    failed = (WorkerState.FAILED, WorkerState.UNHEALTHY)
    monitor: Callable[[Any, Any], Any] = agent_class._monitor_workers

    def _monitor_workers(self: Any, worker_group: Any) -> Any:
        result = monitor(self, worker_group)
        if result.state not in failed:
            return result
        try:
            waiting = nodes_waiting(worker_group.spec.rdzv_handler, fresh_after_s)
        except Exception:  # noqa: BLE001 (the store gone, say: the failure stays torch's)
            return result
        if not waiting:
            return result
        _say(
            stream,
            "xpulaunch: c10d: this node's workers failed while a node waits to join; they "
            "start again in the next round, without spending a restart",
        )
        return RunResult(state=WorkerState.HEALTHY)

    agent_class._monitor_workers = _monitor_workers


def nodes_waiting(handler: Any, fresh_after_s: float) -> bool:
    """Whether the rendezvous has a node waiting for the next round, by an answer of
    ``handler`` (torch's rendezvous handler) read at least ``fresh_after_s`` after this call
    began, or an earlier one that says yes."""
    deadline = time.monotonic() + fresh_after_s
    while True:
        if handler.num_nodes_waiting() > 0:
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(ASK_EVERY_S)


# The key (in the round's store) by which an agent that gave up tells the other agents, and
# how often a healthy agent looks for it (as often as torch's handler rereads its state).
GAVE_UP_KEY = "xpulaunch/gave_up"


def stop_with_the_others(
    agent_class: Any, stream: TextIO, check_every_s: float = STATE_CACHE_S
) -> None:
    """Make ``agent_class`` (torch's ``LocalElasticAgent``) stop its workers when the agent of
    another node of the round gave up, as a node of a static job does (``Supervisor.fail``).

    Why: an agent gives up when its workers fail with no restarts left; it closes the
    rendezvous and ends. torch's other agents look only for nodes waiting to join, so their
    workers go on: with gloo their next collective fails, but NCCL does not fail a collective
    whose peer died (only its watchdog does, many minutes later), and workers blind to the
    failure wait for ever (torchrun's agents too). Not the closed rendezvous itself: a node
    whose workers ended well closes it too, once the exit barrier times out, while another
    node's workers may still be busy for good reason (rank 0 saving or evaluating).
    """
    from torch.distributed.elastic.agent.server.api import WorkerState

    invoke_run: Callable[..., Any] = agent_class._invoke_run
    monitor: Callable[[Any, Any], Any] = agent_class._monitor_workers
    next_look = {"at": 0.0}

    def _invoke_run(self: Any, *args: Any, **kwargs: Any) -> Any:
        result = invoke_run(self, *args, **kwargs)
        if result.is_failed():  # torch ends this node's job: say so to the others first
            _tell(self._worker_group.store, str(self._worker_group.group_rank))
        return result

    def _monitor_workers(self: Any, worker_group: Any) -> Any:
        result = monitor(self, worker_group)
        if result.state is not WorkerState.HEALTHY or time.monotonic() < next_look["at"]:
            return result
        next_look["at"] = time.monotonic() + check_every_s
        who = _gave_up(worker_group.store)
        if who is None:
            return result
        _say(
            stream,
            f"xpulaunch: c10d: the node of group rank {who} gave up (its workers failed, with "
            "no restarts left); stopping this node's workers",
        )
        self._stop_workers(worker_group)  # torch's own stop: SIGTERM, then SIGKILL
        return monitor(self, worker_group)  # their failure, for torch to handle as any other

    agent_class._invoke_run = _invoke_run
    agent_class._monitor_workers = _monitor_workers


def _tell(store: Any, group_rank: str) -> None:
    if store is None:
        return
    with contextlib.suppress(RuntimeError):  # the store gone: the others lose it too
        store.set(GAVE_UP_KEY, group_rank)


def _gave_up(store: Any) -> str | None:
    """The group rank of a node that gave up, by the round's store; None while none did, or
    where the store cannot answer (torch's next call to it then fails the agent)."""
    if store is None:
        return None
    try:
        if not store.check([GAVE_UP_KEY]):
            return None
        return str(store.get(GAVE_UP_KEY).decode())
    except RuntimeError:  # torch's store errors (DistStoreError, DistNetworkError) are these
        return None


# torch's default last call for late nodes (RendezvousTimeout in dynamic_rendezvous.py).
LAST_CALL_DEFAULT_S = 30


def late_nodes_line(min_nodes: int, max_nodes: int, rdzv_conf: str) -> str | None:
    """With room to grow (MIN < MAX), what the first round waits for, said before the long
    silence of torch's last call for late nodes (30 s unless ``last_call_timeout`` says
    otherwise); None for a fixed number of nodes."""
    if min_nodes >= max_nodes:
        return None
    settings = dict(item.split("=", 1) for item in rdzv_conf.split(",") if "=" in item)
    last_call = settings.get("last_call_timeout", str(LAST_CALL_DEFAULT_S)).strip()
    verb = "is" if min_nodes == 1 else "are"
    return (
        f"xpulaunch: c10d: waiting for {min_nodes} to {max_nodes} nodes; once {min_nodes} {verb} "
        f"here, torch waits {last_call} s more for late ones before the first round "
        f"(--rdzv-conf last_call_timeout=S)"
    )


def bound_start(
    first_round: threading.Event, endpoint: str, limit_s: float, stream: TextIO
) -> threading.Thread:
    """Give the agent ``limit_s`` for its first rendezvous round, then end it with one line
    and :data:`NO_RENDEZVOUS_STATUS`. torch's join timeout does not cover everything before
    the rendezvous: a program that is not a c10d store but accepts connections on the
    endpoint (a port taken by something else) keeps the agent's store client waiting for an
    answer for ever (torchrun too)."""

    def watch() -> None:
        if first_round.wait(limit_s):
            return
        _say(stream, f"xpulaunch: error: c10d: {no_round(endpoint, limit_s)}")
        os._exit(NO_RENDEZVOUS_STATUS)  # the agent's threads are stuck in torch: no way out

    thread = threading.Thread(target=watch, name="xpulaunch-start-bound", daemon=True)
    thread.start()
    return thread


def no_round(endpoint: str, limit_s: float) -> str:
    """Why no round came, as far as a connection to ``endpoint`` tells."""
    host, _, port = endpoint.rpartition(":")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=2.0):
            pass
    except (OSError, ValueError) as exc:
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        return (
            f"no rendezvous round within {limit_s:g} s, and {endpoint} does not answer ({why});"
            " check --rdzv-endpoint (the same on every node)"
        )
    return (
        f"no rendezvous round within {limit_s:g} s: {endpoint} answers, but not as torch's "
        "c10d store (is another program holding that port?); check --rdzv-endpoint"
    )


def join_timeout_s(rdzv_conf: str) -> float:
    """The join timeout in torchrun's ``--rdzv-conf`` (torch's default when not there)."""
    for pair in rdzv_conf.split(","):
        key, _, value = pair.partition("=")
        if key.strip() in ("join_timeout", "timeout"):
            try:
                return float(value)
            except ValueError:
                break  # torch refuses it itself
    return TORCH_JOIN_TIMEOUT_S


def _say(stream: TextIO, line: str) -> None:
    with contextlib.suppress(OSError, ValueError):  # a closed stderr must not fail the agent
        stream.write(line + "\n")
        stream.flush()


def main() -> None:
    # Importing torch's agent module set its logger's level (LOGLEVEL, else WARNING); install
    # lowers it only after that. torch's get_logger names a module's logger after the module.
    from torch.distributed import run
    from torch.distributed.elastic.agent.server import api, local_elastic_agent

    lines = install(logging.getLogger(api.__name__), sys.stderr)
    args = run.get_args_parser().parse_args(sys.argv[1:])
    min_nodes, max_nodes = run.parse_min_max_nnodes(args.nnodes)
    line = late_nodes_line(min_nodes, max_nodes, args.rdzv_conf or "")
    if line is not None:
        _say(sys.stderr, line)
    if min_nodes < max_nodes:
        admit_joiners(local_elastic_agent.LocalElasticAgent, sys.stderr)
    stop_with_the_others(local_elastic_agent.LocalElasticAgent, sys.stderr)
    limit_s = join_timeout_s(args.rdzv_conf or "") + START_MARGIN_S
    bound_start(lines.first_round, args.rdzv_endpoint, limit_s, sys.stderr)
    # xpulaunch sends SIGUSR1/SIGUSR2 on to the workers itself (they run in sessions of
    # their own, out of the agent's group); left to their default action they would end the
    # agent, and torch's handling of them (--signals-to-handle) would stop the workers.
    for relayed in (signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(relayed, _ignore)
    run.main()  # reads sys.argv[1:], our arguments, as `python -m torch.distributed.run` does


def _ignore(signum: int, frame: object) -> None:
    """A handler that does nothing: unlike SIG_IGN, the agent's children do not inherit it."""


if __name__ == "__main__":
    main()
