"""Node 0's side of :mod:`xpulaunch.nodes.member`: the hub every other node stays connected to.

One thread owns every socket of the hub (the listener while the nodes meet, the connections
of nodes that have not said who they are yet, and those of the admitted nodes) and waits on
all of them in one ``select``; other threads only post to it. So no connection can hold node
0: one that says nothing is closed after a few seconds, while the others are served, and the
meeting as a whole ends at ``--join-timeout``.
"""

from __future__ import annotations

import contextlib
import selectors
import socket
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from xpulaunch.errors import NodesError
from xpulaunch.nodes.link import (
    HANGUP_S,
    Meeting,
    NodeLink,
    OnFailure,
    Say,
    send,
    tune,
)
from xpulaunch.nodes.protocol import (
    Hello,
    Message,
    Verb,
    counts_text,
    read_hello,
    read_message,
    shown,
)
from xpulaunch.processes.signals import wait_answering

_HELLO_S = 5.0  # a new connection that has not said who it is by then is closed
_ENDED = "this node's job ended"


@dataclass(eq=False, slots=True)
class _Peer:
    """A connection: an admitted node's (``hello`` set), or one not introduced yet."""

    sock: socket.socket
    address: str
    deadline_s: float = 0.0  # for a stranger: when it must have said hello
    hello: Hello | None = None
    ready: bool = False  # its workers are down: it waits for go
    buffer: bytes = b""


@dataclass(eq=False, slots=True)
class _Round:
    """One meeting, from its start to ``go`` (``counts``) or its failure (``error``)."""

    deadline_s: float
    first: bool
    done: threading.Event = field(default_factory=threading.Event)
    counts: tuple[int, ...] = ()
    error: str = ""


