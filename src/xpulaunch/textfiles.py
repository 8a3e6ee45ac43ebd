"""Reading a document a user names (an inventory, an accelerate config): a regular file, read
up to a limit, so that a FIFO, ``/dev/zero`` or a huge file is refused in one line instead of
hanging or eating memory."""

from __future__ import annotations

import errno
import os
import stat


def read_regular_file(path: str | os.PathLike[str], limit_bytes: int) -> bytes:
    """A regular file's bytes, at most ``limit_bytes`` (+1, so the caller sees it is too big).

    Opened without blocking and checked before reading: a FIFO would block the open (and the
    read) for ever, and ``/dev/zero`` never ends. Raises :class:`OSError` (``EINVAL`` for
    what is not a regular file)."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    with os.fdopen(fd, "rb") as handle:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, "not a regular file")
        return handle.read(limit_bytes + 1)
