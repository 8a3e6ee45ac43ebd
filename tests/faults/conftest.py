"""Run the real ``xpulaunch`` CLI in a child process, as a user (or a hostile world) would."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from fault_cli import Launch
from helpers import reap


@pytest.fixture
def launch(tmp_path: Path) -> Iterator[Launch]:
    """``launch("run", ..., stdout=...)`` -> the running ``python -m xpulaunch`` process."""
    started: list[subprocess.Popen[bytes]] = []

    def start(
        *args: str, env: dict[str, str] | None = None, **popen: Any
    ) -> subprocess.Popen[bytes]:
        popen.setdefault("stdout", subprocess.PIPE)
        popen.setdefault("stderr", subprocess.PIPE)
        full_env = {**os.environ, "XDG_RUNTIME_DIR": str(tmp_path), **(env or {})}
        proc = subprocess.Popen([sys.executable, "-m", "xpulaunch", *args], env=full_env, **popen)
        started.append(proc)
        return proc

    yield start
    reap(started)
