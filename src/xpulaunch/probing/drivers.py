"""Driver versions, read without initialising any driver.

Kernel driver: ``/sys/module/<driver>/version`` (nvidia, out-of-tree amdgpu and the i915
backport have one), else the running kernel's release for an in-tree driver. Intel's Level
Zero GPU driver (compute-runtime): the dpkg package record, else the build number in the
library's file name (``libze_intel_gpu.so.1.6.33578`` is release 25.18's build 33578).
"""

from __future__ import annotations

import glob
import os
import re

from xpulaunch.probing.sysfs import read_text

DPKG_STATUS = os.path.join("var", "lib", "dpkg", "status")
LEVEL_ZERO_PACKAGES = ("libze-intel-gpu1", "intel-level-zero-gpu")
# compute-runtime's separate build for Gen9-Gen11 iGPUs (since 24.35), under either name.
LEGACY_PACKAGES = ("libze-intel-gpu1-legacy1", "intel-level-zero-gpu-legacy1")
LIB_DIRS = ("usr/lib/x86_64-linux-gnu", "usr/lib64", "usr/lib", "usr/local/lib")


def kernel_driver_version(sys_root: str, proc_root: str, driver: str | None) -> str | None:
    if not driver:
        return None
    version = read_text(os.path.join(sys_root, "module", driver, "version"), [])
    if version:
        return version
    release = read_text(os.path.join(proc_root, "sys", "kernel", "osrelease"), [])
    return f"in-tree (kernel {release})" if release else None


def level_zero_version(root: str) -> str | None:
    """compute-runtime's version from the package manager's record, else the library name."""
    status = read_text(os.path.join(root, DPKG_STATUS), [])
    if status:
        for package in LEVEL_ZERO_PACKAGES:
            version = dpkg_version(status, package)
            if version:
                return version
    return _library_build(root)


def dpkg_version(status: str, package: str) -> str | None:
    """The ``Version:`` of an installed ``package`` in a dpkg status file."""
    for record in status.split("\n\n"):
        fields = dict(
            line.split(":", 1) for line in record.splitlines() if ":" in line and line[0] != " "
        )
        installed = "installed" in fields.get("Status", "")
        if fields.get("Package", "").strip() == package and installed:
            return fields.get("Version", "").strip() or None
    return None


def _library_build(root: str) -> str | None:
    for lib_dir in LIB_DIRS:
        for path in sorted(glob.glob(os.path.join(root, lib_dir, "libze_intel_gpu.so.1.*.*"))):
            match = re.search(r"\.so\.1\.\d+\.(\d+)$", path)
            if match:
                return f"build {match[1]}"  # no release number: ranges cannot match it
    return None


def legacy_level_zero_installed(root: str) -> bool | None:
    """Whether the legacy1 Level Zero driver is installed; None without a dpkg record."""
    status = read_text(os.path.join(root, DPKG_STATUS), [])
    if not status:
        return None
    return any(dpkg_version(status, package) for package in LEGACY_PACKAGES)
