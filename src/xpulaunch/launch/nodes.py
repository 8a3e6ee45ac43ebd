"""Before a job of several nodes starts its workers: are all the nodes there?

A wrong ``--master-addr`` or a closed port otherwise shows up as workers hanging in
``init_process_group`` until gloo's or NCCL's own timeout (pytorch/pytorch#107021, #69197).
So node 0 listens on the master port for a moment, every other node connects to it and says
which node it is; node 0 answers ``here`` at once and ``ok`` once all of them are in (or
refuses a node that disagrees on the size of the job or repeats a node rank). Then node 0
closes the port and the workers start, rank 0's TCPStore binding that same port. This checks
reachability only: the rendezvous itself is torch's (``MASTER_ADDR``/``MASTER_PORT``,
``env://``).

The nodes meet again before every restart of a static job (the supervisor's ``settle`` hook,
see :mod:`xpulaunch.launch.run`): each node's workers fail on their own (the crashed one, the
others on the broken collective), and without a meeting a node that restarts first can reach
the dying TCPStore of the old round on node 0's port, join that round's leftovers and leave
the others waiting for it forever. So a node that connects while the port still belongs to
the old round's store gets no ``here`` and tries again, until node 0's own gang is down and
node 0 listens again; no node starts its new workers before every node's old ones are gone.

The clients close their connections first, so that the TIME_WAIT of the closed connections
lands on them, not on node 0's port.
"""

from __future__ import annotations

import contextlib
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import BinaryIO

from xpulaunch.errors import LaunchError

_HELLO = "xpulaunch-preflight/1"
_POLL_S = 0.5  # how long one accept() or connect() waits before the deadline is checked again
_ACK_S = 5.0  # a listener that has not said ``here`` by then is not node 0's pre-flight
# Waits between connection attempts, then the last one on and on. Nobody listening yet: node 0
# is still starting, and a refused connection costs one round trip, so look again soon (every
# 0.5 s, the nodes' starts lined up badly and node 1 lost up to that much); a listener that is
# not node 0's pre-flight (the old round's TCPStore) is asked less often.
_REFUSED_S = (0.01,) * 50 + (0.05,) * 30 + (0.2, 0.5)
_RETRY_S = (0.02, 0.05, 0.1, 0.2, 0.5)


@dataclass(frozen=True, slots=True)
class Meeting:
    """What one pre-flight needs: who we are, where node 0 listens, for how long to try."""

    nnodes: int
    node_rank: int
    master_addr: str
    master_port: int
    timeout_s: float


def meet(meeting: Meeting, say: Callable[[str], None]) -> None:
    """Return once every node is there; raise :class:`LaunchError` (one line) otherwise."""
    if meeting.nnodes < 2 or meeting.timeout_s <= 0:
        return
    if meeting.node_rank == 0:
        _host(meeting, say)
    else:
        _join(meeting, say)


def _host(meeting: Meeting, say: Callable[[str], None]) -> None:
    deadline = time.monotonic() + meeting.timeout_s
    joined: dict[int, socket.socket] = {}
    with _listen(meeting) as server:
        try:
            _gather(server, meeting, joined, deadline, say)
            for conn in joined.values():
                conn.sendall(b"ok\n")
            for conn in joined.values():
                _wait_closed(conn, deadline)
        finally:
            for conn in joined.values():
                conn.close()
    say(f"all {meeting.nnodes} nodes are here; starting the workers")


def _listen(meeting: Meeting) -> socket.socket:
    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        server.bind(("", meeting.master_port))
    except OSError as exc:
        server.close()
        raise LaunchError(
            f"node 0 cannot listen on port {meeting.master_port} ({exc.strerror}); "
            "choose a free --master-port, the same on every node"
        ) from exc
    server.listen(meeting.nnodes)
    server.settimeout(_POLL_S)
    return server


def _gather(
    server: socket.socket,
    meeting: Meeting,
    joined: dict[int, socket.socket],
    deadline: float,
    say: Callable[[str], None],
) -> None:
    say(_waiting(meeting, joined))
    while len(joined) < meeting.nnodes - 1:
        if time.monotonic() > deadline:
            missing = ", ".join(str(r) for r in _missing(meeting, joined))
            raise LaunchError(
                f"node(s) {missing} did not reach node 0 on port {meeting.master_port} within "
                f"{meeting.timeout_s:g} s; check --master-addr/--master-port on them and that "
                "the port is open between the nodes (--join-timeout sets the wait)"
            )
        try:
            conn, peer = server.accept()
        except TimeoutError:
            continue
        rank = _admit(conn, meeting, joined)
        if rank is not None:
            joined[rank] = conn
            with contextlib.suppress(OSError):  # it went away: its ok fails later, and it retries
                conn.sendall(b"here\n")
            say(f"node {rank} is here ({peer[0]}); {_waiting(meeting, joined)}")


