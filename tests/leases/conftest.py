"""Fixtures for the lease tests: a lock directory, the tiny planner, real worker processes."""

from __future__ import annotations

import contextlib
import importlib.util
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from types import ModuleType

import pytest

from xpulaunch.model import Inventory, Plan

WORKER = Path(__file__).with_name("lease_worker.py")


def _load_worker() -> ModuleType:
    spec = importlib.util.spec_from_file_location("lease_worker", WORKER)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


worker_module = _load_worker()


PlanFor = Callable[[Inventory, str], Callable[[Mapping[str, str]], Plan]]


@pytest.fixture
def plan_for() -> PlanFor:
    """``plan_for(inventory, gpus)``: the worker's tiny pure planner as a ``plan_fn``."""

    def make(inventory: Inventory, gpus: str) -> Callable[[Mapping[str, str]], Plan]:
        return lambda unavailable: worker_module.tiny_plan(inventory, gpus, unavailable)

    return make


@pytest.fixture
def lock_dir(tmp_path: Path) -> Path:
    return tmp_path / "locks"


@pytest.fixture
def inventory() -> Inventory:
    """Four fake NVIDIA cards, keys 0000:01:00.0 .. 0000:04:00.0."""
    inventory: Inventory = worker_module.fake_inventory(4)
    return inventory


@pytest.fixture
def one_card() -> Inventory:
    inventory: Inventory = worker_module.fake_inventory(1)
    return inventory


class Processes:
    """Start worker processes; everything started (and reported children) dies at teardown."""

    def __init__(self) -> None:
        self.started: list[subprocess.Popen[str]] = []
        self.orphans: list[int] = []

    def worker(self, lock_dir: Path, *args: str) -> subprocess.Popen[str]:
        argv = [sys.executable, str(WORKER), "--lock-dir", str(lock_dir), *args]
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.started.append(proc)
        return proc

    def cleanup(self) -> None:
        for pid in self.orphans:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        for proc in self.started:
            if proc.poll() is None:
                proc.kill()
            proc.communicate(timeout=10)


@pytest.fixture
def processes() -> Iterator[Processes]:
    procs = Processes()
    try:
        yield procs
    finally:
        procs.cleanup()
