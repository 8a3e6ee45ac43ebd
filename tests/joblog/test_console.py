"""Console streams never block their writer; what did not fit is counted and marked."""

from __future__ import annotations

import os
import re
import threading
import time

from helpers import wait_for
from xpulaunch.joblog.console import Console


def test_a_reader_that_does_not_read_never_blocks_the_writer() -> None:
    read_end, write_end = os.pipe()
    with open(write_end, "wb") as stream:
        console = Console(stream, limit_bytes=10_000)
        started = time.monotonic()
        for i in range(5_000):  # far more than the pipe and the buffer hold
            console.write(f"line {i}\n".encode())
        assert time.monotonic() - started < 30  # it would block for ever otherwise
        assert console.dropped_lines_total > 0
        console.write(b"after the gap\n")  # still too full: dropped too
        received = bytearray()
        reader = threading.Thread(target=lambda: _read_all(read_end, received))
        reader.start()
        console.write(b"")  # the buffer drains in the writer thread; room comes back
        _wait_empty(console)
        console.write(b"last\n")
        console.close()
    reader.join(timeout=30)
    text = received.decode()
    assert text.startswith("line 0\n")
    # One note per gap (the writer thread may make room more than once meanwhile); together
    # they count every dropped line.
    gaps = [int(n) for n in re.findall(r"(\d+) lines of output dropped here", text)]
    assert gaps and sum(gaps) == console.dropped_lines_total
    assert text.endswith("last\n")


def test_a_reader_that_went_away_ends_only_that_stream() -> None:
    read_end, write_end = os.pipe()
    os.close(read_end)
    with open(write_end, "wb") as stream:
        console = Console(stream)
        console.write(b"nobody hears this\n")
        console.close()
        wait_for(lambda: console.broken, "the writer to notice EPIPE")


def _read_all(fd: int, into: bytearray) -> None:
    while chunk := os.read(fd, 65536):
        into.extend(chunk)
    os.close(fd)


def _wait_empty(console: Console) -> None:
    wait_for(lambda: console._buffered_bytes == 0, "the buffer to drain")
