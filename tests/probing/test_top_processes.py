"""``xpulaunch top --once`` on a probed (fake) host: each device's holder from the leases,
and the processes on it that belong to no lease's job, from DRM fdinfo."""

from __future__ import annotations

import os
import pty
import subprocess
from pathlib import Path

import pytest
from probe_fakes import FakeMachine, b580_uhd_host, mi300x_host, probe_fake
from test_gpu_processes import AMDGPU_OLD, XE, _process
from test_probe_cli_devices import XPULAUNCH, fake_host_env, xpulaunch

from xpulaunch.core.plan import LaunchRequest, make_plan
from xpulaunch.leases import LeaseManager


def test_top_links_devices_to_holders_and_other_processes(tmp_path: Path) -> None:
    m = FakeMachine(tmp_path)
    b580_uhd_host(m)
    mi300x_host(m)
    inventory = probe_fake(m)
    request = LaunchRequest(argv=("x",), gpus="0000:03:00.0")
    manager = LeaseManager(tmp_path / "locks")
    _, lease = manager.allocate(
        lambda held: make_plan(request, inventory, {}, unavailable=held), command=["train.py"]
    )
    _process(m, 4242, {5: XE}, {"XPULAUNCH_JOB_ID": lease.job_id})  # the lease's own worker
    _process(m, 4343, {3: AMDGPU_OLD}, {})  # someone else's, on an AMD card nobody leased
    # a job's variable where its job holds no lease: a shell that kept it, or a device its job
    # never leased; it used to be hidden as if a holder line named it
    _process(m, 4444, {3: AMDGPU_OLD}, {"XPULAUNCH_JOB_ID": lease.job_id})
    env = {**fake_host_env(m), "XPULAUNCH_LOCK_DIR": str(tmp_path / "locks"), "COLUMNS": "120"}
    out = xpulaunch("top", "--once", env=env)
    assert out.returncode == 0, out.stderr
    rows = {line.split("  ")[0]: line for line in out.stdout.splitlines()}
    assert rows["intel 0"].endswith(f"pid {os.getpid()}  root  train.py")
    assert "python3 train.py" not in rows["intel 0"]  # the lease's worker is the holder's
    amd = out.stdout.splitlines().index(rows["amd 0"])
    assert rows["amd 0"].endswith("  -")
    # every process on the device gets a row: pid, user, its job (an xpulaunch launch's
    # variable that names no queue job: "xpulaunch"), memory, command
    assert [line.split() for line in out.stdout.splitlines()[amd + 1 : amd + 3]] == [
        ["└", "4343", "root", "-", "0.0", "GiB", "python3", "train.py"],
        ["└", "4444", "root", "xpulaunch", "0.0", "GiB", "python3", "train.py"],
    ]
    assert "not listed" not in out.stdout
    lease.release()


def test_a_command_line_with_a_newline_or_escape_stays_on_its_row(tmp_path: Path) -> None:
    """Anyone's process may carry a newline or an ESC in an argument: top and devices
    --processes show them escaped on the process's own row, never as a row of their own."""
    m = FakeMachine(tmp_path)
    mi300x_host(m)
    _process(m, 4343, {3: AMDGPU_OLD}, {})
    (m.proc / "4343" / "cmdline").write_bytes(b"python3\0-c\0x\nnvidia 9  fake row\x1b[2J\0")
    env = {**fake_host_env(m), "XPULAUNCH_LOCK_DIR": str(tmp_path / "locks"), "COLUMNS": "200"}
    for args in (("top", "--once"), ("devices", "--processes")):
        out = xpulaunch(*args, env=env)
        assert out.returncode == 0, out.stderr
        row = next(line for line in out.stdout.splitlines() if "4343" in line)
        assert "python3 -c x\\x0anvidia 9  fake row\\x1b[2J" in row
        assert not any(line.startswith("nvidia 9") for line in out.stdout.splitlines())
        assert "\x1b" not in out.stdout


