"""``xpulaunch top`` as people keep it open, in tmux at 80x24 and 200x50 on a fake host
(its sysfs and /proc: AMD cards and DRM clients), every key through ``send-keys``: process
rows under each device with the queue job (or the model) they belong to, the utilisation and
memory history, sort, filter, the queue hidden and shown, cancelling one's job, help, quit."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from helpers import wait_for
from queue_kit import QueueBox

sys.path.insert(0, str(Path(__file__).parents[1] / "probing"))
from probe_fakes import FakeMachine, mi300x_host
from test_gpu_processes import AMDGPU_OLD, _process

pytestmark = pytest.mark.slow


class Tmux:
    def __init__(self, socket: Path) -> None:
        self.socket = str(socket)

    def __call__(self, *args: str) -> str:
        done = subprocess.run(
            ["tmux", "-S", self.socket, "-f", "/dev/null", *args],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        assert done.returncode == 0, f"tmux {args}: {done.stderr}"
        return done.stdout

    def screen(self) -> list[str]:
        return self("capture-pane", "-p", "-t", "top").splitlines()

    def shows(self, text: str) -> bool:
        return any(text in line for line in self.screen())

    def alive(self) -> bool:
        done = subprocess.run(
            ["tmux", "-S", self.socket, "has-session", "-t", "top"],
            capture_output=True,
            check=False,
        )
        return done.returncode == 0

    def keys(self, *keys: str) -> None:
        self("send-keys", "-t", "top", *keys)


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


@pytest.mark.parametrize(("columns", "rows"), [(80, 24), (200, 50)])
def test_keys_process_rows_and_history(box: QueueBox, tmux: Tmux, columns: int, rows: int) -> None:
    m = FakeMachine(box.root / "host")
    mi300x_host(m)
    host = {"XPULAUNCH_SYSFS_ROOT": str(m.sys), "XPULAUNCH_PROCFS_ROOT": str(m.proc)}
    # A queue job running on the fake host's amd 0; its worker's XPULAUNCH_JOB_ID goes into
    # a DRM client of the fake /proc, as a real worker's would be read there.
    said = box.root / "lease-job"
    code = f"import os, time; open({str(said)!r}, 'w').write(os.environ['XPULAUNCH_JOB_ID'])"
    job = ["--", sys.executable, "-c", code + "; time.sleep(120)"]
    done = box.cli("submit", "--lock-dir", box.lock_dir, "--gpus", "1", *job, **host)
    running = int(done.stdout)
    lease_job = wait_for(lambda: said.exists() and said.read_text(), "the job's worker")
    _process(m, 4242, {3: AMDGPU_OLD}, {"XPULAUNCH_JOB_ID": lease_job})
    _process(m, 4343, {3: AMDGPU_OLD}, {})
    (m.proc / "4343" / "cmdline").write_bytes(b"llama-server\0--alias\0qwen\0-m\0q.gguf\0")
    held = box.submit("--hold", "--", "true")  # one to cancel from the view
    top = box.argv("top", "--lock-dir", box.lock_dir, "--interval", "0.3")
    command = ["env", *(f"{k}={v}" for k, v in box.env(**host).items()), "TERM=screen", *top]
    tmux("new-session", "-d", "-s", "top", "-x", str(columns), "-y", str(rows), "--", *command)

    def row(pid: str) -> list[str]:
        return next((ln.split() for ln in tmux.screen() if f" {pid} " in f"{ln} "), [])

    wait_for(lambda: row("4242")[:4] == ["└", "4242", "root", "job"], "a process row")
    assert row("4242")[4] == str(running)  # the queue job its lease belongs to
    assert row("4343")[3:5] == ["model", "qwen"]  # what a llama-server serves
    wait_for(lambda: tmux.shows("util ▁▁"), "a history of two samples or more")
    screen = tmux.screen()
    assert len(screen) <= rows and all(len(line) <= columns for line in screen)
    legend = [line for line in screen if line][-1]  # the keys, at the bottom
    assert legend == "[sort: memory]  q quit  s sort  f filter  Tab queue  c cancel a job  ? help"
    tmux.keys("s")
    wait_for(lambda: tmux.shows("[sort: pid]"), "s to sort by pid")
    tmux.keys("f")
    tmux.keys("-l", "nobody")
    tmux.keys("Enter")
    wait_for(lambda: tmux.shows("filter: nobody]") and not row("4242"), "f to filter")
    tmux.keys("f", "Enter")
    wait_for(lambda: row("4242") != [], "an empty filter to show everyone")
    tmux.keys("Tab")
    wait_for(lambda: tmux.shows("(queue hidden: Tab shows it)"), "Tab to hide the queue")
    tmux.keys("Q")
    wait_for(lambda: tmux.shows("QUEUE:"), "Q to show it again")
    tmux.keys("?")
    wait_for(lambda: tmux.shows("KEYS"), "? for help")
    tmux.keys("x")
    wait_for(lambda: not tmux.shows("KEYS"), "any key to leave the help")
    tmux.keys("c")
    tmux.keys("-l", str(held))
    tmux.keys("Enter")
    wait_for(lambda: tmux.shows(f"cancel job {held}? y/n"), "the confirmation")
    tmux.keys("y")
    wait_for(lambda: tmux.shows(f"job {held}: cancelled"), "the cancel's result")
    state = json.loads(box.cli("queue", "--lock-dir", box.lock_dir, "-a", "--json").stdout)
    assert {j["id"]: j["state"] for j in state["jobs"]}[held] == "cancelled"
    tmux.keys("q")
    wait_for(lambda: not tmux.alive(), "q to quit")
    box.cli("cancel", "--lock-dir", box.lock_dir, str(running))


def test_once_json_for_scripts(box: QueueBox) -> None:
    m = FakeMachine(box.root / "host")
    mi300x_host(m)
    _process(m, 4343, {3: AMDGPU_OLD}, {})
    folder = m.sys / "bus" / "pci" / "devices" / "0000:0c:00.0" / "hwmon" / "hwmon1"
    folder.mkdir(parents=True)
    (folder / "temp1_input").write_text("41000\n")
    held = box.submit("--hold", "--", "true")
    host = {"XPULAUNCH_SYSFS_ROOT": str(m.sys), "XPULAUNCH_PROCFS_ROOT": str(m.proc)}
    out = box.cli("top", "--once", "--json", "--lock-dir", box.lock_dir, **host).stdout
    document = json.loads(out)
    assert document["schema"] == "xpulaunch.top/1"
    first, second = document["devices"]
    assert (first["device"], first["temperature_celsius"], first["power_watts"]) == (
        "amd 0",
        41.0,
        None,
    )
    assert [(p["pid"], p["user"], p["owner"]) for p in first["processes"]] == [(4343, "root", "-")]
    assert second["processes"] == [] and second["temperature_celsius"] is None
    assert [(j["ID"], j["STATE"]) for j in document["queue"]] == [(str(held), "held")]
    done = box.cli("top", "--json", "--lock-dir", box.lock_dir, check=False)
    assert done.returncode == 2
    assert (
        done.stderr == "xpulaunch: error: --json goes with --once (the live view is for people)\n"
    )
