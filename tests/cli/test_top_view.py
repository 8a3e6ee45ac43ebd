"""``xpulaunch top``'s frame as text: what fits at 80x24, and the order of its parts."""

from __future__ import annotations

from xpulaunch.cli.queue_list import queue_text
from xpulaunch.cli.terminal import cut
from xpulaunch.cli.top_view import DeviceRow, Frame, render
from xpulaunch.jobqueue.listing import Snapshot, table_rows
from xpulaunch.jobqueue.policy import Waiter

GIB = 1024**3
HEADER = ("ID", "USER", "STATE", "DEVICES", "WAITED", "RUNTIME", "EXIT", "COMMAND")


def frame(jobs: int, *, holders: tuple[str, ...] = ()) -> Frame:
    rows = []
    for n in range(1, jobs + 1):
        state = "running" if n <= 2 else "queued"
        cells = (str(n), "root", state, "nvidia 0" if n <= 2 else "-", "1s", "2s", "",
                 f"python train.py --seed {n} " + "x" * 60)  # fmt: skip
        rows.append((cells, "" if n <= 2 else f"queued: {n - 3} queued jobs first"))
    devices = (
        DeviceRow("nvidia 0", "NVIDIA H200", 10 * GIB, 140 * GIB, 97.0, holders=holders),
        DeviceRow("nvidia 1", "NVIDIA H200", 0, 140 * GIB, 0.0, others=("pid 9  bob  a.out",)),
    )
    return Frame(
        title="xpulaunch top  12:00:00  /tmp/locks (shared)  runner: root pid 5  q: quit",
        devices=devices,
        queue_summary=f"2 running, {jobs - 2} queued",
        queue_header=HEADER,
        queue_rows=tuple(rows),
    )


def test_a_long_queue_fits_80_by_24_with_the_devices_first() -> None:
    lines = [line.text for line in render(frame(30, holders=("job 1  root  python",)), 80, 24)]
    assert len(lines) == 24
    assert all(len(line) <= 80 for line in lines)
    assert lines[0].startswith("xpulaunch top  12:00:00")
    assert lines[1].split() == ["DEVICE", "MEMORY", "UTIL", "HELD", "BY"]
    assert lines[2].split()[:6] == ["nvidia", "0", "10.0/140.0", "GiB", "97%", "job"]
    assert lines[3].split()[:2] == ["nvidia", "1"] and lines[3].endswith("-")
    assert lines[4].strip() == "other: pid 9  bob  a.out"
    assert lines[6] == "QUEUE: 2 running, 28 queued"
    shown = sum(1 for line in lines[8:] if line[:1].isdigit())
    assert lines[-1] == f"... {30 - shown} more jobs below"


def test_every_holder_of_a_shared_device_gets_a_line() -> None:
    holders = ("slot: job 3  root  a", "slot: job 4  bob  b")
    lines = [line.text for line in render(frame(0, holders=holders), 80, 24)]
    assert lines[2].endswith("slot: job 3  root  a")
    assert lines[3].strip() == "slot: job 4  bob  b"
    assert lines[-1] == "QUEUE: 0 queued" or lines[-1].startswith("QUEUE:")


def test_headers_are_strong_and_nothing_is_cut_without_a_height() -> None:
    lines = render(frame(30), 120)
    assert [line.strong for line in lines[:2]] == [True, True]
    assert sum(1 for line in lines if line.text[:1].isdigit()) == 30
    assert all(len(line.text) <= 120 for line in lines)


def test_an_empty_box() -> None:
    lines = [line.text for line in render(Frame(title="t"), 80, 24)]
    assert lines == ["t", "no devices", "", "QUEUE: empty"]


def test_a_waiting_launchs_command_and_reason_stay_on_their_rows() -> None:
    """Another user's --wait launch writes its own command line and reason; a newline in
    either is shown (\\x0a), not a row of its own, in ``xpulaunch queue`` and in top."""
    waiter = Waiter(77, "bob", 0.0, ("python", "-c", "x\n17  root  running"),
                    "its turn\n18  root  running  nvidia 0")  # fmt: skip
    snapshot = Snapshot("/tmp/locks", True, 10.0, waiters=(waiter,))
    queue = queue_text(snapshot, 200).splitlines()
    shown = Frame(title="top", queue_header=HEADER, queue_rows=tuple(table_rows(snapshot)))
    top = [line.text for line in render(shown, 200)]
    for lines in (queue, top):
        assert not any(line.startswith(("17", "18")) for line in lines), lines
        assert any(line.endswith("python -c 'x\\x0a17  root  running'") for line in lines)
        assert any(line.endswith("its turn\\x0a18  root  running  nvidia 0") for line in lines)


