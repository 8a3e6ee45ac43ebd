"""What ``xpulaunch top`` shows, as lines of text for a given terminal size: pure, so the
live view, ``--once`` and the tests all draw the same frame.

A frame is the devices (memory, utilisation, who holds each: a queue job, another launch,
the jobs sharing its slots, and processes of anyone else), then the queue. At 80x24 the
devices come first and the queue gets the rows left, with a line saying how many more.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from xpulaunch.cli.terminal import aligned, cut, one_line
from xpulaunch.core.units import format_bytes

MIN_WIDTH = 40
SPARKS = "▁▂▃▄▅▆▇█"
HISTORY_SAMPLES = 300  # five minutes at the default 1 s interval


@dataclass(frozen=True, slots=True)
class ProcessRow:
    """One process on a device: who runs it and for what (a queue job, the model a
    llama-server serves), and its device memory."""

    pid: int
    user: str | None
    owner: str  # "job 17", "model qwen", "xpulaunch (job a1b2)", or "-"
    memory_bytes: int | None
    command: str


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
    processes: tuple[ProcessRow, ...] = ()  # every process on it (probed hosts)
    temperature_celsius: float | None = None
    power_watts: float | None = None
    utilization_history: tuple[float | None, ...] = ()  # oldest first
    memory_history: tuple[float | None, ...] = ()  # fraction in use, oldest first


@dataclass(frozen=True, slots=True)
class Frame:
    """Everything one screen shows."""

    title: str
    devices: tuple[DeviceRow, ...] = ()
    queue_summary: str = ""
    queue_header: tuple[str, ...] = ()
    queue_rows: tuple[tuple[tuple[str, ...], str], ...] = ()  # cells, and why it waits
    notes: tuple[str, ...] = field(default=())
    legend: str = ""  # the live view's keys, drawn last
    extra: tuple[str, ...] = ()  # what a key asked for (help, a prompt): drawn for the queue


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
    head = [Line(frame.title, strong=True), *_device_lines(frame.devices, width)]
    head += [Line(n) for n in frame.notes]
    queue = [Line(t) for t in frame.extra] if frame.extra else _queue_lines(frame)
    tail = [Line(frame.legend, strong=True)] if frame.legend else []
    if height is not None:
        head = head[: max(height - len(tail), 1)]
        room = max(height - len(head) - 1 - len(tail), 0)
        if len(queue) > room:
            hidden = _jobs_in(queue[max(room - 1, 0) :])
            queue = queue[: max(room - 1, 0)]
            if room:
                queue.append(Line(f"... {hidden} more job{'s' if hidden != 1 else ''} below"))
    lines = [*head, Line(""), *queue] if queue else head
    if height is not None and tail:
        lines = [*lines[: height - 1], *tail]
    else:
        lines += tail
    return [Line(cut(one_line(line.text), width).rstrip(), line.strong) for line in lines][:height]


def _device_lines(devices: tuple[DeviceRow, ...], width: int | None = None) -> list[Line]:
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
        readings = _readings(device, width)
        if readings:
            lines.append(Line(" " * (label_w + 2) + readings))
        lines += [Line(" " * (label_w + 2) + _process(p)) for p in device.processes]
    return lines


def _readings(device: DeviceRow, width: int | None) -> str:
    """``util ▁▃▇ mem ▂▂▃  41°C  153 W``: the histories (as many samples as fit) and the
    sensors; empty when there is neither (a single frame of an inventory file)."""
    room = max(((width or 200) - 40) // 2, 8)
    parts = []
    if len(device.utilization_history) > 1:
        parts.append("util " + sparkline(device.utilization_history[-room:], 100.0))
    if len(device.memory_history) > 1:
        parts.append("mem " + sparkline(device.memory_history[-room:], 1.0))
    if device.temperature_celsius is not None:
        parts.append(f"{device.temperature_celsius:.0f}°C")
    if device.power_watts is not None:
        parts.append(f"{device.power_watts:.0f} W")
    return "  ".join(parts)


def sparkline(values: Sequence[float | None], top: float) -> str:
    """One character per value, ``▁`` (0) to ``█`` (``top``); an unknown one is a space."""
    out = []
    for value in values:
        if value is None:
            out.append(" ")
        else:
            step = round(min(max(value / top, 0.0), 1.0) * (len(SPARKS) - 1))
            out.append(SPARKS[step])
    return "".join(out)


def _process(row: ProcessRow) -> str:
    memory = "?" if row.memory_bytes is None else f"{row.memory_bytes / 1024**3:.1f} GiB"
    return f"└ {row.pid:>7}  {row.user or '?':<8}  {row.owner:<10}  {memory:>8}  {row.command}"


class History:
    """Each device's utilisation and memory readings of the last :data:`HISTORY_SAMPLES`
    frames, for the sparklines; one per live view."""

    def __init__(self, samples: int = HISTORY_SAMPLES) -> None:
        self._samples = samples
        self._util: dict[str, deque[float | None]] = {}
        self._memory: dict[str, deque[float | None]] = {}

    def record(
        self, key: str, utilization: float | None, used: int | None, total: int | None
    ) -> None:
        fraction = None if used is None or not total else used / total
        self._util.setdefault(key, deque(maxlen=self._samples)).append(utilization)
        self._memory.setdefault(key, deque(maxlen=self._samples)).append(fraction)

    def of(self, key: str) -> tuple[tuple[float | None, ...], tuple[float | None, ...]]:
        return tuple(self._util.get(key, ())), tuple(self._memory.get(key, ()))


def sorted_processes(rows: Iterable[ProcessRow], by: str) -> tuple[ProcessRow, ...]:
    """Process rows by ``memory`` (most first), ``pid`` or ``user``."""
    if by == "pid":
        return tuple(sorted(rows, key=lambda r: r.pid))
    if by == "user":
        return tuple(sorted(rows, key=lambda r: (r.user or "", r.pid)))
    return tuple(sorted(rows, key=lambda r: (-(r.memory_bytes or 0), r.pid)))


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
