"""How soon a node that started before node 0 meets it, once node 0 listens: the pre-flight's
retries of a refused connection (real sockets on loopback, both nodes in threads here)."""

from __future__ import annotations

import socket
import threading
import time

import pytest

from xpulaunch.nodes import member as nodes
from xpulaunch.nodes.link import Meeting


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


def test_a_node_ahead_of_node_0_meets_it_soon_after_it_listens() -> None:
    """Node 1 is refused for 0.9 s. With waits that grew to 0.5 s it tried again only 0.47 s
    after node 0 listened; a refused connection is now retried every 10 ms at first."""
    port = _free_port()
    listening: list[float] = []
    met: list[float] = []
    errors: list[BaseException] = []

    def node(rank: int) -> None:
        meeting = Meeting(nnodes=2, node_rank=rank, master_addr="127.0.0.1",
                          master_port=port, timeout_s=30)  # fmt: skip

        def say(line: str) -> None:
            if line.startswith("waiting for"):
                listening.append(time.monotonic())

        link = nodes.open_link(meeting, say, None)
        try:
            link.meet()
        except BaseException as exc:  # reported below, not lost in the thread
            errors.append(exc)
        finally:
            link.close(0)
        if rank == 1:
            met.append(time.monotonic())

    joiner = threading.Thread(target=node, args=(1,))
    joiner.start()
    time.sleep(0.9)  # node 0 starts late: node 1 has been refused for a while
    host = threading.Thread(target=node, args=(0,))
    host.start()
    joiner.join(30)
    host.join(30)
    assert not errors, errors
    assert listening and met
    # Generous for a loaded 2-core machine; the old retry waits made it 0.47 s here.
    assert met[0] - listening[0] < 0.3, met[0] - listening[0]


def test_a_listener_that_is_not_node_0_is_asked_less_often(monkeypatch: pytest.MonkeyPatch) -> None:
    """Refused connections are retried quickly; a port that answers but is not node 0's
    meeting (the old round's TCPStore) is asked with growing waits, so that its logs do
    not fill with our hellos."""
    waits: list[float] = []
    outcomes = iter(["refused"] * 3 + ["stranger"] * 3 + ["ok"])

    def connect(address: object, timeout: float) -> socket.socket:
        if next(outcomes) == "refused":
            raise ConnectionRefusedError(111, "Connection refused")
        a, b = socket.socketpair()
        b.close()
        return a

    answers = iter([None, None, None, "here"])
    monkeypatch.setattr(nodes.socket, "create_connection", connect)
    monkeypatch.setattr(nodes.Member, "_hello", staticmethod(lambda *args: next(answers)))
    monkeypatch.setattr(nodes.time, "sleep", waits.append)
    meeting = Meeting(nnodes=2, node_rank=1, master_addr="127.0.0.1", master_port=1,
                      timeout_s=30)  # fmt: skip
    member = nodes.Member(meeting, lambda line: None, None)
    monkeypatch.setattr(member, "_keep", lambda reader: reader.sock.close())
    member._join(time.monotonic() + 30)
    assert waits == [0.0, 0.01, 0.01, 0.01, 0.02, 0.05, 0.1]
