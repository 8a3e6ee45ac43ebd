"""Line splitting, prefixes, colour, console filters, per-attempt files and tails."""

from __future__ import annotations

import io
import os
import re
from pathlib import Path

import pytest

from xpulaunch.joblog.logs import MAX_LINE_BYTES, LineBuffer, LogConfig, LogSink, log_stamp

STAMP = re.compile(rb"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z ", re.MULTILINE)


def unstamped(path: Path) -> bytes:
    """A log file's bytes without the time stamp each of its lines starts with."""
    data = path.read_bytes()
    assert len(STAMP.findall(data)) == data.count(b"\n")
    return STAMP.sub(b"", data)


def test_line_buffer_keeps_partial_lines() -> None:
    buffer = LineBuffer()
    assert buffer.feed(b"ab") == []
    assert buffer.feed(b"c\nde\n\nf") == [b"abc", b"de", b""]
    assert buffer.flush() == [b"f"]
    assert buffer.flush() == []


def test_line_buffer_bounds_runaway_lines() -> None:
    buffer = LineBuffer()
    pieces = buffer.feed(b"x" * (2 * MAX_LINE_BYTES + 5))
    assert [len(p) for p in pieces] == [MAX_LINE_BYTES, MAX_LINE_BYTES]
    assert buffer.flush() == [b"x" * 5]


def sink(config: LogConfig, names: list[str]) -> tuple[LogSink, io.BytesIO, io.BytesIO]:
    out, err = io.BytesIO(), io.BytesIO()
    return LogSink(config, names, out=out, err=err), out, err


def test_prefix_is_padded_and_streams_are_kept_apart() -> None:
    logs, out, err = sink(LogConfig(color=False), ["0", "10"])
    logs.write("0", False, [b"hello", b"world"])
    logs.write("10", True, [b"oops"])
    assert out.getvalue() == b"[0]  hello\n[0]  world\n"
    assert err.getvalue() == b"[10] oops\n"


def test_colour_wraps_only_the_prefix() -> None:
    logs, out, _ = sink(LogConfig(color=True), ["0", "1"])
    logs.write("0", False, [b"a"])
    logs.write("1", False, [b"b"])
    assert out.getvalue() == b"\x1b[36m[0]\x1b[0m a\n\x1b[33m[1]\x1b[0m b\n"


@pytest.mark.parametrize(("no_color", "coloured"), [(None, True), ("1", False)])
def test_colour_auto_follows_the_terminal_and_no_color(
    monkeypatch: pytest.MonkeyPatch, no_color: str | None, coloured: bool
) -> None:
    if no_color is None:
        monkeypatch.delenv("NO_COLOR", raising=False)
    else:
        monkeypatch.setenv("NO_COLOR", no_color)
    master, replica = os.openpty()
    with open(replica, "wb", buffering=0) as tty:
        logs = LogSink(LogConfig(), ["0"], out=tty, err=tty)
        logs.write("0", False, [b"x"])
        data = os.read(master, 1024)
    os.close(master)
    assert (b"\x1b[" in data) is coloured


def test_colour_auto_is_off_for_pipes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NO_COLOR", raising=False)
    logs, out, _ = sink(LogConfig(), ["0"])
    logs.write("0", False, [b"x"])
    assert out.getvalue() == b"[0] x\n"


def test_console_filter_and_tails() -> None:
    logs, out, _ = sink(LogConfig(color=False, console_names=frozenset({"1"})), ["0", "1"])
    logs.write("0", False, [b"hidden"])
    logs.write("0", True, [b"hidden error"])
    logs.write("1", False, [b"shown"])
    assert out.getvalue() == b"[1] shown\n"
    assert logs.tail("0") == ["hidden", "hidden error"]  # tails keep every worker
    assert logs.tail("0", stderr_only=True) == ["hidden error"]
    assert logs.tail("0", 1) == ["hidden error"]
    assert logs.tail("0", 0) == []


def test_log_file_lines_carry_the_time_they_were_read(tmp_path: Path) -> None:
    logs = LogSink(
        LogConfig(log_dir=tmp_path, console=False), ["w"], wall_clock=lambda: 1.5e9 + 0.25
    )
    logs.open_attempt("w", 0)
    logs.write("w", False, [b"one", b"two"])
    logs.close()
    written = (tmp_path / "attempt_0" / "w.log").read_bytes()
    assert written == b"2017-07-14T02:40:00.250Z one\n2017-07-14T02:40:00.250Z two\n"
    assert log_stamp(0.0) == b"1970-01-01T00:00:00.000Z "


def test_files_per_attempt(tmp_path: Path) -> None:
    logs, _, _ = sink(LogConfig(log_dir=tmp_path, console=False), ["w"])
    first = logs.open_attempt("w", 0)
    logs.write("w", False, [b"one"])
    second = logs.open_attempt("w", 1)
    logs.write("w", True, [b"two"])
    logs.close()
    assert first == tmp_path / "attempt_0" / "w.log"
    assert second == tmp_path / "attempt_1" / "w.log"
    assert unstamped(first) == b"one\n"
    assert unstamped(second) == b"two\n"


def test_a_closed_console_does_not_stop_logging(tmp_path: Path) -> None:
    class Broken(io.BytesIO):
        def write(self, data: object) -> int:
            raise BrokenPipeError

    logs = LogSink(LogConfig(log_dir=tmp_path, color=False), ["w"], out=Broken(), err=Broken())
    logs.open_attempt("w", 0)
    logs.write("w", False, [b"still logged"])
    logs.write("w", False, [b"and again"])
    logs.message("summary")
    logs.close()
    assert unstamped(tmp_path / "attempt_0" / "w.log") == b"still logged\nand again\n"


def test_message_goes_to_stderr() -> None:
    logs, out, err = sink(LogConfig(), ["0"])
    logs.message("worker 0 failed")
    assert (out.getvalue(), err.getvalue()) == (b"", b"xpulaunch: worker 0 failed\n")
