"""``xpulaunch llama serve`` under ``Type=notify``: READY=1 over the socket in NOTIFY_SOCKET
once its port is bound (a real router with the CPU llama-server)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from helpers import inventory_path

XPULAUNCH = str(Path(sys.executable).parent / "xpulaunch")


@pytest.mark.llama
def test_the_router_says_ready_once_its_port_is_bound(
    tmp_path: Path, tiny_model: Path, llama_server: str
) -> None:
    config = tmp_path / "models.toml"
    config.write_text(f'[models.tiny]\nmodel = "{tiny_model}"\n')
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as notify:
        notify.bind(str(tmp_path / "notify.sock"))
        notify.settimeout(60)
        env = {**os.environ, "NOTIFY_SOCKET": notify.getsockname()}
        router = subprocess.Popen(
            [
                XPULAUNCH,
                "llama",
                "serve",
                "--config",
                str(config),
                "--port",
                "0",
                "--binary",
                llama_server,
                "--inventory",
                str(inventory_path("cpu-only.json")),
                "--lock-dir",
                str(tmp_path / "locks"),
            ],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            said = dict(line.split("=", 1) for line in notify.recv(4096).decode().splitlines())
            assert said["READY"] == "1" and said["MAINPID"] == str(router.pid)
            assert said["STATUS"].startswith("serving tiny at http://127.0.0.1:")
            url = said["STATUS"].removeprefix("serving tiny at ")
            # Ready means ready: the port answers at once.
            with urllib.request.urlopen(url + "/models", timeout=30) as answer:
                assert answer.status == 200
            router.send_signal(signal.SIGTERM)
            assert router.wait(timeout=60) == 128 + signal.SIGTERM
        finally:
            if router.poll() is None:
                router.kill()
            router.communicate(timeout=30)
