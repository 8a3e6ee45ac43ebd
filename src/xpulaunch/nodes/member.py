"""The nodes of a static job: they meet before the workers start, stay in touch while the
workers run, and meet again before every restart.

Before the workers start. A wrong ``--master-addr`` or a closed port otherwise shows up as
workers hanging in ``init_process_group`` until gloo's or NCCL's own timeout
(pytorch/pytorch#107021, #69197). So node 0 listens on the master port, every other node
connects and says who it is and how many workers it runs; node 0 answers ``here`` at once and
``go`` with every node's worker count once all of them are in and still connected (a node
that went away after its hello is dropped, and its replacement takes its rank). Then node 0
stops listening and the workers start, rank 0's TCPStore binding that same port (its
``SO_REUSEADDR`` lets it while the meeting's connections stay open there). The rendezvous
itself is torch's (``MASTER_ADDR``/``MASTER_PORT``, ``env://``); the counts give each node
the global ranks of its workers (:func:`xpulaunch.core.plan.with_layout`).

While they run. The connections stay open, node 0 the hub (:mod:`xpulaunch.nodes.hub`).
NCCL does not fail a collective when a peer dies (only its watchdog does, many minutes
later), so a node cannot count on seeing another node's failure in its own workers: a node
whose workers fail, or that is stopped, says so at once, node 0 passes it on, and every node
fails its own workers (``on_failure``), restarting them or giving up by its restart policy.
A node that dies is seen by the others when its connection closes (the kernel closes it for a
killed process; TCP keepalive, a few seconds, for a machine that is gone).

Before a restart (the supervisor's ``settle`` hook, :mod:`xpulaunch.launch.run`), every node
says ``ready`` once its old workers are gone, and node 0 says ``go`` once every node has: no
node starts its new workers while another node's old ones (the old round's TCPStore on node
0's port among them) are still there. A node that gave up says ``bye`` and the others fail
at once instead of waiting ``--join-timeout`` for it; one that died may come back (a
restarted pod) and take its old rank at the next meeting.

Messages: :mod:`xpulaunch.nodes.protocol`. A meeting that fails raises
:class:`~xpulaunch.errors.NodesError` (exit status 125).
"""

from __future__ import annotations

import contextlib
import queue
import socket
import threading
import time

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
    MAX_LINE_BYTES,
    Hello,
    Message,
    Verb,
    counts_text,
    read_message,
    shown,
)
from xpulaunch.processes.signals import wait_answering

_POLL_S = 0.5  # how long one connect() may take before the deadline is checked again
_ACK_S = 5.0  # a listener that has not said ``here`` by then is not node 0's meeting
# Waits between connection attempts, then the last one on and on. Nobody listening yet: node 0
# is still starting, and a refused connection costs one round trip, so look again soon (every
# 0.5 s, the nodes' starts lined up badly and node 1 lost up to that much); a listener that is
# not node 0's meeting (the old round's TCPStore) is asked less often.
_REFUSED_S = (0.01,) * 50 + (0.05,) * 30 + (0.2, 0.5)
_RETRY_S = (0.02, 0.05, 0.1, 0.2, 0.5)


def open_link(meeting: Meeting, say: Say, on_failure: OnFailure | None) -> NodeLink:
    """Node 0's hub or another node's link to it; nothing is connected before :meth:`meet`."""
    if meeting.node_rank == 0:
        from xpulaunch.nodes.hub import Hub

        return Hub(meeting, say, on_failure)
    return Member(meeting, say, on_failure)


