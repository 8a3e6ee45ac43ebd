"""A free TCP port to hand to a process that will listen on it."""

from __future__ import annotations

import errno
import socket
from collections.abc import Collection

from xpulaunch.errors import UsageError


def free_port(
    host: str,
    *,
    option: str,
    hint: str,
    exclude: Collection[int] = (),
    start: int | None = None,
) -> int:
    """A port nobody listens on now for ``host`` (IPv4 or IPv6), not in ``exclude``: any
    (the kernel's choice), or with ``start`` the first from there up.

    Binding port 0 and closing it leaves a window in which another process may take the port
    (torchrun's own ``_get_free_port`` has the same race): whoever binds it must fail clearly,
    and its supervisor moves it or restarts it. A host this machine cannot listen on is a
    one-line error about ``option`` (the parameter that named the host), ending in ``hint``.
    """
    address = host.split(",", maxsplit=1)[0].strip() or "127.0.0.1"
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    tries = range(100) if start is None else range(start, 65536)
    for wanted in tries:
        if start is not None and wanted in exclude:
            continue
        with socket.socket(family, socket.SOCK_STREAM) as sock:
            try:
                sock.bind((address, 0 if start is None else wanted))
            except OSError as exc:
                if start is None or exc.errno != errno.EADDRINUSE:
                    raise _cannot_listen(exc, host, option, hint) from exc
                continue  # someone listens there (or it waits in TIME_WAIT): the next one
            port: int = sock.getsockname()[1]
        if port not in exclude:
            return port
    raise OSError(f"no free port on {address} outside {sorted(exclude)}")


def _cannot_listen(exc: OSError, host: str, option: str, hint: str) -> UsageError:
    # Unresolvable (socket.gaierror), or not this host's address.
    return UsageError(
        f"cannot listen there ({exc.strerror or exc}); {hint}", option=option, value=host
    )


class PortOwner:
    """Whether what listens on a port is the process we started for it, or a process of its
    session (a wrapper script that forks the server): anything else that answers there (a
    program that took the port after a crash, or between the choice of a free port and a late
    bind) is not the server, however well it answers. The listening socket's inode
    (``/proc/net/tcp``) must be among the process's descriptors; it needs no cooperation from
    the server. One per server: a socket found to be ours is not looked up again."""

    def __init__(self) -> None:
        self._known: tuple[int, frozenset[int]] | None = None  # pid, the inodes found ours

    def problem(self, host: str, port: int, pid: int | None) -> str | None:
        """None when every socket listening on ``host:port`` belongs to ``pid`` (or a process
        of its session), or when ``/proc`` cannot tell; else why not, naming the holder."""
        from xpulaunch.processes import procfs

        try:
            listening = reaching(host, procfs.listening_sockets(port))
        except OSError:
            return None  # no /proc/net here: nothing to check against, as before
        where = f"{host}:{port}"
        if not listening:
            return f"nothing listens on {where} now"
        if pid is None:
            return f"{where} is held by {holders(listening)}, and our server has not started"
        if self._known == (pid, listening):
            return None
        ours = procfs.socket_inodes(pid)
        if not listening <= ours:
            ticks = procfs.start_ticks(pid) or 0
            for member in procfs.session_members(pid, ticks):
                ours |= procfs.socket_inodes(member)
        foreign = listening - ours
        if not foreign:
            self._known = (pid, listening)
            return None
        return f"{where} is held by {holders(foreign)}, not by the server started (pid {pid})"


def reaching(host: str, listening: dict[int, str]) -> frozenset[int]:
    """The sockets among ``listening`` (inode -> address) that a connection to ``host`` may
    reach: those bound to its address or to a wildcard (all of them for a name)."""
    import ipaddress

    try:
        target = ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return frozenset(listening)
    found = set()
    for inode, address in listening.items():
        bound = ipaddress.ip_address(address)
        if isinstance(bound, ipaddress.IPv6Address) and bound.ipv4_mapped is not None:
            bound = bound.ipv4_mapped
        # A wildcard of the same family, or IPv6's, which takes IPv4 too unless IPV6_V6ONLY.
        wildcard = bound.is_unspecified and bound.version in (target.version, 6)
        if wildcard or bound == target:
            found.add(inode)
    return frozenset(found)


def holders(inodes: Collection[int]) -> str:
    """``pid 123 (python3 -m http.server 8080)``: who holds these sockets, for a message."""
    from xpulaunch.processes.procfs import command_line, socket_holders

    found = socket_holders(inodes)
    if not found:
        return "a process this user cannot see (another user's)"
    # A command line may hold newlines (python -c "..."): a message is one line.
    return ", ".join(f"pid {pid} ({' '.join(command_line(pid).split())})" for pid in sorted(found))


def taken(host: str, port: int) -> str | None:
    """Who listens on ``host:port`` now (None: nobody, or ``/proc`` cannot tell)."""
    from xpulaunch.processes.procfs import listening_sockets

    try:
        listening = reaching(host, listening_sockets(port))
    except OSError:
        return None
    return holders(listening) if listening else None
