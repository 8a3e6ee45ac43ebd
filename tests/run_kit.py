"""Real ``xpulaunch run`` processes and tiny worker scripts for the CLI-level process tests; a
pytest plugin (tests/conftest.py loads it). Every test gets a private runtime directory."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from helpers import reap

XPULAUNCH = str(Path(sys.executable).parent / "xpulaunch")

SCRIPTS = {
    # A torch @record entry point raising ValueError after a line of output.
    "record_fails.py": """
        from torch.distributed.elastic.multiprocessing.errors import record

        def check(value):
            raise ValueError(f"bad learning rate {value}")

        @record
        def main():
            print("step 0", flush=True)
            check(-1)

        if __name__ == "__main__":
            main()
    """,
    # A plain script (no @record): the traceback on stderr is the root cause.
    "plain_fails.py": """
        import sys
        print("about to fail", file=sys.stderr, flush=True)
        raise KeyError("missing-shard")
    """,
    # Crashes on its first attempt (RuntimeError), succeeds on the next.
    "crash_once.py": """
        import os
        if os.environ["TORCHELASTIC_RESTART_COUNT"] == "0":
            raise RuntimeError("first attempt crashes")
        print("second attempt is fine", flush=True)
    """,
    # Prints nothing, ever (a deadlocked collective).
    "silent.py": """
        import time
        while True:
            time.sleep(60)
    """,
    # Beats through xpulaunch.heartbeat() without printing, then finishes.
    "beats.py": """
        import sys, time
        import xpulaunch
        deadline = time.monotonic() + float(sys.argv[1])
        while time.monotonic() < deadline:
            xpulaunch.heartbeat()
            time.sleep(0.05)
    """,
    "fails.py": """
        import sys
        sys.exit(1)
    """,
    "sleeps.py": """
        import time
        print("up", flush=True)
        while True:
            time.sleep(60)
    """,
}


@pytest.fixture
def script(tmp_path: Path) -> Callable[[str], str]:
    folder = tmp_path / "scripts"
    folder.mkdir()
    for name, source in SCRIPTS.items():
        (folder / name).write_text(textwrap.dedent(source))
    return lambda name: str(folder / name)


@pytest.fixture(autouse=True)
def _private_runtime_dir(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))


def xpulaunch(
    *args: str, timeout: float = 120, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [XPULAUNCH, "run", "--gpus", "none", *args], capture_output=True, text=True,
        timeout=timeout, check=False, env={**os.environ, **(env or {})},
    )  # fmt: skip


@pytest.fixture
def start() -> Iterator[Callable[..., subprocess.Popen[str]]]:
    """``xpulaunch run --gpus none ARGS`` in the background (killed at the end if needed)."""
    started: list[subprocess.Popen[str]] = []

    def begin(*args: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
        argv = [XPULAUNCH, "run", *(["--gpus", "none"] if env is None else []), *args]
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, env={**os.environ, **(env or {})})  # fmt: skip
        started.append(proc)
        return proc

    yield begin
    reap(started)


def read_events(path: Path) -> list[dict[str, object]]:
    if not path.exists():
        return []
    lines = path.read_text().splitlines()
    return [json.loads(line) for line in lines if line.endswith("}")]
