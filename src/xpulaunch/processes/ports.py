"""A free TCP port to hand to a process that will listen on it."""

from __future__ import annotations

import socket
from collections.abc import Collection

from xpulaunch.errors import UsageError


def free_port(host: str, *, option: str, hint: str, exclude: Collection[int] = ()) -> int:
    """A port nobody listens on now for ``host`` (IPv4 or IPv6), not in ``exclude``.

    Binding port 0 and closing it leaves a window in which another process may take the port
    (torchrun's own ``_get_free_port`` has the same race): whoever binds it must fail clearly,
    and its supervisor moves it or restarts it. A host this machine cannot listen on is a
    one-line error about ``option`` (the parameter that named the host), ending in ``hint``.
    """
    address = host.split(",", maxsplit=1)[0].strip() or "127.0.0.1"
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    for _ in range(100):
        with socket.socket(family, socket.SOCK_STREAM) as sock:
            try:
                sock.bind((address, 0))
            except OSError as exc:  # unresolvable (socket.gaierror), or not this host's address
                raise UsageError(
                    f"cannot listen there ({exc.strerror or exc}); {hint}",
                    option=option,
                    value=host,
                ) from exc
            port: int = sock.getsockname()[1]
        if port not in exclude:
            return port
    raise OSError(f"no free port on {address} outside {sorted(exclude)}")
