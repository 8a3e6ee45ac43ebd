"""``Type=notify`` readiness without libsystemd: the datagram ``sd_notify`` sends, the queue
runner's READY=1 over a real socket in NOTIFY_SOCKET, and the shipped unit files (checked by
``systemd-analyze verify`` where systemd is installed, and parsed here either way)."""

from __future__ import annotations

import configparser
import os
import shutil
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from xpulaunch.processes import sd_notify

ROOT = Path(__file__).resolve().parents[2]
UNITS = ROOT / "examples" / "systemd"
XPULAUNCH = Path(sys.executable).parent / "xpulaunch"


@pytest.fixture
def notify_socket(tmp_path: Path) -> Iterator[socket.socket]:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(tmp_path / "notify.sock"))
    sock.settimeout(60)
    yield sock
    sock.close()


def fields(datagram: bytes) -> dict[str, str]:
    return dict(line.split("=", 1) for line in datagram.decode().splitlines())


def test_ready_is_one_datagram_to_the_socket_named(notify_socket: socket.socket) -> None:
    env = {"NOTIFY_SOCKET": notify_socket.getsockname()}
    assert sd_notify.ready("serving x", env)
    assert fields(notify_socket.recv(4096)) == {
        "READY": "1",
        "STATUS": "serving x",
        "MAINPID": str(os.getpid()),
    }


def test_an_abstract_socket_and_no_socket() -> None:
    name = f"xpulaunch-test-{os.getpid()}"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind("\0" + name)
        sock.settimeout(10)
        assert sd_notify.notify("READY=1", {"NOTIFY_SOCKET": "@" + name})
        assert sock.recv(100) == b"READY=1"
    assert not sd_notify.notify("READY=1", {})  # not a notify service: nothing sent
    assert not sd_notify.notify("READY=1", {"NOTIFY_SOCKET": "vsock:2:1234"})
    assert not sd_notify.notify("READY=1", {"NOTIFY_SOCKET": "/nonexistent/notify.sock"})


def test_the_runner_says_ready_once_it_serves(tmp_path: Path, notify_socket: socket.socket) -> None:
    env = {**os.environ, "NOTIFY_SOCKET": notify_socket.getsockname()}
    (tmp_path / "locks").mkdir()
    (tmp_path / "locks").chmod(0o1777)  # a shared lock directory, as an admin makes it
    runner = subprocess.Popen(
        [str(XPULAUNCH), "runner", "--foreground", "--lock-dir", str(tmp_path / "locks")],
        env=env,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        said = fields(notify_socket.recv(4096))
        assert said == {
            "READY": "1",
            "STATUS": f"serving {tmp_path / 'locks'}",
            "MAINPID": str(runner.pid),
        }
        runner.send_signal(signal.SIGTERM)
        assert runner.wait(timeout=60) == 0
    finally:
        if runner.poll() is None:
            runner.kill()
        runner.communicate(timeout=30)


def _units() -> list[Path]:
    return sorted(UNITS.glob("*.service"))


@pytest.mark.parametrize("unit", _units(), ids=lambda p: p.name)
def test_the_units_parse_and_say_type_notify(unit: Path) -> None:
    parser = configparser.ConfigParser(strict=True, interpolation=None)
    parser.optionxform = str  # type: ignore[assignment,method-assign]  # keys are case-sensitive
    parser.read_string(unit.read_text())
    service = parser["Service"]
    assert service["Type"] == "notify" and service["NotifyAccess"] == "main"
    assert "xpulaunch" in service["ExecStart"]
    if unit.name == "xpulaunch-router.service":  # SIGHUP: the router reads models.toml again
        assert service["ExecReload"] == "/bin/kill -HUP $MAINPID"
    else:
        assert "ExecReload" not in service
    assert parser["Install"]["WantedBy"]
    command = service["ExecStart"].split()[1:]
    help_for = command[: command.index("llama") + 2] if "llama" in command else command[:1]
    done = subprocess.run(
        [str(XPULAUNCH), *help_for, "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    options = [word.split("=")[0] for word in command if word.startswith("--")]
    assert all(option in done.stdout for option in options), (options, done.stdout)


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="no systemd-analyze here")
@pytest.mark.parametrize("unit", _units(), ids=lambda p: p.name)
def test_systemd_analyze_verify_accepts_the_units(unit: Path, tmp_path: Path) -> None:
    """Verified as shipped, but for ExecStart's path (verify wants an executable there) and
    the router's User (a user that exists here)."""
    text = unit.read_text().replace("%h/.local/bin/xpulaunch", str(XPULAUNCH))
    text = text.replace("/usr/local/bin/xpulaunch", str(XPULAUNCH))
    text = text.replace("User=xpulaunch", "User=root")
    copy = tmp_path / unit.name
    copy.write_text(text)
    user = ["--user"] if "runner" in unit.name else []
    runtime = tmp_path / "run"
    runtime.mkdir(mode=0o700)
    done = subprocess.run(
        ["systemd-analyze", "verify", *user, str(copy)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={**os.environ, "XDG_RUNTIME_DIR": str(runtime)},
    )
    assert (done.returncode, done.stderr) == (0, "")
