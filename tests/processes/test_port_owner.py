"""Who listens on a port (``/proc/net/tcp``, the sockets among a process's descriptors): what
the llama servers' readiness trusts. Real sockets, and a real other process."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys

import pytest

from xpulaunch.processes import procfs
from xpulaunch.processes.ports import PortOwner, reaching, taken

HOLD = """
import socket, sys
s = socket.create_server(("127.0.0.1", 0))
print(s.getsockname()[1], flush=True)
sys.stdin.read()
"""


def test_our_own_listening_socket_is_ours() -> None:
    with socket.create_server(("127.0.0.1", 0)) as sock:
        port = sock.getsockname()[1]
        listening = procfs.listening_sockets(port)
        assert list(listening.values()) == ["127.0.0.1"]
        assert set(listening) <= procfs.socket_inodes(os.getpid())
        assert PortOwner().problem("127.0.0.1", port, os.getpid()) is None
    assert (
        PortOwner().problem("127.0.0.1", port, os.getpid())
        == f"nothing listens on 127.0.0.1:{port} now"
    )


def test_netlink_and_proc_name_the_same_listening_sockets(monkeypatch: pytest.MonkeyPatch) -> None:
    """netlink (sock_diag, asked for listening sockets only) and /proc/net/tcp agree; the
    connections on the port (established, then closing) are not listening sockets."""
    with contextlib.ExitStack() as stack:
        server = stack.enter_context(socket.create_server(("127.0.0.1", 0), backlog=64))
        port = server.getsockname()[1]
        expected = {"127.0.0.1"}
        with contextlib.suppress(OSError):  # a host without IPv6
            stack.enter_context(socket.create_server(("::1", port), family=socket.AF_INET6))
            expected.add("::1")
        for _ in range(40):
            stack.enter_context(socket.create_connection(("127.0.0.1", port)))
            stack.enter_context(server.accept()[0])
        by_netlink = procfs._listening_by_netlink(port)
        assert set(by_netlink.values()) == expected
        assert by_netlink == procfs._listening_in_proc(port) == procfs.listening_sockets(port)
        assert set(by_netlink) <= procfs.socket_inodes(os.getpid())
        # Where netlink cannot be had (a sandbox's kernel refuses the family), /proc is read.
        monkeypatch.setattr(socket, "AF_NETLINK", -1)
        with pytest.raises(OSError):
            procfs._listening_by_netlink(port)
        assert procfs.listening_sockets(port) == by_netlink
    assert procfs.listening_sockets(port) == {}


def test_another_process_on_the_port_is_named() -> None:
    other = subprocess.Popen(
        [sys.executable, "-c", HOLD], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert other.stdout is not None
        port = int(other.stdout.readline())
        problem = PortOwner().problem("127.0.0.1", port, os.getpid())
        assert problem is not None
        assert problem.startswith(
            f"127.0.0.1:{port} is held by pid {other.pid} ({sys.executable} -c import socket, sys"
        )
        assert problem.endswith(f"not by the server started (pid {os.getpid()})")
        assert "\n" not in problem
        assert (taken("127.0.0.1", port) or "").startswith(f"pid {other.pid} (")
    finally:
        other.kill()
        other.wait()


def test_which_listeners_a_connection_may_reach() -> None:
    listening = {
        1: "127.0.0.1",
        2: "0.0.0.0",
        3: "::",
        4: "::ffff:127.0.0.1",
        5: "10.0.0.1",
        6: "::1",
    }
    assert reaching("127.0.0.1", listening) == {1, 2, 3, 4}
    assert reaching("[::1]", listening) == {3, 6}
    assert reaching("localhost", listening) == set(listening)  # a name: any may be it