@pytest.mark.parametrize(
    ("term", "message"),
    [
        (None, "xpulaunch top needs a terminal; use --once for a script"),
        ("dumb", "xpulaunch top needs a terminal that can move its cursor (TERM=dumb); use --once"),
    ],
)
def test_the_live_view_without_a_terminal_it_can_draw_on(
    tmp_path: Path, term: str | None, message: str
) -> None:
    m = FakeMachine(tmp_path)
    mi300x_host(m)
    env = {**os.environ, **fake_host_env(m), "XPULAUNCH_LOCK_DIR": str(tmp_path / "locks")}
    if term is None:  # stdout is a pipe
        out = xpulaunch("top", env=env)
        code, err = out.returncode, out.stderr
    else:  # a real terminal (a pty) whose TERM cannot move the cursor: Emacs's M-x shell
        parent, child = pty.openpty()
        try:
            proc = subprocess.run(
                [str(XPULAUNCH), "top"], stdin=child, stdout=child, stderr=subprocess.PIPE,
                env={**env, "TERM": term}, timeout=60, check=False, text=True,
            )  # fmt: skip
        finally:
            os.close(child)
            os.close(parent)
        code, err = proc.returncode, proc.stderr
    assert (code, err) == (1, f"xpulaunch: error: {message}\n")


def _top_in_a_pty(env: dict[str, str]) -> tuple[int, bytes, str]:
    """``xpulaunch top`` in a real terminal (a pty, 80x24) with ``env``: what it drew until
    the queue part showed, then ``q``; its exit status, the bytes drawn, and its stderr."""
    import fcntl
    import select
    import struct
    import termios
    import time

    parent, child = pty.openpty()
    fcntl.ioctl(child, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 80, 0, 0))
    drawn = b""
    try:
        proc = subprocess.Popen(
            [str(XPULAUNCH), "top", "--interval", "0.2"],
            stdin=child,
            stdout=child,
            stderr=subprocess.PIPE,
            env=env,
            start_new_session=True,
        )
        os.close(child)
        deadline = time.monotonic() + 30
        while b"QUEUE" not in drawn and proc.poll() is None and time.monotonic() < deadline:
            if select.select([parent], [], [], 0.5)[0]:
                try:
                    drawn += os.read(parent, 65536)
                except OSError:  # EIO: the terminal's last process closed it
                    break
        if proc.poll() is None:
            os.write(parent, b"q")
        try:
            _, err = proc.communicate(timeout=30)
        finally:
            proc.kill()
    finally:
        os.close(parent)
    return proc.returncode, drawn, err.decode()


@pytest.mark.parametrize("term", ["xterm-kitty", "xterm-ghostty", "unknownterm"])
def test_a_term_this_host_has_no_terminfo_for_is_drawn_as_xterm(tmp_path: Path, term: str) -> None:
    """ssh from kitty or ghostty into a host without their terminfo: top draws as
    xterm-256color and says so (it was a traceback: setupterm could not find the terminal)."""
    m = FakeMachine(tmp_path)
    mi300x_host(m)
    env = {**os.environ, **fake_host_env(m), "XPULAUNCH_LOCK_DIR": str(tmp_path / "locks")}
    code, drawn, err = _top_in_a_pty({**env, "TERM": term})
    assert (code, err) == (0, "")
    assert b"amd 0" in drawn and b"QUEUE: empty" in drawn
    assert f"TERM={term}: no terminfo here; drawn as xterm-256color".encode() in drawn


@pytest.mark.parametrize(("term", "said"), [("", "TERM is empty"), (None, "no TERM")])
def test_an_empty_or_missing_term_in_a_terminal_is_one_line(
    tmp_path: Path, term: str | None, said: str
) -> None:
    m = FakeMachine(tmp_path)
    mi300x_host(m)
    env = {**os.environ, **fake_host_env(m), "XPULAUNCH_LOCK_DIR": str(tmp_path / "locks")}
    env.pop("TERM", None)
    code, _, err = _top_in_a_pty(env if term is None else {**env, "TERM": term})
    message = f"xpulaunch top needs a terminal that can move its cursor ({said}); use --once"
    assert (code, err) == (1, f"xpulaunch: error: {message}\n")
