"""Shell completion through click's protocol (``_XPULAUNCH_COMPLETE``), as the scripts of
``xpulaunch completion bash|zsh|fish`` call it, and in a real bash in a terminal (tmux):
type a partial command, press Tab, read the line.

It used to print the help text: the entry point parsed the command line itself and never
reached click's completion hook."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from helpers import INVENTORIES, wait_for

XPULAUNCH = Path(sys.executable).parent / "xpulaunch"
TWO = str(INVENTORIES / "2x-h200.json")


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith(("XPULAUNCH_", "_XPU"))}
    return {**base, "XDG_RUNTIME_DIR": str(tmp_path), **extra}


def complete(tmp_path: Path, line: str, **extra: str) -> list[str]:
    """What bash's script gets back for the words of ``line`` (the last one being typed)."""
    words = line.split(" ")
    env = _env(tmp_path, COMP_WORDS=line, COMP_CWORD=str(len(words) - 1), **extra)
    env["_XPULAUNCH_COMPLETE"] = "bash_complete"
    done = subprocess.run(
        [str(XPULAUNCH)], env=env, capture_output=True, text=True, timeout=60, check=False
    )
    assert (done.returncode, done.stderr) == (0, ""), done.stderr
    return [line for line in done.stdout.splitlines() if line]  # (none: an empty line)


def test_commands_options_and_a_script_to_run(tmp_path: Path) -> None:
    assert complete(tmp_path, "xpulaunch de") == ["plain,devices"]
    assert complete(tmp_path, "xpulaunch c") == ["plain,cancel", "plain,completion", "plain,config"]
    assert "plain,--processes" in complete(tmp_path, "xpulaunch devices --")
    # the first word that is no command is a program to run: files, and run's options after it
    assert complete(tmp_path, "xpulaunch trai") == ["file,trai"]
    assert complete(tmp_path, "xpulaunch train.py --gp") == ["plain,--gpus", "plain,--gpu-memory"]
    assert "plain,--port" in complete(tmp_path, "xpulaunch llama serve --po")
    assert complete(tmp_path, "xpulaunch run --inventory inv") == ["file,inv"]
    assert complete(tmp_path, "xpulaunch top --inventory inv") == ["file,inv"]


def test_gpus_from_the_inventory_file(tmp_path: Path) -> None:
    values = ["auto", "all", "none", "1", "2", "device=0", "device=1"]
    assert complete(tmp_path, f"xpulaunch submit --inventory {TWO} --gpus ") == [
        f"plain,{v}" for v in values
    ]
    env = {"XPULAUNCH_INVENTORY": TWO}
    assert complete(tmp_path, "xpulaunch train.py --gpus dev", **env) == [
        "plain,device=0",
        "plain,device=1",
    ]
    assert complete(tmp_path, "xpulaunch run --gpus device=1,", **env) == ["plain,device=1,0"]
    # a file that is no inventory: nothing to offer but the words, and no error in the shell
    assert complete(tmp_path, f"xpulaunch run --inventory {__file__} --gpus ") == [
        "plain,auto",
        "plain,all",
        "plain,none",
    ]


def test_gpus_from_the_probe_are_kept_for_seconds(tmp_path: Path) -> None:
    sys.path.insert(0, str(Path(__file__).parents[1] / "probing"))
    from probe_fakes import FakeMachine, mi300x_host

    m = FakeMachine(tmp_path / "host")
    mi300x_host(m)
    host = {"XPULAUNCH_SYSFS_ROOT": str(m.sys), "XPULAUNCH_PROCFS_ROOT": str(m.proc)}
    line = "xpulaunch run --gpus device="
    assert complete(tmp_path, line, **host) == ["plain,device=0", "plain,device=1"]
    (cache,) = (tmp_path / "xpulaunch").glob("completion-devices-*.json")
    # The next Tab press reads the cache: the probe would find no device now.
    shutil.rmtree(m.sys / "bus" / "pci" / "devices")
    (m.sys / "bus" / "pci" / "devices").mkdir()
    assert complete(tmp_path, line, **host) == ["plain,device=0", "plain,device=1"]
    # Another host (another sysfs root) is not answered from it.
    other = FakeMachine(tmp_path / "other")
    elsewhere = {"XPULAUNCH_SYSFS_ROOT": str(other.sys), "XPULAUNCH_PROCFS_ROOT": str(other.proc)}
    assert complete(tmp_path, line, **elsewhere) == []
    # Once it is old, the probe runs again.
    old_s = time.time() - 3600
    os.utime(cache, (old_s, old_s))
    assert complete(tmp_path, line, **host) == []


