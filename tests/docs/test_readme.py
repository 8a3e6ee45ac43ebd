"""Every README example that can run on a CPU host is run here, so README.md cannot drift from
the code.

Each ``xpulaunch ...`` line of a fenced block runs as written, in a scratch directory with the
files it names (``train.py``, ``model.gguf``, ...). A line that runs a shipped example
(``examples/...``) runs for real, as a new user would run it on this CPU host, unless a ``# GPU``
comment says it needs GPUs. Such a line, and every other command that would start a job or a
server (the README's ``train.py`` is the reader's own), gets ``--dry-run`` and an inventory
fixture instead of GPUs (``--llama-backend cuda`` too when the README leaves the build to be
asked from a binary that is not here): it must make a plan. Python blocks that start with
``import`` and use only xpulaunch run whole. The plan shown under "Plans" must match what the
command prints (``...`` stands for anything).
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
    ("--cpu-bind", "8x-h100.json"),
    ("--topology", "8x-a6000-nvlink-pairs.json"),
)
_COMMAND = re.compile(r"^(?:\$ )?((?:[A-Z_]+=\S+ )*)(?:\.venv/bin/)?xpulaunch (.*)$")
GPU_MARK = "# GPU"  # a comment that says a line needs GPUs


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


def _lines() -> list[str]:
    lines = [line.strip() for block in _fences("") for line in block.splitlines()]
    return [line for line in lines if _COMMAND.match(line)]


def _commands() -> list[str]:
    return [shlex.join(shlex.split(line.removeprefix("$ "), comments=True)) for line in _lines()]


GPU_ONLY = {
    shlex.join(shlex.split(line.removeprefix("$ "), comments=True))
    for line in _lines()
    if GPU_MARK in line
}


def _runs_for_real(words: list[str], command: str) -> bool:
    """A shipped example, not marked as needing GPUs: run as written."""
    return any(w.startswith("examples/") for w in words) and command not in GPU_ONLY


def _argv(command: str) -> tuple[list[str], dict[str, str]]:
    """The command as run here: its environment assignments, and a dry run for a launch."""
    match = _COMMAND.match(command)
    assert match is not None
    env = dict(a.split("=", 1) for a in match[1].split())
    words = shlex.split(match[2])
    first = words[2] if words[0] in ("-p", "--profile") else words[0]
    if first in ("devices", "status", "config", "logs") or _runs_for_real(words, command):
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
    (tmp_path / "examples").symlink_to(ROOT / "examples")  # the shipped examples, as in a clone
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
    if "--crash-at-step" in argv:  # the restart demo shows a restart, even after the Quickstart
        assert "restarting all workers" in done.stderr, done.stderr
        assert "resumed from step 10" in done.stdout, done.stdout


def test_every_shipped_example_line_runs_for_real_or_is_marked() -> None:
    examples = [c for c in _commands() if "examples/" in c]
    assert examples
    real = [c for c in examples if "--dry-run" not in _argv(c)[0]]
    assert any("device_map.py --gpus none" in c for c in real)
    assert any("--crash-at-step" in c for c in real)
    for command in examples:
        argv = _argv(command)[0]
        assert ("--dry-run" in argv) == (command in GPU_ONLY), command


def _gpus_table_ids() -> list[str]:
    """The ids of the README's ``--gpus`` table (explicit and vendor-qualified rows)."""
    section = README.split("### `--gpus`", 1)[1].split("\n\n", 2)[1]
    ids = []
    for row in section.splitlines():
        first = row.split("|")[1] if row.startswith("|") else ""
        ids += [v for v in re.findall(r"`([^`]+)`", first) if v not in ("auto", "all", "N", "none")]
    return ids


@pytest.mark.parametrize("value", _gpus_table_ids())
def test_every_id_in_the_gpus_table_names_a_device_of_a_fixture(value: str) -> None:
    import xpulaunch
    from xpulaunch.errors import XpulaunchError

    hello = [sys.executable, "-c", "pass"]
    fixtures = sorted(inventory_path("2x-h200.json").parent.glob("*.json"))
    planned = []
    for fixture in fixtures:
        try:
            plan = xpulaunch.plan(hello, gpus=value, inventory=str(fixture), parent_env={})
        except XpulaunchError:
            continue
        planned.append(plan)
    assert any(p.devices for p in planned), f"--gpus {value} matches no fixture's device"


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


def test_the_shared_box_script_runs(scratch: Path) -> None:
    """The "Shared box" block runs as a script, in order (its job ids are shell variables):
    against the fixture inventory, in a lock directory of its own."""
    from helpers import kill_all, process_gone, processes_marked

    (block,) = [b for b in _fences("sh") if "xpulaunch submit" in b]
    lock_dir = scratch / "shared"
    script = block.replace("/tmp/xpulaunch-shared", str(lock_dir))
    assert script != block
    env = {"XPULAUNCH_INVENTORY": str(inventory_path("2x-h200.json"))}
    try:
        done = _run(["bash", "-euo", "pipefail", "-c", script], env, scratch)
        assert done.returncode == 0, f"{done.stdout}\n{done.stderr}"
        assert re.search(r"^ID +USER +STATE +DEVICES", done.stdout, re.MULTILINE)
        assert re.search(r"^\d+ +\w+ +held .*python train.py --big$", done.stdout, re.MULTILINE)
        assert re.search(r"^job \d+: queued$", done.stdout, re.MULTILINE)  # released
        assert "hello" in done.stdout  # the first job's log, followed to its end
        assert re.search(r"^xpulaunch top .*\n+DEVICE +MEMORY", done.stdout, re.MULTILINE)
    finally:
        kill_all([p for p in processes_marked((str(lock_dir),)) if not process_gone(p)])


def test_every_gpu_line_of_a_script_block_is_marked() -> None:
    """A ```sh block reads as a script to paste: each of its lines that asks for GPUs says
    so (``# GPU``), as the README's rule for GPU lines has it (the queue block's did not, and
    failed on a CPU host at its first line)."""
    asking = re.compile(r"--gpus[ =](?:\d|device=|GPU-|MIG-)")
    blocks = _fences("sh")
    assert any(asking.search(block) for block in blocks)
    for block in blocks:
        for line in block.splitlines():
            if asking.search(line):
                assert GPU_MARK in line, line


def test_the_api_example_says_what_nproc_per_node_none_means() -> None:
    """The example passed ``nproc_per_node=None`` (and got 2 workers) without a word on it."""
    import xpulaunch

    (block,) = [b for b in _fences("python") if b.startswith("import sys\nimport xpulaunch")]
    assert "nproc_per_node=None is --nproc-per-node auto: one worker per device" in block
    hello = [sys.executable, "-c", "pass"]
    h200 = str(inventory_path("2x-h200.json"))
    auto = xpulaunch.plan(hello, gpus="2", nproc_per_node=None, inventory=h200, parent_env={})
    assert len(auto.workers) == 2
    assert len(xpulaunch.plan(hello, gpus="2", inventory=h200, parent_env={}).workers) == 1
    assert "one worker per selected device" in (xpulaunch.plan.__doc__ or "")
