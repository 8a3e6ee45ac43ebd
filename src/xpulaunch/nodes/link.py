"""What every node of a static job has: what it brings to the meeting (:class:`Meeting`), its
part in it (:class:`NodeLink`: node 0's :class:`~xpulaunch.nodes.hub.Hub` or another
node's :class:`~xpulaunch.nodes.member.Member`), and how a connection between nodes is kept
and written to. :mod:`xpulaunch.nodes.member` tells the whole story."""

from __future__ import annotations

import socket
from collections.abc import Callable
from dataclasses import dataclass

# TCP keepalive on every connection between nodes: a machine that is gone (no FIN, no RST)
# is noticed after IDLE + INTERVAL * COUNT seconds of silence, by the kernel.
_KEEPALIVE = (("TCP_KEEPIDLE", 2), ("TCP_KEEPINTVL", 1), ("TCP_KEEPCNT", 3))
_UNACKED_MS = 10_000  # TCP_USER_TIMEOUT: data unacknowledged this long breaks the connection
HANGUP_S = 2.0  # how long a closing node waits for the other end to hang up too


@dataclass(frozen=True, slots=True)
class Meeting:
    """What this node brings to the meeting: who it is, where node 0 listens, for how long
    to try, and its worker count (``note``: a few words on why so few, ``nvidia 3 busy``)."""

    nnodes: int
    node_rank: int
    master_addr: str
    master_port: int
    timeout_s: float
    nproc: int = 1
    note: str = ""


Say = Callable[[str], None]
OnFailure = Callable[[str], None]


class NodeLink:
    """This node's part: :meth:`meet` before every start, :meth:`tell` when its own workers
    fail, :meth:`close` when its supervisor is over. ``on_failure(why)`` runs (on the link's
    thread, at most once per run of the workers) when another node's workers failed, it was
    stopped, or it is gone."""

    counts: tuple[int, ...] = ()

    def meet(self) -> tuple[int, ...]:
        """Block until every node is here; every node's worker count, by node rank."""
        raise NotImplementedError

    def tell(self, why: str) -> None:
        """This node's workers failed, or it is being stopped (any thread; never blocks)."""
        raise NotImplementedError

    def close(self, status: int) -> None:
        """This node's supervisor ended with ``status``: say so, and hang up."""
        raise NotImplementedError


def tune(sock: socket.socket) -> None:
    """Keepalive on a connection between nodes (see :data:`_KEEPALIVE`); Linux's options,
    skipped where the platform lacks them."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for name, value in _KEEPALIVE:
        if hasattr(socket, name):
            sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, name), value)
    if hasattr(socket, "TCP_USER_TIMEOUT"):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT, _UNACKED_MS)


def send(sock: socket.socket, line: str) -> bool:
    """Send one short line without blocking; False when it cannot go (the peer is gone, or
    has not read for so long that its buffer is full: it is stuck or gone)."""
    try:
        data = line.encode("ascii", "replace")
        return sock.send(data, socket.MSG_DONTWAIT) == len(data)
    except OSError:
        return False