class LineReader:
    """Lines from one socket; what it read past a line stays for the next call."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buffer = b""

    def readline(self, timeout_s: float | None = None) -> str | None:
        """The next line; None at the end of the stream, on an error or a timeout, or when a
        line grows past :data:`MAX_LINE_BYTES`."""
        self.sock.settimeout(timeout_s)
        while b"\n" not in self.buffer:
            if len(self.buffer) > MAX_LINE_BYTES:
                return None
            try:
                chunk = self.sock.recv(65536)
            except OSError:
                return None
            if not chunk:
                return None
            self.buffer += chunk
        line, _, self.buffer = self.buffer.partition(b"\n")
        return line.decode("ascii", "replace").strip()


class Member(NodeLink):
    """Node 1 and up: one connection to node 0, kept for the job's life, and a thread that
    reads it."""

    def __init__(self, meeting: Meeting, say: Say, on_failure: OnFailure | None) -> None:
        self._meeting, self._say, self._on_failure = meeting, say, on_failure
        self._where = f"{meeting.master_addr}:{meeting.master_port}"
        self._lock = threading.Lock()
        self._sock: socket.socket | None = None
        self._reader_thread: threading.Thread | None = None
        self._replies: queue.Queue[Message | None] = queue.Queue()
        self._in_meeting = False
        self._told = False  # a failure of this run was told or heard already
        self._closing = False
        self._hub_status: int | None = None  # node 0's own end (its ``bye``)

    # -- meeting -----------------------------------------------------------------------
    def meet(self) -> tuple[int, ...]:
        meeting = self._meeting
        deadline = time.monotonic() + meeting.timeout_s
        with self._lock:
            self._in_meeting = True
        try:
            counts = self._meet(deadline)
        finally:
            with self._lock:
                self._in_meeting = False
        with self._lock:
            self.counts, self._told = counts, False
        self._say(f"all {meeting.nnodes} nodes are here: {counts_text(counts)}; starting")
        return counts

    def _meet(self, deadline: float) -> tuple[int, ...]:
        with contextlib.suppress(queue.Empty):
            while True:  # what an earlier connection left: its end (node 0's bye is kept)
                self._replies.get_nowait()
        self._gave_up_check()
        if self._sock is not None and send(self._sock, Message(Verb.READY).line()):
            node = f"node {self._meeting.node_rank} of {self._meeting.nnodes}"
            self._say(f"{node}: ready to start again; waiting for the other nodes")
        else:
            self._hang_up()
        while True:
            self._gave_up_check()  # node 0 said bye: it will not come back by itself
            if self._sock is None:  # closed: node 0 may come back (a restarted node 0)
                self._join(deadline)
            counts = self._await_go(deadline)
            if counts is not None:
                return counts

    def _gave_up_check(self) -> None:
        if self._hub_status is not None:
            raise NodesError(
                f"node 0 ended (exit status {self._hub_status}); the job cannot start again "
                "without it"
            )

    def _await_go(self, deadline: float) -> tuple[int, ...] | None:
        """Every node's count from node 0's ``go``; None when the connection closed first."""

        def reply(timeout_s: float | None) -> Message | str | None:
            left = deadline - time.monotonic()
            if left <= 0:
                return "timed out"
            try:
                found = self._replies.get(
                    timeout=left if timeout_s is None else min(left, timeout_s)
                )
            except queue.Empty:
                return None
            return "closed" if found is None else found

        got = wait_answering(reply)
        if got == "timed out":
            raise NodesError(
                f"node 0 at {self._where} did not start the job within "
                f"{self._meeting.timeout_s:g} s: it is still waiting for other nodes "
                "(--join-timeout sets the wait)"
            )
        if not isinstance(got, Message):
            return None
        if got.verb is Verb.REFUSED:
            raise NodesError(f"node 0 at {self._where}: {got.text}")
        if got.verb is Verb.BYE:
            self._gave_up_check()
        return got.counts or None

    def _join(self, deadline: float) -> None:
        """Connect to node 0 and introduce this node, retrying until ``deadline``; once it
        says ``here``, a thread reads the connection for the job's life."""
        meeting = self._meeting
        self._say(f"node {meeting.node_rank} of {meeting.nnodes}: reaching node 0 at {self._where}")
        hello = Hello(meeting.node_rank, meeting.nnodes, meeting.nproc, meeting.note).line()
        last, wait, refusals, strangers = "no answer", 0.0, 0, 0
        while True:
            time.sleep(wait)
            if time.monotonic() >= deadline:
                break
            try:
                sock = socket.create_connection(
                    (meeting.master_addr, meeting.master_port), timeout=_POLL_S * 4
                )
            except OSError as exc:  # node 0 is not listening (yet, or again)
                last, refusals = exc.strerror or str(exc), refusals + 1
                wait = _REFUSED_S[min(refusals, len(_REFUSED_S)) - 1]
                continue
            reader = LineReader(sock)
            answer = self._hello(reader, hello, deadline)
            if answer == "here":
                self._keep(reader)
                return
            sock.close()
            if answer is not None:
                raise NodesError(f"node 0 at {self._where}: {answer}")
            # Not node 0's meeting: the old round's store, still dying, or node 0 between
            # meetings (it admits nodes only while they meet).
            last, strangers = "the port answers, but not as an xpulaunch node 0", strangers + 1
            wait = _RETRY_S[min(strangers, len(_RETRY_S)) - 1]
        raise NodesError(
            f"cannot reach node 0 at {self._where} within {meeting.timeout_s:g} s ({last}); "
            "check --master-addr/--master-port (the same on every node) and that the port is "
            "open"
        )

    @staticmethod
    def _hello(reader: LineReader, hello: str, deadline: float) -> str | None:
        """``here``, or why node 0 refused (a line to fail with), or None when the listener
        is not node 0's meeting (it said nothing in time, or hung up): the caller retries."""
        if not send(reader.sock, hello):
            return None
        first = reader.readline(max(0.1, min(_ACK_S, deadline - time.monotonic())))
        if first is None or first == "here" or first.startswith("refused:"):
            return first
        if first and all(" " <= c <= "~" for c in first):  # a foreign program's answer
            return f"the port answers, but not as an xpulaunch node 0 (it said {shown(first)})"
        return None

    def _keep(self, reader: LineReader) -> None:
        tune(reader.sock)
        with self._lock:
            self._sock = reader.sock
        self._reader_thread = threading.Thread(
            target=self._read, args=(reader,), name="xpulaunch-nodes", daemon=True
        )
        self._reader_thread.start()

    # -- the job's life ----------------------------------------------------------------
    def _read(self, reader: LineReader) -> None:
        """The connection's reader, until node 0 says ``bye`` or the connection closes."""
        why = "its connection closed"
        while True:
            line = reader.readline()
            if line is None:
                break
            message = read_message(line, self._meeting.nnodes)
            if message is None:
                why = f"it sent a garbled message ({shown(line)})"
                break
            if message.verb is Verb.FAIL:
                self._failure(f"node {message.node} failed ({message.text})")
            elif message.verb is Verb.BYE:
                self._hub_status = message.status
                if message.status != 0:
                    self._failure(f"node 0 ended (exit status {message.status})")
                self._replies.put(message)
                why = ""
                break
            else:  # go, or refused: the meeting's answers
                self._replies.put(message)
        with self._lock:
            if self._sock is reader.sock:
                self._sock = None
            closing = self._closing
        reader.sock.close()
        self._replies.put(None)
        if why and not closing:
            self._failure(f"node 0 is gone ({why})")

    def _failure(self, why: str) -> None:
        with self._lock:
            if self._told or self._in_meeting or self._closing:
                return
            self._told = True
        if self._on_failure is not None:
            self._on_failure(why)

    def tell(self, why: str) -> None:
        with self._lock:
            if self._told or self._in_meeting or self._sock is None:
                return
            self._told = True
            sock = self._sock
        send(sock, Message(Verb.FAIL, why, node=self._meeting.node_rank).line())

    def _hang_up(self) -> None:
        with self._lock:
            sock, self._sock = self._sock, None
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)  # the reader thread sees the end and closes it

    def close(self, status: int) -> None:
        with self._lock:
            self._closing = True
            sock = self._sock
        if sock is not None:
            send(sock, Message(Verb.BYE, node=self._meeting.node_rank, status=status).line())
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_WR)  # node 0 reads the bye, then hangs up
        if self._reader_thread is not None:
            self._reader_thread.join(HANGUP_S)
        self._hang_up()