def _waiting(meeting: Meeting, joined: dict[int, socket.socket]) -> str:
    missing = len(_missing(meeting, joined))
    if not missing:
        return "every node is here"
    return f"waiting for {missing} of {meeting.nnodes} nodes on port {meeting.master_port}"


def _missing(meeting: Meeting, joined: dict[int, socket.socket]) -> list[int]:
    return [r for r in range(1, meeting.nnodes) if r not in joined]


def _admit(conn: socket.socket, meeting: Meeting, joined: dict[int, socket.socket]) -> int | None:
    """The node rank ``conn`` announces, or None after telling it why it is refused."""
    conn.settimeout(_POLL_S * 4)
    try:
        words = _read_line(conn).split()
    except OSError:
        words = []
    problem = None
    if len(words) != 3 or words[0] != _HELLO or not all(w.isdigit() for w in words[1:]):
        problem = "not an xpulaunch node of this version"
    elif int(words[2]) != meeting.nnodes:
        problem = f"node 0 runs --nnodes {meeting.nnodes}, this node --nnodes {words[2]}"
    elif int(words[1]) in joined or not 0 < int(words[1]) < meeting.nnodes:
        problem = f"--node-rank {words[1]} is taken or out of range 1-{meeting.nnodes - 1}"
    if problem is None:
        return int(words[1])
    with contextlib.suppress(OSError):  # it went away: nothing to tell
        conn.sendall(f"refused: {problem}\n".encode())
    conn.close()
    return None


def _read_line(conn: socket.socket) -> str:
    data = b""
    while not data.endswith(b"\n") and len(data) < 256:
        chunk = conn.recv(256)
        if not chunk:
            break
        data += chunk
    return data.decode("ascii", "replace").strip()


def _wait_closed(conn: socket.socket, deadline: float) -> None:
    """Let the client close first (see the module docstring); bounded by the deadline."""
    conn.settimeout(max(0.1, min(5.0, deadline - time.monotonic())))
    with contextlib.suppress(OSError):  # gone or silent: either way node 0 goes on
        conn.recv(1)


def _join(meeting: Meeting, say: Callable[[str], None]) -> None:
    deadline = time.monotonic() + meeting.timeout_s
    where = f"{meeting.master_addr}:{meeting.master_port}"
    say(f"node {meeting.node_rank} of {meeting.nnodes}: reaching node 0 at {where}")
    hello = f"{_HELLO} {meeting.node_rank} {meeting.nnodes}\n".encode()
    last, wait, refusals, strangers = "no answer", 0.0, 0, 0
    while True:
        time.sleep(wait)
        if time.monotonic() >= deadline:
            break
        try:
            conn = socket.create_connection(
                (meeting.master_addr, meeting.master_port), timeout=_POLL_S * 4
            )
        except OSError as exc:  # node 0 is not listening (yet, or again)
            last, refusals = exc.strerror or str(exc), refusals + 1
            wait = _REFUSED_S[min(refusals, len(_REFUSED_S)) - 1]
            continue
        with conn:
            answer = _hello(conn, hello, deadline)
        if answer is None:  # not node 0's pre-flight: the old round's store, still dying
            last, strangers = "the port answers, but not as an xpulaunch node 0", strangers + 1
            wait = _RETRY_S[min(strangers, len(_RETRY_S)) - 1]
            continue
        if answer != "ok":
            raise LaunchError(f"node 0 at {where}: {answer}")
        return
    raise LaunchError(
        f"cannot reach node 0 at {where} within {meeting.timeout_s:g} s ({last}); check "
        "--master-addr/--master-port (the same on every node) and that the port is open"
    )


def _hello(conn: socket.socket, hello: bytes, deadline: float) -> str | None:
    """Node 0's final answer (``ok``, or why not), or None when the listener is not node 0's
    pre-flight (it did not say ``here`` in time): the caller connects again."""
    answers = conn.makefile("rb")  # buffered: ``here`` and ``ok`` may come in one segment
    try:
        conn.sendall(hello)
        conn.settimeout(max(0.1, min(_ACK_S, deadline - time.monotonic())))
        first = _line(answers)
    except OSError:  # a timeout, or the listener hung up on us
        return None
    if first.startswith("refused:"):
        return first
    if first != "here":
        return None
    conn.settimeout(max(0.1, deadline - time.monotonic()))
    try:
        return _line(answers) or "closed the connection"
    except TimeoutError:
        return "timed out waiting for the other nodes"
    except OSError as exc:
        return f"connection lost ({exc.strerror})"
    finally:
        answers.close()


def _line(answers: BinaryIO) -> str:
    return answers.readline(256).decode("ascii", "replace").strip()