class Hub(NodeLink):
    def __init__(self, meeting: Meeting, say: Say, on_failure: OnFailure | None) -> None:
        self._meeting, self._say, self._on_failure = meeting, say, on_failure
        self._nodes: dict[int, _Peer] = {}  # admitted, by node rank
        self._strangers: list[_Peer] = []
        self._ended: dict[int, int] = {}  # nodes that said bye: their exit status
        self._listener: socket.socket | None = None
        self._round: _Round | None = None
        self._meetings = 0
        self._told = False  # a failure of this run was told or heard already
        self._closed = False
        self._selector = selectors.DefaultSelector()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._selector.register(self._wake_r, selectors.EVENT_READ, self._woken)
        self._inbox: deque[Callable[[], None]] = deque()
        self._thread = threading.Thread(target=self._run, name="xpulaunch-nodes", daemon=True)
        self._thread.start()

    # -- any thread ----------------------------------------------------------------------
    def meet(self) -> tuple[int, ...]:
        meeting = _Round(time.monotonic() + self._meeting.timeout_s, first=not self._meetings)
        self._meetings += 1
        self._post(lambda: self._open(meeting))
        alive = self._thread.is_alive
        wait_answering(lambda t: True if meeting.done.wait(t) or not alive() else None)
        if not meeting.done.is_set():
            raise NodesError(_ENDED)
        if meeting.error:
            raise NodesError(meeting.error)
        self.counts = meeting.counts
        return meeting.counts

    def tell(self, why: str) -> None:
        self._post(lambda: self._tell(why))

    def close(self, status: int) -> None:
        self._post(lambda: self._close(status))
        self._thread.join(HANGUP_S + 1.0)

    def _post(self, action: Callable[[], None]) -> None:
        self._inbox.append(action)
        with contextlib.suppress(OSError):  # full: the thread is woken anyway; closed: over
            self._wake_w.send(b"\0")

    # -- the hub's thread ----------------------------------------------------------------
    def _run(self) -> None:
        try:
            while not self._closed:
                for key, _ in self._selector.select(self._timeout()):
                    key.data()
                self._expire()
        finally:  # a bug must not leave a meeting waiting for ever
            self._finish(error="node 0's meeting stopped (an internal error; see above)")
            for sock in (self._wake_r, self._wake_w):
                sock.close()
            self._selector.close()

    def _woken(self) -> None:
        with contextlib.suppress(BlockingIOError):
            while self._wake_r.recv(4096):
                pass
        while self._inbox:
            self._inbox.popleft()()

    def _timeout(self) -> float | None:
        deadlines = [p.deadline_s for p in self._strangers]
        if self._round is not None:
            deadlines.append(self._round.deadline_s)
        return max(0.0, min(deadlines) - time.monotonic()) if deadlines else None

    def _expire(self) -> None:
        now = time.monotonic()
        # The meeting first: a stranger due at the same time may be a slow node, and the
        # meeting's end tells it more than that it was slow.
        if self._round is not None and self._round.deadline_s <= now:
            self._finish(error=self._timed_out())
        for stranger in [p for p in self._strangers if p.deadline_s <= now]:
            self._refuse(stranger, f"no hello within {self._hello_s():g} s")

    def _hello_s(self) -> float:
        return min(_HELLO_S, self._meeting.timeout_s)

    # -- meeting -------------------------------------------------------------------------
    def _open(self, meeting: _Round) -> None:
        if self._closed:
            meeting.error = _ENDED
            meeting.done.set()
            return
        self._round = meeting
        if self._listener is None:
            try:
                self._listener = self._listen()
            except OSError as exc:
                port = self._meeting.master_port
                self._finish(
                    error=f"node 0 cannot listen on port {port} ({exc.strerror}); choose a "
                    "free --master-port, the same on every node"
                )
                return
        self._say(self._waiting())
        self._check()

    def _listen(self) -> socket.socket:
        server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            server.bind(("", self._meeting.master_port))
            server.listen(max(self._meeting.nnodes, 16))
        except OSError:
            server.close()
            raise
        server.setblocking(False)
        self._selector.register(server, selectors.EVENT_READ, self._accept)
        return server

    def _missing(self) -> list[int]:
        return [r for r in self._ranks() if r not in self._nodes or not self._nodes[r].ready]

    def _waiting(self) -> str:
        missing = len(self._missing())
        if not missing:
            return "every node is here"
        nnodes, port = self._meeting.nnodes, self._meeting.master_port
        return f"waiting for {missing} of {nnodes} nodes on port {port}"

    def _check(self) -> None:
        """Say go once every node is here, ready, and still connected."""
        if self._round is None:
            return
        gone = sorted(set(self._ended) - set(self._nodes))
        if gone:
            rank = gone[0]
            self._finish(
                error=f"node {rank} ended (exit status {self._ended[rank]}); the job cannot "
                "start again without it"
            )
            return
        if self._missing():
            return
        for node in list(self._nodes.values()):
            self._receive(node)  # what they said meanwhile, or that they are gone
        if self._round is None or self._missing():
            return
        counts = (self._meeting.nproc, *(self._nproc(self._nodes[r]) for r in self._ranks()))
        self._go(counts)

    @staticmethod
    def _nproc(node: _Peer) -> int:
        return node.hello.nproc if node.hello is not None else 0

    def _ranks(self) -> range:
        return range(1, self._meeting.nnodes)

    def _go(self, counts: tuple[int, ...]) -> None:
        for rank in self._ranks():
            node = self._nodes[rank]
            send(node.sock, Message(Verb.GO, counts=counts).line())
            node.ready = False
        self._told = False
        self.counts = counts
        nnodes = self._meeting.nnodes
        self._say(f"all {nnodes} nodes are here: {counts_text(counts)}; starting the workers")
        self._finish(counts=counts)

    def _finish(self, *, counts: tuple[int, ...] = (), error: str = "") -> None:
        meeting, self._round = self._round, None
        if self._listener is not None:  # the port is rank 0's store's from now on
            self._selector.unregister(self._listener)
            self._listener.close()
            self._listener = None
        if meeting is not None and error:  # their meeting fails with this line too
            refusal = Message(Verb.REFUSED, f"node 0 gives up: {error}").line()
            for peer in (*self._nodes.values(), *self._strangers):
                send(peer.sock, refusal)
        for stranger in list(self._strangers):  # after a go, it tries again at the next one
            self._drop(stranger)
        if meeting is None:
            return
        meeting.counts, meeting.error = counts, error
        meeting.done.set()

    def _timed_out(self) -> str:
        missing = ", ".join(str(r) for r in self._missing())
        wait, port = self._meeting.timeout_s, self._meeting.master_port
        if self._round is not None and not self._round.first:
            return (
                f"node(s) {missing} did not come back to node 0 within {wait:g} s to start "
                "again (--join-timeout sets the wait)"
            )
        return (
            f"node(s) {missing} did not reach node 0 on port {port} within {wait:g} s; check "
            "--master-addr/--master-port on them and that the port is open between the nodes "
            "(--join-timeout sets the wait)"
        )

    # -- connections ---------------------------------------------------------------------
    def _accept(self) -> None:
        if self._listener is None:
            return
        try:
            sock, address = self._listener.accept()
        except OSError:  # it went away before we took it
            return
        sock.setblocking(False)
        tune(sock)
        stranger = _Peer(sock, address[0], deadline_s=time.monotonic() + self._hello_s())
        self._strangers.append(stranger)
        self._selector.register(sock, selectors.EVENT_READ, lambda: self._introduce(stranger))

    def _introduce(self, stranger: _Peer) -> None:
        if not self._fill(stranger):
            self._drop(stranger)  # hung up before its hello: nothing to say
            return
        if b"\n" not in stranger.buffer:
            if len(stranger.buffer) > 1024:
                self._refuse(stranger, f"a garbled hello ({shown(stranger.buffer.decode())})")
            return
        raw, _, stranger.buffer = stranger.buffer.partition(b"\n")
        hello = read_hello(raw.decode("ascii", "replace").strip(), self._meeting.nnodes)
        if isinstance(hello, str):
            self._refuse(stranger, hello)
        else:
            self._admit(stranger, hello)

    def _admit(self, stranger: _Peer, hello: Hello) -> None:
        rank = hello.node_rank
        known = self._nodes.get(rank)
        if known is not None:
            self._receive(known)  # gone meanwhile? then its rank is free
            if rank in self._nodes:
                self._refuse(
                    stranger,
                    f"--node-rank {rank} is taken by a node still connected from {known.address}",
                )
                return
        self._strangers.remove(stranger)
        stranger.hello, stranger.ready = hello, True  # it is at a meeting: it came to one
        self._nodes[rank] = stranger
        self._ended.pop(rank, None)  # a node that ended and came back (a requeued task)
        self._selector.modify(stranger.sock, selectors.EVENT_READ, lambda: self._readable(stranger))
        send(stranger.sock, Message(Verb.HERE).line())
        workers = f"{hello.nproc} worker{'s' if hello.nproc != 1 else ''}"
        note = f" ({hello.note})" if hello.note else ""
        self._say(f"node {rank} is here ({stranger.address}): {workers}{note}; {self._waiting()}")
        self._check()

    def _refuse(self, stranger: _Peer, why: str) -> None:
        send(stranger.sock, Message(Verb.REFUSED, why).line())
        self._say(f"refused a connection from {stranger.address}: {why}")
        self._drop(stranger)

    def _fill(self, peer: _Peer) -> bool:
        """Read what ``peer`` sent into its buffer; False once it hung up (or broke)."""
        while True:
            try:
                chunk = peer.sock.recv(65536)
            except BlockingIOError:
                return True
            except OSError:
                return False
            if not chunk:
                return False
            peer.buffer += chunk

    def _drop(self, peer: _Peer) -> None:
        with contextlib.suppress(KeyError, ValueError):
            self._selector.unregister(peer.sock)
        peer.sock.close()
        if peer in self._strangers:
            self._strangers.remove(peer)

    def _readable(self, node: _Peer) -> None:
        self._receive(node)
        self._check()

    def _receive(self, node: _Peer) -> None:
        """An admitted node's messages, or its end (the caller checks the meeting after)."""
        open_ = self._fill(node)
        while node.hello is not None and b"\n" in node.buffer:
            raw, _, node.buffer = node.buffer.partition(b"\n")
            line = raw.decode("ascii", "replace").strip()
            message = read_message(line, self._meeting.nnodes)
            if message is None or not self._heard(node, message):
                self._lost(node, f"it sent a garbled message ({shown(line)})")
                return
        if node.hello is not None and not open_:
            self._lost(node, "its connection closed")

    def _heard(self, node: _Peer, message: Message) -> bool:
        """Act on one message; False when it makes no sense from this node."""
        rank = node.hello.node_rank if node.hello is not None else 0
        if message.verb is Verb.READY:
            node.ready = True
        elif message.verb is Verb.FAIL and message.node == rank:
            if self._round is None:
                self._pass_on(message, rank)
                self._failure(f"node {rank} failed ({message.text})")
        elif message.verb is Verb.BYE and message.node == rank:
            self._bye(node, rank, message.status)
        else:
            return False
        return True

    def _bye(self, node: _Peer, rank: int, status: int) -> None:
        self._ended[rank] = status
        self._forget(node, rank)
        if status != 0 and self._round is None:
            self._pass_on(Message(Verb.FAIL, f"it ended (exit status {status})", node=rank), rank)
            self._failure(f"node {rank} ended (exit status {status})")

    def _forget(self, node: _Peer, rank: int) -> None:
        node.hello = None
        if self._nodes.get(rank) is node:
            del self._nodes[rank]
        self._drop(node)

    def _lost(self, node: _Peer, why: str) -> None:
        rank = node.hello.node_rank if node.hello is not None else 0
        self._forget(node, rank)
        if self._closed:
            return
        if self._round is not None:
            self._say(f"node {rank} left ({why}); waiting for it to come back")
            return
        self._pass_on(Message(Verb.FAIL, f"it is gone: {why}", node=rank), rank)
        self._failure(f"node {rank} is gone ({why})")

    def _pass_on(self, message: Message, source: int) -> None:
        for rank, node in self._nodes.items():
            if rank != source:
                send(node.sock, message.line())

    def _failure(self, why: str) -> None:
        if self._told:
            return
        self._told = True
        if self._on_failure is not None:
            self._on_failure(why)

    def _tell(self, why: str) -> None:
        if self._told or self._round is not None:
            return
        self._told = True
        self._pass_on(Message(Verb.FAIL, why, node=0), 0)

    def _close(self, status: int) -> None:
        """Say bye; then wait (bounded) until every node hung up, so that no node reads a
        reset instead of the bye (a socket closed with unread data sends one)."""
        self._finish(error=_ENDED)
        for node in self._nodes.values():
            send(node.sock, Message(Verb.BYE, node=0, status=status).line())
            with contextlib.suppress(OSError):
                node.sock.shutdown(socket.SHUT_WR)
        self._closed = True
        deadline = time.monotonic() + HANGUP_S
        while self._nodes and time.monotonic() < deadline:
            for key, _ in self._selector.select(max(0.0, deadline - time.monotonic())):
                if key.data is not self._woken:
                    key.data()
        for rank, node in list(self._nodes.items()):
            self._forget(node, rank)
