"""The masks package, and what ``run --dry-run --inventory`` loads.

``xpulaunch.core.masks`` names the variables; each runtime's parser lives in its own module
(``cuda``, ``level_zero``, ``oneapi``, ``rocm``), loaded by what reads that runtime. A dry
run from an inventory file is pure planning: it loads no probe, no process library and no GPU
runtime (the contract: the launcher never initialises a GPU runtime; nothing is probed when
the inventory is given), and a CUDA plan no Intel or AMD parser.
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

# Every public name of the old single-module core/masks.py, each now in the package (the
# variables' names) or in one vendor module.
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

SHARED = {"CUDA_VAR", "ZE_MASK_VAR", "ZE_HIERARCHY_VAR", "ODS_VAR", "ROCR_VAR", "HIP_VAR",
          "ZE_HIDE_ALL"}  # fmt: skip


def test_the_package_names_the_variables_and_holds_no_parser() -> None:
    for name in SHARED:
        assert isinstance(getattr(masks, name), str), name
    assert not any(name.startswith(("parse_", "format_")) for name in vars(masks))


@pytest.mark.parametrize("module_name", VENDOR_MODULES)
def test_each_vendor_module_exports_what_it_lists(module_name: str) -> None:
    module = importlib.import_module(f"xpulaunch.core.masks.{module_name}")
    assert module.__all__, module_name
    for name in module.__all__:
        assert name in OLD_PUBLIC, name
        assert hasattr(module, name), name
        if name in SHARED:  # a variable's name is the package's own object
            assert getattr(module, name) is getattr(masks, name), name


def test_every_public_name_comes_from_one_vendor_module_or_the_shared_names() -> None:
    defined = {
        name
        for module_name in VENDOR_MODULES
        for name in importlib.import_module(f"xpulaunch.core.masks.{module_name}").__all__
    }
    assert defined | SHARED == OLD_PUBLIC


def test_importing_the_package_loads_no_vendor_parser() -> None:
    after_click, final, _ = _fresh_modules("import xpulaunch.core.masks")
    loaded = final - after_click
    assert "xpulaunch.core.masks" in loaded
    assert [m for m in loaded if m.startswith("xpulaunch.core.masks.")] == []


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
_ALLOWED = ("xpulaunch.probing", "xpulaunch.nodes.slurm")


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
    if inventory == "8x-h100.json":  # a CUDA plan reads no Intel or AMD variable
        assert {f"xpulaunch.core.masks.{m}" for m in VENDOR_MODULES} & final == {
            "xpulaunch.core.masks.cuda"
        }


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
