"""``xpulaunch top`` with real jobs: ``--once`` as a script reads it, and the live view in a
real terminal (tmux at 80x24) as a person watches it: a job appears on its device when it
starts and goes when it ends, ``q`` quits, and frames after the first are drawn without
clearing the screen (no flicker)."""

from __future__ import annotations

import re
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from helpers import wait_for
from queue_kit import JOB, QueueBox

pytestmark = pytest.mark.slow

CLEARS = (b"\x1b[J", b"\x1b[2J")  # erase the display (terminfo "clear", "ed")


def test_once_prints_devices_holders_and_the_queue(box: QueueBox) -> None:
    first = box.submit("--gpus", "1", *box.audit_job("long", 30))
    second = box.submit("--gpus", "2", *box.audit_job("wide", 0))
    box.wait_states({first: "running", second: "waiting"})
    out = box.cli(
        "top", "--once", "--lock-dir", box.lock_dir, "--inventory", box.inventory, COLUMNS="100"
    ).stdout
    lines = out.splitlines()
    assert lines[0].startswith("xpulaunch top  ") and f"{box.lock_dir} (shared)" in lines[0]
    assert lines[1].split() == ["DEVICE", "MEMORY", "UTIL", "HELD", "BY"]
    assert lines[2].split()[:7] == ["nvidia", "0", "0.0/140.4", "GiB", "0%", "job", str(first)]
    shown = lines[2].split("  root  ", 1)[1]  # the holder's command, cut to the width
    assert shown.endswith("…")
    shown = shown.removesuffix("…")
    assert len(shown) > len("python /") and f"python {JOB} audit {box.audit} long".startswith(shown)
    assert lines[3].split() == ["nvidia", "1", "0.0/140.4", "GiB", "0%", "-"]
    assert lines[4] == "processes: not listed (the devices come from an inventory file)"
    assert lines[6] == "QUEUE: 1 running, 1 waiting"
    assert lines[7].split() == ["ID", "USER", "STATE", "DEVICES", "WAITED", "RUNTIME", "EXIT",
                                "COMMAND"]  # fmt: skip
    assert lines[8].split()[:4] == [str(first), "root", "running", "nvidia"]
    assert lines[9].split()[:3] == [str(second), "root", "waiting"]
    assert lines[10].strip() == f"waiting for 2 devices: nvidia 0 leased by job {first}"
    assert all(len(line) <= 100 for line in lines)


def test_a_pipe_gets_whole_lines(box: QueueBox) -> None:
    """``xpulaunch queue | cat`` and ``top --once | cat`` (no COLUMNS) used to cut every line
    at 80 columns with no mark: a command, a reason, the title."""
    tag = "long-" + "x" * 100
    job = box.submit("--hold", "--gpus", "1", *box.audit_job(tag, 0))
    queue = box.cli("queue", "--lock-dir", box.lock_dir).stdout.splitlines()
    row = next(line for line in queue if line.startswith(str(job)))
    assert row.endswith(f"audit {box.audit} {tag} 0"), row
    top = box.cli("top", "--once", "--lock-dir", box.lock_dir, "--inventory", box.inventory)
    lines = top.stdout.splitlines()
    assert lines[0].endswith("runner: none") or "runner: root pid" in lines[0]
    assert any(line.endswith(f"{tag} 0") for line in lines), lines
    assert "…" not in top.stdout + "\n".join(queue)


class Tmux:
    """A private tmux server (its own socket) with one 80x24 window."""

    def __init__(self, socket: Path) -> None:
        self.socket = str(socket)

    def __call__(self, *args: str) -> str:
        done = subprocess.run(
            ["tmux", "-S", self.socket, "-f", "/dev/null", *args],
            capture_output=True, text=True, timeout=30, check=False,
        )  # fmt: skip
        if done.returncode != 0:
            raise AssertionError(f"tmux {args}: {done.stderr}")
        return done.stdout

    def screen(self) -> list[str]:
        return self("capture-pane", "-p", "-t", "top").splitlines()

    def alive(self) -> bool:
        try:
            self("has-session", "-t", "top")
        except AssertionError:
            return False
        return True


