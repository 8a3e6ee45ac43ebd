"""``sd_notify``: tell systemd that a ``Type=notify`` service is ready, without libsystemd.

The protocol (sd_notify(3), "systemd.service" on ``Type=notify``) is one datagram of
newline-separated ``KEY=VALUE`` lines sent to the AF_UNIX socket named in ``NOTIFY_SOCKET``: a
path, or an abstract socket when it starts with ``@``. Without that variable the process is not
under a notify service and nothing is sent, as libsystemd does.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping

NOTIFY_SOCKET = "NOTIFY_SOCKET"


def notify(message: str, env: Mapping[str, str] | None = None) -> bool:
    """Send ``message`` (``READY=1``, ``STATUS=...``) to systemd; False when there is nowhere
    to send it (not a notify service) or the socket refused it."""
    address = (os.environ if env is None else env).get(NOTIFY_SOCKET, "")
    if address.startswith("@"):  # Linux's abstract namespace: a leading NUL byte
        address = "\0" + address[1:]
    elif not address.startswith("/"):  # unset, or vsock:... (a VM's), which we do not speak
        return False
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
            sock.connect(address)
            sock.sendall(message.encode())
    except OSError:
        # systemd gone or the socket not ours to write: the service then times out at start,
        # which systemd reports; the service itself runs on.
        return False
    return True


def ready(status: str, env: Mapping[str, str] | None = None) -> bool:
    """``READY=1`` with a ``STATUS=`` line (``systemctl status`` shows it) and our pid."""
    return notify(f"READY=1\nSTATUS={status}\nMAINPID={os.getpid()}\n", env)
