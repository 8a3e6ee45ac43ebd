"""Every README example that can run on a CPU host is run here, so README.md cannot drift from
the code.

Each ``xpulaunch ...`` line of a fenced block runs as written, in a scratch directory with the
files it names (``train.py``, ``model.gguf``, ...). A command that would start a job or a
server gets ``--dry-run`` and an inventory fixture instead of GPUs (``--llama-backend cuda`` too
when the README leaves the build to be asked from a binary that is not here): it must make a
plan. Python blocks that start with ``import`` and use only xpulaunch run whole. The plan
shown under "Plans" must match what the command prints (``...`` stands for anything).
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import inventory_path

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()
CONSOLE = str(Path(sys.executable).parent / "xpulaunch")

# Python blocks that need more than a CPU host and xpulaunch, by their first line.
# Python blocks that cannot run on a CPU host, by first line, with the reason.
PYTHON_NOT_RUN = {
    "from transformers import AutoModelForCausalLM": "needs transformers and a model",
    "from accelerate import Accelerator": "a training script, run by the commands around it",
    "from openai import OpenAI": "needs models; tests/llamacpp/test_router.py runs the router",
}
# The commands whose inventory is not the README's own 2x H200 host.
INVENTORY_FOR = (
    ("ZE_FLAT_DEVICE_HIERARCHY", "2x-max1550.json"),
    ("--backend xpu", "hybrid-4090-arc.json"),
    ("intel:", "hybrid-4090-arc.json"),
    ("GPU-0c1f3e2d", "a100-mig.json"),
    ("amd:", "4x-mi300x.json"),
)
_COMMAND = re.compile(r"^(?:\$ )?((?:[A-Z_]+=\S+ )*)xpulaunch (.*)$")


def _fences(language: str) -> list[str]:
    """The text of every fenced block opened with ```language (an indented fence too)."""
    # Line by line: a closing fence must never be taken for the opening of the next block.
    blocks: list[str] = []
    current: list[str] | None = None
    opened = ""
    for line in README.splitlines():
        fence = line.strip()
        if current is None and fence.startswith("```"):
            current, opened = [], fence[3:]
        elif current is not None and fence == "```":
            if opened == language:
                blocks.append("\n".join(current) + "\n")
            current = None
        elif current is not None:
            current.append(line)
    return blocks


def _commands() -> list[str]:
    lines = [line.strip() for block in _fences("") for line in block.splitlines()]
    return [
        shlex.join(shlex.split(line.removeprefix("$ "), comments=True))
        for line in lines
        if _COMMAND.match(line)
    ]


def _argv(command: str) -> tuple[list[str], dict[str, str]]:
    """The command as run here: its environment assignments, and a dry run for a launch."""
    match = _COMMAND.match(command)
    assert match is not None
    env = dict(a.split("=", 1) for a in match[1].split())
    words = shlex.split(match[2])
    first = words[2] if words[0] in ("-p", "--profile") else words[0]
    if first in ("devices", "status", "config", "logs"):
        return [CONSOLE, *words], env
    extra = ["--dry-run"] if "--dry-run" not in words else []
    inventory = next((f for key, f in INVENTORY_FOR if key in command), "2x-h200.json")
    extra += ["--inventory", str(inventory_path(inventory))]
    if words[0] == "llama" and "--llama-backend" not in words:
        extra += ["--llama-backend", "cuda"]
    cut = words.index("--") if "--" in words else len(words)
    if words[0] == "torchrun":  # torchrun passes everything after the script to the script
        cut = 1
    return [CONSOLE, *words[:cut], *extra, *words[cut:]], env


@pytest.fixture
def scratch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A directory with the files the README's commands name, and a private lock directory.
    A fenced block whose first line is ``# NAME`` (a file name, no directory) is that file."""
    for name in ("train.py", "sweep.py"):
        (tmp_path / name).write_text("print('hello')\n")
    for language in ("toml", "yaml"):
        for block in _fences(language):
            name = block.splitlines()[0].removeprefix("# ").split()[0]
            if block.startswith("# ") and "/" not in name:
                (tmp_path / name).write_text(block)
    (tmp_path / "model.gguf").write_bytes(b"GGUF")
    for block in _fences("toml"):  # the models a models.toml names
        for name in re.findall(r'^model = "([^"/]+\.gguf)"', block, re.MULTILINE):
            (tmp_path / name).write_bytes(b"GGUF")
    shutil.copy(inventory_path("2x-h200.json"), tmp_path / "host.json")
    for rank in ("0", "1"):  # a finished run's --log-dir, for `xpulaunch logs`
        log = tmp_path / "logs" / "attempt_0" / f"{rank}.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        log.write_text(f"2026-11-23T23:00:00.000Z hello from {rank}\n")
    (tmp_path / "logs" / "summary.json").write_text("{}\n")
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    monkeypatch.setenv("PATH", f"{Path(sys.executable).parent}{os.pathsep}/usr/bin:/bin")
    monkeypatch.delenv("XPULAUNCH_INVENTORY", raising=False)
    return tmp_path


def _run(argv: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        argv,
        cwd=cwd,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_the_readme_has_commands_and_python_to_run() -> None:
    assert len(_commands()) >= 20
    assert any(block.startswith("import sys\nimport xpulaunch") for block in _fences("python"))


@pytest.mark.parametrize("command", _commands())
def test_every_readme_command_runs(command: str, scratch: Path) -> None:
    argv, env = _argv(command)
    done = _run(argv, env, scratch)
    assert done.returncode == 0, f"{shlex.join(argv)}\n{done.stdout}\n{done.stderr}"


def test_the_python_blocks_not_run_are_still_in_the_readme() -> None:
    firsts = {block.splitlines()[0] for block in _fences("python")}
    assert set(PYTHON_NOT_RUN) <= firsts


@pytest.mark.parametrize(
    "block",
    [b for b in _fences("python") if b.splitlines()[0] not in PYTHON_NOT_RUN],
    ids=lambda b: b.splitlines()[0],
)
def test_every_readme_python_block_runs(block: str, scratch: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-c", block],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "exit status 0" in done.stdout


def test_the_readme_error_example_is_what_the_api_raises() -> None:
    import xpulaunch

    hello = [sys.executable, "-c", "pass"]
    with pytest.raises(xpulaunch.SelectionError) as raised:
        xpulaunch.plan(hello, gpus="3", inventory=str(inventory_path("2x-h200.json")))
    shown = re.search(r"raises `SelectionError: (.*?) \(\.\.\.\)`", README.replace("\n", " "))
    assert shown is not None
    assert raised.value.message.startswith(shown[1])
    assert raised.value.cli_message().startswith("--gpus 3: ")


def test_the_plan_shown_is_what_the_dry_run_prints(scratch: Path) -> None:
    block = next(b for b in _fences("") if b.startswith("$ xpulaunch run --dry-run"))
    command, *shown = block.splitlines()
    argv, env = _argv(command)
    printed = _run(argv, env, scratch).stdout.splitlines()
    for line in shown:
        if line.strip() == "...":
            continue
        pattern = re.escape(line).replace(re.escape("..."), ".*")
        assert any(re.fullmatch(pattern, p) for p in printed), line