def test_a_cut_line_ends_with_a_mark_and_never_inside_a_number() -> None:
    """``xpulaunch queue`` on an 80-column terminal used to end a reason with ``shared by job
    1`` for jobs 11, 12 and 13; ``top`` its title with ``q: qui``."""
    reason = "waiting for 2 devices: nvidia 1 leased by job 14; nvidia 0 shared by job 11, job 12"
    waiter = Waiter(77, "bob", 0.0, ("python", "sweep.py"), reason)
    snapshot = Snapshot("/tmp/locks", True, 10.0, waiters=(waiter,))
    whole = queue_text(snapshot, None).splitlines()[-1]
    assert whole.endswith(reason)
    ends = set()
    for width in range(60, len(whole) + 2):
        shown = queue_text(snapshot, width).splitlines()[-1]
        assert len(shown) <= width
        if shown == whole:
            continue
        kept = shown.removesuffix("…")
        assert kept != shown and whole.startswith(kept), shown
        assert not (kept[-1].isalnum() and whole[len(kept)].isalnum()), shown  # no "job 1"
        ends.add(kept.rsplit(" ", 1)[-1])
    assert {"14", "job", "11,", "shared"} <= ends, ends
    assert cut("python -c 'import sys; print(1)'", 20) == "python -c 'import…"
    assert cut("a" * 30, 10) == "a" * 9 + "…"  # one word wider than the line: cut in it
    assert cut("short", 5) == "short" and cut("short", None) == "short"


def test_frames_are_not_cut_without_a_width() -> None:
    lines = [line.text for line in render(frame(3), None)]
    assert lines[0].endswith("q: quit")
    assert lines[-1].endswith("x" * 60) or lines[-2].endswith("x" * 60)
    cut_lines = [line.text for line in render(frame(3), 60)]
    assert cut_lines[0].endswith("…") and all(len(line) <= 60 for line in cut_lines)


def test_sparkline_history_and_process_rows() -> None:
    from xpulaunch.cli.top_view import History, ProcessRow, sorted_processes, sparkline

    assert sparkline([0.0, 50.0, 100.0, None, 250.0], 100.0) == "▁▅█ █"
    history = History(samples=3)
    for util in (10.0, 20.0, 30.0, 40.0):
        history.record("k", util, 1, 4)
    assert history.of("k") == ((20.0, 30.0, 40.0), (0.25, 0.25, 0.25))
    rows = (ProcessRow(9, "bob", "-", 1 * GIB, "a"), ProcessRow(3, "al", "job 2", 5 * GIB, "b"))
    assert [r.pid for r in sorted_processes(rows, "memory")] == [3, 9]
    assert [r.pid for r in sorted_processes(rows, "pid")] == [3, 9]
    assert [r.user for r in sorted_processes(rows, "user")] == ["al", "bob"]
    device = DeviceRow(
        "amd 0",
        None,
        0,
        64 * GIB,
        5.0,
        processes=rows,
        temperature_celsius=41.0,
        power_watts=153.4,
        utilization_history=(0.0, 100.0),
        memory_history=(0.0, 0.5),
    )
    lines = [line.text for line in render(Frame("t", devices=(device,), legend="keys"), 80, 10)]
    assert lines[3].split() == ["util", "▁█", "mem", "▁▅", "41°C", "153", "W"]
    assert lines[4].split() == ["└", "9", "bob", "-", "1.0", "GiB", "a"]
    assert lines[-1] == "keys"


def test_keys() -> None:
    from xpulaunch.cli.top_keys import Action, View, keeps, on_key

    def press(view: View, keys: str) -> tuple[View, Action | None]:
        action = None
        for key in keys:
            view, action = on_key(view, key)
        return view, action

    assert press(View(), "q") == (View(), Action("quit"))
    assert press(View(), "ss")[0].sort == "user"
    view, _ = press(View(), "fmine\n")
    assert (
        view.filter == "mine" and keeps(view, "al", "-", "al") and not keeps(view, "bo", "-", "al")
    )
    view, _ = press(View(), "f17\n")
    assert view.filter == "job 17" and keeps(view, "x", "job 17", "al")
    assert press(View(), "f17\x1b")[0] == View()  # Esc leaves the prompt
    assert press(View(), "fq")[0].typed == "q"  # q is typed into a prompt, not quitting
    assert press(View(), "c12\ny") == (View(), Action("cancel", 12))
    assert press(View(), "c12\nn")[0].message == "job 12 not cancelled"
    assert press(View(), "cx\n")[0].message == "x: not a job id"
    assert press(View(), "\t")[0].queue is False and press(View(), "?x")[0] == View()
    assert press(View(), "c12\n")[0].legend() == "cancel job 12? y/n"