@pytest.fixture
def tmux(box: QueueBox) -> Iterator[Tmux]:
    if shutil.which("tmux") is None:
        pytest.skip("tmux is not installed")
    server = Tmux(box.root / "tmux.sock")
    try:
        yield server
    finally:
        subprocess.run(
            ["tmux", "-S", server.socket, "kill-server"], capture_output=True, check=False
        )


def test_live_view_in_a_real_terminal(box: QueueBox, tmux: Tmux) -> None:
    raw = box.root / "terminal.bytes"
    command = [
        "env", *(f"{k}={v}" for k, v in box.env().items()), "TERM=screen",
        *box.argv("top", "--lock-dir", box.lock_dir, "--inventory", box.inventory,
                  "--interval", "0.2"),
    ]  # fmt: skip
    started_s = time.monotonic()
    tmux("new-session", "-d", "-s", "top", "-x", "80", "-y", "24", "--", *command)
    tmux("pipe-pane", "-t", "top", "-o", f"cat >> {raw}")

    def row(device: str) -> str:
        lines = tmux.screen()
        return next((line for line in lines if line.startswith(device)), "")

    wait_for(lambda: row("nvidia 0").endswith("-"), "top to show the free devices")
    screen = tmux.screen()
    assert len(screen) <= 24 and all(len(line) <= 80 for line in screen)
    assert any(line.startswith("QUEUE: empty") for line in screen)
    job = box.submit("--gpus", "1", *box.audit_job("seen", 2.0))
    holder = wait_for(lambda: f"job {job}  root  python" in row("nvidia 0"), "the job on nvidia 0")
    assert holder
    wait_for(
        lambda: any(ln.split()[:3] == [str(job), "root", "running"] for ln in tmux.screen() if ln),
        "the job running in the queue part",
    )
    wait_for(lambda: row("nvidia 0").endswith("-"), "the device free again once the job ended")
    # The lease ends with the job's processes; the runner records the job as done once it has
    # reaped them, a refresh or two later.
    wait_for(
        lambda: any(line.startswith("QUEUE: empty") for line in tmux.screen()),
        "the queue part empty once the runner recorded the job done",
    )
    time.sleep(0.5)  # a few more refreshes with nothing changing
    tmux("send-keys", "-t", "top", "q")
    wait_for(lambda: not tmux.alive(), "q to quit top")
    # No frame clears the screen (the flicker of a naive redraw), and the refreshes send only
    # what changed: a few screens' worth, and a clock's and a few cells' changes a second,
    # where a full redraw five times a second would send a screen (1,920 cells) each time.
    sent = raw.read_bytes()
    elapsed_s = time.monotonic() - started_s
    assert not any(clear in sent for clear in CLEARS), "the screen was cleared (flicker)"
    assert 0 < len(sent) < 4 * 80 * 24 + 300 * elapsed_s, (len(sent), elapsed_s)


def test_ten_jobs_sharing_devices_keep_every_id_whole_in_a_pipe(box: QueueBox) -> None:
    """Jobs 10 and up sharing a GPU: ``queue``, ``status`` and ``top --once`` written to a pipe
    name every one of them whole (cut at 80 columns, ``shared by job 1`` stood for 11, 12...)."""
    ids = [
        box.submit("--gpus", "1", "--slots-per-gpu", "16", *box.audit_job(f"t{n}", 60.0))
        for n in range(12)
    ]
    waiting = box.submit("--gpus", "2", *box.audit_job("whole", 0.0))
    box.wait_states(dict.fromkeys(ids, "running") | {waiting: "waiting"}, timeout_s=90)
    try:
        at = ("--lock-dir", box.lock_dir)
        outputs = {
            "queue": box.cli("queue", *at).stdout,
            "status": box.cli("status", *at).stdout,
            "top": box.cli("top", "--once", *at, "--inventory", box.inventory).stdout,
        }
        for name in ("queue", "top"):  # every job by its id, whole
            for job in ids:
                found = re.search(rf"\bjob {job}\b|^{job}\b", outputs[name], re.MULTILINE)
                assert found, (name, job, outputs[name])
        for n in range(12):  # status names holders by command: every one whole
            assert f"t{n} 60" in outputs["status"], outputs["status"]
        for name in ("queue", "top"):  # a pipe gets whole lines (a waiter's own message, in
            assert "…" not in outputs[name], outputs[name]  # status, names holders shortly)
    finally:
        box.cli("cancel", "--all", *("--lock-dir", box.lock_dir), check=False)