def test_completing_a_command_name_imports_no_command(tmp_path: Path) -> None:
    code = (
        "import sys\n"
        "from xpulaunch.cli.main import main\n"
        "try:\n    main([])\nexcept SystemExit:\n    pass\n"
        "print(sorted(m for m in sys.modules if m.startswith('xpulaunch.cli.')), file=sys.stderr)"
    )
    env = _env(tmp_path, COMP_WORDS="xpulaunch t", COMP_CWORD="1")
    env["_XPULAUNCH_COMPLETE"] = "bash_complete"
    done = subprocess.run(
        [sys.executable, "-c", code],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.stdout.splitlines() == ["plain,top", "plain,torchrun"]
    loaded = eval(done.stderr)  # the list printed above
    assert not {"xpulaunch.cli.top", "xpulaunch.cli.torchrun", "xpulaunch.cli.run"} & set(loaded)


def test_every_command_has_a_summary() -> None:
    from xpulaunch.cli.commands import COMMANDS, SUMMARIES

    assert set(SUMMARIES) == set(COMMANDS)


@pytest.mark.parametrize(
    ("shell", "marks"),
    [
        ("bash", ("complete -o nosort -F _xpulaunch_completion xpulaunch", "bash_complete")),
        ("zsh", ("#compdef xpulaunch", "_XPULAUNCH_COMPLETE=zsh_complete")),
        ("fish", ("complete --no-files --command xpulaunch", "_XPULAUNCH_COMPLETE=fish_complete")),
    ],
)
def test_the_scripts(tmp_path: Path, shell: str, marks: tuple[str, ...]) -> None:
    source = {"_XPULAUNCH_COMPLETE": f"{shell}_source"}
    for args, extra in ((["completion", shell], {}), ([], source)):
        done = subprocess.run(
            [str(XPULAUNCH), *args],
            env=_env(tmp_path, **extra),
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert (done.returncode, done.stderr) == (0, "")
        assert all(mark in done.stdout for mark in marks), done.stdout
        assert "Usage:" not in done.stdout


def test_an_unknown_shell_is_a_usage_error(tmp_path: Path) -> None:
    done = subprocess.run(
        [str(XPULAUNCH), "completion", "tcsh"],
        env=_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.startswith("xpulaunch: error: ") and "'tcsh' is not one of" in done.stderr
    assert len(done.stderr.splitlines()) == 1


# --- a real bash in a real terminal -------------------------------------------------------


class Bash:
    """An interactive bash (no rc files) in a private tmux server, 120 columns wide."""

    def __init__(self, socket: Path) -> None:
        self.socket = str(socket)

    def __call__(self, *args: str) -> str:
        done = subprocess.run(
            ["tmux", "-S", self.socket, "-f", "/dev/null", *args],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        assert done.returncode == 0, f"tmux {args}: {done.stderr}"
        return done.stdout

    def last_line(self) -> str:
        lines = [line for line in self("capture-pane", "-p", "-t", "sh").splitlines() if line]
        return lines[-1] if lines else ""

    def type(self, text: str, *keys: str) -> None:
        self("send-keys", "-t", "sh", "-l", "--", text)
        if keys:
            self("send-keys", "-t", "sh", *keys)


@pytest.fixture
def bash(tmp_path: Path) -> Iterator[Bash]:
    if shutil.which("tmux") is None or shutil.which("bash") is None:
        pytest.skip("tmux or bash is not installed")
    shell = Bash(tmp_path / "tmux.sock")
    env = _env(tmp_path, PS1="$ ", XPULAUNCH_INVENTORY=TWO, TERM="screen")
    env["PATH"] = f"{XPULAUNCH.parent}{os.pathsep}{env.get('PATH', '')}"
    command = ["env", "-i", *(f"{k}={v}" for k, v in env.items()), "bash", "--norc", "--noprofile"]
    shell("new-session", "-d", "-s", "sh", "-x", "120", "-y", "30", "--", *command)
    try:
        yield shell
    finally:
        subprocess.run(
            ["tmux", "-S", shell.socket, "kill-server"], capture_output=True, check=False
        )


def test_tab_in_bash(bash: Bash, tmp_path: Path) -> None:
    (tmp_path / "train_me.py").write_text("print('hi')\n")
    bash.type(f'cd {tmp_path} && eval "$(xpulaunch completion bash)" && echo sourced', "Enter")
    wait_for(lambda: bash.last_line() == "$ " or "sourced" in bash.last_line(), "the script")
    wait_for(lambda: bash.last_line().strip() == "$", "the prompt after sourcing")
    bash.type("xpulaunch dev", "Tab")
    wait_for(lambda: bash.last_line() == "$ xpulaunch devices", "Tab to complete devices")
    bash.type("--proc", "Tab")
    wait_for(lambda: bash.last_line() == "$ xpulaunch devices --processes", "an option")
    bash("send-keys", "-t", "sh", "C-u")
    bash.type("xpulaunch train_m", "Tab")
    wait_for(lambda: bash.last_line() == "$ xpulaunch train_me.py", "a script to run")
    bash.type("--gpus device=0,", "Tab")
    wait_for(lambda: bash.last_line() == "$ xpulaunch train_me.py --gpus device=0,1", "a device id")
    bash("send-keys", "-t", "sh", "C-u")


def test_tab_in_zsh(tmp_path: Path) -> None:
    """zsh's own completion system (compinit) with the script of ``completion zsh``."""
    if shutil.which("tmux") is None or shutil.which("zsh") is None:
        pytest.skip("tmux or zsh is not installed")
    (tmp_path / "train_me.py").write_text("print('hi')\n")
    shell = Bash(tmp_path / "tmux.sock")
    env = _env(tmp_path, HOME=str(tmp_path), XPULAUNCH_INVENTORY=TWO, TERM="screen")
    env["PATH"] = f"{XPULAUNCH.parent}{os.pathsep}{env.get('PATH', '')}"
    command = ["env", "-i", *(f"{k}={v}" for k, v in env.items()), "zsh", "-f"]
    shell("new-session", "-d", "-s", "sh", "-x", "120", "-y", "30", "--", *command)
    try:
        setup = (
            'PS1="$ "; autoload -Uz compinit && compinit -u && eval "$(xpulaunch completion zsh)"'
        )
        shell.type(f"cd {tmp_path} && {setup}", "Enter")
        wait_for(lambda: shell.last_line().strip() == "$", "the prompt after sourcing")
        shell.type("xpulaunch train_m", "Tab")
        wait_for(lambda: shell.last_line().startswith("$ xpulaunch train_me.py"), "a script")
        shell.type("--gpus device=0,", "Tab")
        wait_for(
            lambda: shell.last_line() == "$ xpulaunch train_me.py --gpus device=0,1", "a device id"
        )
    finally:
        subprocess.run(
            ["tmux", "-S", shell.socket, "kill-server"], capture_output=True, check=False
        )
