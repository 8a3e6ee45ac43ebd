"""Run the real ``xpulaunch`` CLI in a child process, as a user (or a hostile world) would."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from fault_cli import Launch
from helpers import reap
from queue_kit import box

__all__ = ["box"]  # the queue box (tests/queue_kit.py): a folder a second user can reach


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


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Callable[[int], Path]]:
    """``small_disk(left_bytes)``: a 1 MiB tmpfs of this test's own, filled until about
    ``left_bytes`` are left (a real full disk: ENOSPC part way through a write). Needs root
    (mount); the /dev/full variants of the same tests run anywhere."""
    mount = tmp_path / "small-disk"
    mount.mkdir()
    argv = ["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mount)]
    done = subprocess.run(argv, capture_output=True, check=False)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode(errors='replace')[:200]}")

    def fill(left_bytes: int) -> Path:
        st = os.statvfs(mount)
        free = st.f_bavail * st.f_frsize
        with open(mount / "filler", "wb") as handle:
            handle.write(b"\0" * max(free - left_bytes, 0))
        return mount

    try:
        yield fill
    finally:
        subprocess.run(["umount", "-l", str(mount)], capture_output=True, check=False)
