"""Shared fixtures. Tests never inherit the host's GPU visibility or xpulaunch settings."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, settings

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
    """Clear GPU visibility and XPULAUNCH_* variables; give each test its own lock dir."""
    import os

    for name in GPU_ENV:
        monkeypatch.delenv(name, raising=False)
    for name in list(os.environ):
        if name.startswith("XPULAUNCH_"):
            monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("XPULAUNCH_LOCK_DIR", str(tmp_path_factory.mktemp("locks")))
