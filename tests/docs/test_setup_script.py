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
# answers with $INSTALLED.
FAKE_PYTHON = """#!/bin/sh
echo "python $*" >> "$(dirname "$0")/calls"
if [ "$1" = -c ]; then exit "$INSTALLED"; fi
exit 0
"""


@pytest.mark.parametrize("installed", [False, True])
def test_setup_says_what_it_does_and_how_long_it_may_take(tmp_path: Path, installed: bool) -> None:
    repo = tmp_path / "repo"
    (repo / "scripts").mkdir(parents=True)
    shutil.copy(ROOT / "scripts" / "setup", repo / "scripts" / "setup")
    bin_dir = repo / ".venv" / "bin"
    bin_dir.mkdir(parents=True)
    (bin_dir / "python").write_text(FAKE_PYTHON)
    (bin_dir / "xpulaunch").write_text("#!/bin/sh\necho 'xpulaunch, version 0'\n")
    for tool in ("python", "xpulaunch"):
        (bin_dir / tool).chmod(0o755)
    env = {**os.environ, "INSTALLED": "0" if installed else "1"}
    done = subprocess.run(["bash", str(repo / "scripts" / "setup")], capture_output=True,
                          text=True, env=env, timeout=60, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr
    [pip] = [c for c in (bin_dir / "calls").read_text().splitlines() if "-m pip" in c]
    if installed:
        assert "checking what is installed" in done.stdout and "--quiet" in pip
    else:  # it used to print nothing for the whole compile
        assert "7 to 15 minutes" in done.stdout and "--quiet" not in pip
    assert done.stdout.rstrip().endswith("setup: ok (xpulaunch, version 0)")
