"""What ``xpulaunch top`` shows, as lines of text for a given terminal size: pure, so the
live view, ``--once`` and the tests all draw the same frame.

A frame is the devices (memory, utilisation, who holds each: a queue job, another launch,
the jobs sharing its slots, and processes of anyone else), then the queue. At 80x24 the
devices come first and the queue gets the rows left, with a line saying how many more.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from xpulaunch.cli.terminal import aligned, cut, one_line
from xpulaunch.core.units import format_bytes

MIN_WIDTH = 40


@dataclass(frozen=True, slots=True)
class DeviceRow:
    """One device: its short label (``nvidia 0``), readings and who uses it."""

    label: str
    name: str | None = None
    memory_used_bytes: int | None = None
    memory_total_bytes: int | None = None
    utilization_percent: float | None = None
    holders: tuple[str, ...] = ()  # "job 17 root python train.py", one per lease or slot
    others: tuple[str, ...] = ()  # processes of no lease: "pid 99 bob python x.py 2.0 GiB"


@dataclass(frozen=True, slots=True)
class Frame:
    """Everything one screen shows."""

    title: str
    devices: tuple[DeviceRow, ...] = ()
    queue_summary: str = ""
    queue_header: tuple[str, ...] = ()
    queue_rows: tuple[tuple[tuple[str, ...], str], ...] = ()  # cells, and why it waits
    notes: tuple[str, ...] = field(default=())


@dataclass(frozen=True, slots=True)
class Line:
    text: str
    strong: bool = False  # a header: drawn bold


def render(frame: Frame, width: int | None, height: int | None = None) -> list[Line]:
    """The frame as at most ``height`` lines (None: all of them) of at most ``width``
    characters (None: whole lines; a cut one ends with ``…``), control characters shown
    (:func:`~xpulaunch.cli.terminal.one_line`: device names and other users' command lines
    are not the terminal's to act on, nor to break a row in two)."""
    width = None if width is None else max(width, MIN_WIDTH)
    head = [Line(frame.title, strong=True), *_device_lines(frame.devices)]
    head += [Line(n) for n in frame.notes]
    queue = _queue_lines(frame)
    if height is not None:
        room = max(height - len(head) - 1, 0)
        if len(queue) > room:
            hidden = _jobs_in(queue[max(room - 1, 0) :])
            queue = queue[: max(room - 1, 0)]
            if room:
                queue.append(Line(f"... {hidden} more job{'s' if hidden != 1 else ''} below"))
    lines = [*head, Line(""), *queue] if queue else head
    return [Line(cut(one_line(line.text), width).rstrip(), line.strong) for line in lines][:height]


def _device_lines(devices: tuple[DeviceRow, ...]) -> list[Line]:
    if not devices:
        return [Line("no devices")]
    label_w = max(len("DEVICE"), *(len(d.label) for d in devices))
    lines = [Line(f"{'DEVICE':<{label_w}}  {'MEMORY':<17}  {'UTIL':>4}  HELD BY", strong=True)]
    pad = " " * (label_w + 2 + 17 + 2 + 4 + 2)
    for device in devices:
        util = device.utilization_percent
        util_text = "?" if util is None else f"{util:.0f}%"
        holders = device.holders or ("-",)
        first = f"{device.label:<{label_w}}  {_memory(device):<17}  {util_text:>4}  {holders[0]}"
        lines.append(Line(first))
        lines += [Line(pad + holder) for holder in holders[1:]]
        lines += [Line(pad + "other: " + other) for other in device.others]
    return lines


def _memory(device: DeviceRow) -> str:
    used, total = device.memory_used_bytes, device.memory_total_bytes
    if total is None:
        return "?"
    gib = 1024**3
    used_text = "?" if used is None else f"{used / gib:.1f}"
    return f"{used_text}/{format_bytes(total)}"


def _queue_lines(frame: Frame) -> list[Line]:
    if not frame.queue_rows:
        return [Line(f"QUEUE: {frame.queue_summary or 'empty'}", strong=True)]
    header, *table = aligned([frame.queue_header, *(row for row, _ in frame.queue_rows)])
    lines = [Line(f"QUEUE: {frame.queue_summary}", strong=True), Line(header, strong=True)]
    for line, (_, reason) in zip(table, frame.queue_rows, strict=True):
        lines.append(Line(line))
        if reason:
            lines.append(Line("      " + reason))
    return lines


def _jobs_in(lines: list[Line]) -> int:
    """Job rows among ``lines`` (reason lines are indented)."""
    return sum(1 for line in lines if line.text and not line.text.startswith(" "))
