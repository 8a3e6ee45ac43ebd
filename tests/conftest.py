"""Shared fixtures. Tests never inherit the host's GPU visibility or xpulaunch settings, nor
process-wide state that an earlier test left behind: the suite runs in random order
(pytest-randomly), so every test starts from the state a fresh process has."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

from xpulaunch.probing.nvidia import NVML_STATE

# Tiny real child programs and the drive_plan parent, for the process tests of every package.
pytest_plugins = ["process_kit", "run_kit"]

# The machine is small and shared by real-process tests: no per-example deadlines.
settings.register_profile(
    "xpulaunch", deadline=None, suppress_health_check=[HealthCheck.too_slow], max_examples=200
)
settings.load_profile("xpulaunch")

GPU_ENV = (
    "CUDA_VISIBLE_DEVICES",
    "CUDA_DEVICE_ORDER",
    "ZE_AFFINITY_MASK",
    "ZE_FLAT_DEVICE_HIERARCHY",
    "ZE_ENABLE_PCI_ID_DEVICE_ORDER",
    "ONEAPI_DEVICE_SELECTOR",
    "SYCL_DEVICE_FILTER",
    "ROCR_VISIBLE_DEVICES",
    "HIP_VISIBLE_DEVICES",
    "GPU_DEVICE_ORDINAL",
    "GGML_VK_VISIBLE_DEVICES",
)


@pytest.fixture(autouse=True)
def _isolated_env(
    monkeypatch: pytest.MonkeyPatch, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """Clear GPU visibility and XPULAUNCH_* variables; give each test its own lock dir and
    an empty user config directory."""
    import os

    for name in GPU_ENV:
        monkeypatch.delenv(name, raising=False)
    for name in list(os.environ):
        if name.startswith("XPULAUNCH_"):
            monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("XPULAUNCH_LOCK_DIR", str(tmp_path_factory.mktemp("locks")))
    # No user config file of the host's: ~/.config/xpulaunch/config.toml would set defaults.
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path_factory.mktemp("config")))


@pytest.fixture(autouse=True)
def _nvml_never_initialised() -> Iterator[None]:
    """Each test starts as a process whose probe never initialised NVML (the real pynvml or a
    test's stand-in), and leaves it so."""
    NVML_STATE.shutdown()
    yield
    NVML_STATE.shutdown()


@pytest.fixture
def search_dirs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """For PATH lookups (which, resolve_program): a/tool executable, b/tool not
    executable, c/tool a directory, e/ empty; cwd = tmp_path, with an executable ./tool too."""
    for name, mode in (("a", 0o755), ("b", 0o644)):
        (tmp_path / name).mkdir()
        (tmp_path / name / "tool").write_text("#!/bin/sh\n")
        (tmp_path / name / "tool").chmod(mode)
    (tmp_path / "c" / "tool").mkdir(parents=True)
    (tmp_path / "e").mkdir()
    (tmp_path / "tool").write_text("#!/bin/sh\n")
    (tmp_path / "tool").chmod(0o755)
    monkeypatch.chdir(tmp_path)
    return tmp_path
