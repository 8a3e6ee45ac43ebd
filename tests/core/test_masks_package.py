"""The masks package, and what ``run --dry-run --inventory`` loads.

``xpulaunch.core.masks`` re-exports every name of its vendor modules. A dry run from an
inventory file is pure planning: it loads no probe, no process library and no GPU runtime
(the contract: the launcher never initialises a GPU runtime; nothing is probed when the
inventory is given).
"""

from __future__ import annotations

import importlib
import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import inventory_path
from xpulaunch import api
from xpulaunch.core import masks

# Every public name of the old single-module core/masks.py.
OLD_PUBLIC = frozenset(
    {
        "CUDA_VAR",
        "ZE_MASK_VAR",
        "ZE_HIERARCHY_VAR",
        "ODS_VAR",
        "ROCR_VAR",
        "HIP_VAR",
        "ZE_HIDE_ALL",
        "CudaEntry",
        "CudaVisible",
        "parse_cuda_visible_devices",
        "format_cuda_visible_devices",
        "ZeVisible",
        "driver_order",
        "resolve_hierarchy",
        "parse_ze_affinity_mask",
        "regroup_units",
        "format_ze_affinity_mask",
        "OneApiFilter",
        "RootPick",
        "parse_oneapi_device_selector",
        "AmdVisible",
        "parse_rocr_visible_devices",
        "parse_hip_visible_devices",
        "amd_visible",
        "format_rocr_visible_devices",
        # added since: Level Zero's atoll reading and the refusal of tile counts in doubt
        "pci_id_order",
        "refuse_doubtful_tiles",
    }
)
VENDOR_MODULES = ("cuda", "level_zero", "oneapi", "rocm")


# --- the package -----------------------------------------------------------------------------


def test_package_exports_exactly_the_old_public_names() -> None:
    assert set(masks.__all__) == OLD_PUBLIC
    assert len(masks.__all__) == len(OLD_PUBLIC)


@pytest.mark.parametrize("module_name", VENDOR_MODULES)
def test_each_reexport_is_the_vendor_modules_own_object(module_name: str) -> None:
    module = importlib.import_module(f"xpulaunch.core.masks.{module_name}")
    assert module.__all__, module_name
    for name in module.__all__:
        assert name in OLD_PUBLIC, name
        assert getattr(masks, name) is getattr(module, name), name


def test_every_public_name_comes_from_one_vendor_module_or_the_shared_names() -> None:
    shared = {"CUDA_VAR", "ZE_MASK_VAR", "ZE_HIERARCHY_VAR", "ODS_VAR", "ROCR_VAR", "HIP_VAR"}
    defined = {
        name
        for module_name in VENDOR_MODULES
        for name in importlib.import_module(f"xpulaunch.core.masks.{module_name}").__all__
    }
    assert defined | shared == OLD_PUBLIC


def test_star_import_and_dir_list_every_public_name() -> None:
    namespace: dict[str, object] = {}
    exec("from xpulaunch.core.masks import *", namespace)
    assert namespace.keys() >= OLD_PUBLIC
    assert set(dir(masks)) >= OLD_PUBLIC


def test_an_unknown_name_is_an_attribute_error_naming_it() -> None:
    with pytest.raises(AttributeError, match="parse_vulkan_mask"):
        _ = masks.parse_vulkan_mask  # type: ignore[attr-defined]
    with pytest.raises(ImportError, match="parse_vulkan_mask"):
        exec("from xpulaunch.core.masks import parse_vulkan_mask", {})


# --- what a fresh interpreter loads ------------------------------------------------------------

_MODULES_AFTER = """
import json, sys
import click
after_click = set(sys.modules)
{body}
json.dump({{"after_click": sorted(after_click), "final": sorted(sys.modules)}}, sys.stderr)
"""


def _fresh_modules(body: str) -> tuple[set[str], set[str], str]:
    """Run ``body`` in a new interpreter: (modules after ``import click``, at the end, stdout)."""
    done = subprocess.run(
        [sys.executable, "-c", _MODULES_AFTER.format(body=body)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    loaded = json.loads(done.stderr.splitlines()[-1])
    return set(loaded["after_click"]), set(loaded["final"]), done.stdout


_DRY_RUN = """
from xpulaunch.cli.main import main
try:
    main(["run", "--dry-run", "--json", "--inventory", {inventory!r}, "--gpus", "auto",
          "--", "python", "-c", "pass"])
except SystemExit as exc:
    assert exc.code == 0, exc.code
"""

# Never on the --inventory dry-run path: the probe and the process and GPU libraries (the
# contract: no GPU runtime in the launcher; nothing to probe when the inventory is given).
_FORBIDDEN = (
    "psutil",
    "filelock",
    "pynvml",
    "rich",
    "torch",
    "xpulaunch.probing",
    "xpulaunch.llamacpp",
)


# Not device probes: the Slurm host-list check (scontrol, run only under Slurm) and the
# package's empty __init__.
_ALLOWED = ("xpulaunch.probing", "xpulaunch.probing.slurm")


def _forbidden(modules: set[str], forbidden: tuple[str, ...]) -> list[str]:
    return sorted(
        m
        for m in modules
        if m not in _ALLOWED and any(m == f or m.startswith(f + ".") for f in forbidden)
    )


@pytest.mark.parametrize(
    ("inventory", "backend"),
    [
        ("8x-h100.json", "cuda"),
        ("2x-max1550.json", "xpu"),
        ("4x-mi300x.json", "rocm"),
        ("hybrid-4090-arc.json", "cuda"),
    ],
)
def test_a_dry_run_from_an_inventory_loads_no_probe_process_library_or_gpu_runtime(
    inventory: str, backend: str
) -> None:
    after_click, final, out = _fresh_modules(
        _DRY_RUN.format(inventory=str(inventory_path(inventory)))
    )
    assert json.loads(out)["backend"] == backend
    assert _forbidden(final - after_click, _FORBIDDEN) == []


# --- api helpers ------------------------------------------------------------------------------


def test_read_text_errors_are_one_line_inventory_errors(tmp_path: Path) -> None:
    from xpulaunch.errors import InventoryError

    latin = tmp_path / "latin1.json"
    latin.write_bytes('{"schema": "\xe9"}'.encode("latin-1"))
    with pytest.raises(InventoryError, match="not UTF-8 text"):
        api.load_inventory(latin)
    with pytest.raises(InventoryError, match="cannot read it"):
        api.load_inventory(tmp_path)


def test_free_port_returns_a_port_that_can_be_bound() -> None:
    port = api.free_port("127.0.0.1")
    assert 1 <= port <= 65535
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", port))
