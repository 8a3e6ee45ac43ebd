"""The ``xpulaunch`` group and ``main()``: which command a command line means, help, and one
line on stderr for every error."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import click
import pytest

from helpers import inventory_path
from xpulaunch import __version__
from xpulaunch.cli import main as main_module
from xpulaunch.cli.group import mistyped_command
from xpulaunch.cli.main import main
from xpulaunch.errors import XpulaunchError

XPULAUNCH = str(Path(sys.executable).parent / "xpulaunch")
CPU_ONLY = str(inventory_path("cpu-only.json"))
COMMANDS = ("run", "devices", "llama", "status", "logs", "torchrun")


def exit_status(*args: str) -> int:
    """Run ``main(args)`` in this process; its exit status."""
    with pytest.raises(SystemExit) as caught:
        main(list(args))
    code = caught.value.code
    assert isinstance(code, int)
    return code


def test_no_arguments_prints_the_whole_group_help(capsys: pytest.CaptureFixture[str]) -> None:
    assert exit_status() == 0
    out = capsys.readouterr().out
    assert out.startswith("Usage: xpulaunch [OPTIONS] COMMAND [ARGS]...\n")
    assert "\nCommands:\n" in out and len(out.splitlines()) > 10
    for command in COMMANDS:
        assert f"\n  {command} " in out


@pytest.mark.parametrize("flag", ["-h", "--help"])
@pytest.mark.parametrize("command", [None, *COMMANDS])
def test_help_on_the_group_and_every_command(
    flag: str, command: str | None, capsys: pytest.CaptureFixture[str]
) -> None:
    args = [flag] if command is None else [command, flag]
    assert exit_status(*args) == 0
    usage = "Usage: xpulaunch" + ("" if command is None else f" {command}")
    out = capsys.readouterr().out
    assert out.startswith(usage) and "-h, --help" in out


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    assert exit_status("--version") == 0
    assert capsys.readouterr().out == f"xpulaunch, version {__version__}\n"


def test_run_help_names_options_metavars_defaults_and_variables(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "100")
    assert exit_status("run", "--help") == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "Usage: xpulaunch run [OPTIONS] PROGRAM..." in out
    for text in (
        "--gpus SPEC", "[default: auto]", "--backend auto|cuda|xpu|rocm|cpu",
        "[env var: XPULAUNCH_BACKEND; default: auto]", "--nproc-per-node N|auto",
        "[default: 1]", "--master-port INTEGER", "--restart [no|on-failure|always]",
        "--backoff FIRST[:MAX[:FACTOR]]", "default: 1:30:2]", "--gang / --no-gang",
        "--log-dir DIRECTORY", "--ranks, --local-ranks-filter LIST", "--lock-dir DIR",
        "[env var: XPULAUNCH_LOCK_DIR]", "--wait-timeout SECONDS",
    ):  # fmt: skip
        assert text in out, text


def test_devices_help_shows_its_variable(capsys: pytest.CaptureFixture[str]) -> None:
    assert exit_status("devices", "--help") == 0
    assert "[env var: XPULAUNCH_INVENTORY]" in " ".join(capsys.readouterr().out.split())


@pytest.mark.parametrize(
    "args",
    [
        ["w.py", "--dry-run", "--gpus", "none", "--inventory", CPU_ONLY],
        ["--dry-run", "--inventory", CPU_ONLY, "w.py"],
        ["run", "--dry-run", "--inventory", CPU_ONLY, "--", "w.py"],
    ],
)
def test_a_first_word_that_is_no_command_means_run(
    args: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert exit_status(*args) == 0
    out = capsys.readouterr().out
    assert "backend: cpu" in out and "w.py" in out


@pytest.mark.parametrize(
    ("word", "command"), [("dev", "devices"), ("stauts", "status"), ("lama", "llama")]
)
def test_a_mistyped_command_is_refused_with_a_suggestion(
    word: str, command: str, capsys: pytest.CaptureFixture[str], tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    monkeypatch.chdir(tmp_path)
    assert exit_status(word, "--json") == 2
    assert capsys.readouterr().err == (
        f"xpulaunch: error: no command '{word}'; did you mean '{command}'? "
        f"(to run a program of that name: xpulaunch run {word})\n"
    )


def test_a_mistyped_command_that_names_a_file_or_a_program_is_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "dev").write_text("")
    program = tmp_path / "bin" / "stauts"
    program.parent.mkdir()
    program.write_text("#!/bin/sh\n")
    program.chmod(0o755)
    monkeypatch.setenv("PATH", f"{program.parent}{os.pathsep}{os.environ['PATH']}")
    assert mistyped_command("dev") is None and mistyped_command("stauts") is None
    assert mistyped_command("train.py") is None and mistyped_command("--gpus") is None
    assert exit_status("stauts", "--dry-run", "--inventory", CPU_ONLY) == 0
    assert "stauts" in capsys.readouterr().out


def test_a_usage_error_is_one_line_with_a_help_hint(capsys: pytest.CaptureFixture[str]) -> None:
    assert exit_status("--gpu", "2", "train.py") == 2
    assert capsys.readouterr().err == (
        "xpulaunch: error: No such option '--gpu'. Did you mean '--gpus'? "
        "(see 'xpulaunch run --help')\n"
    )


def test_an_xpulaunch_error_is_one_line_with_its_exit_status(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert exit_status("--dry-run", "--nproc-per-node", "0", "--inventory", CPU_ONLY, "w.py") == 2
    err = capsys.readouterr().err
    assert err.startswith("xpulaunch: error: --nproc-per-node: '0': expected")
    assert err.count("\n") == 1


def _raising(error: BaseException) -> object:
    def invoke(args: list[str]) -> object:
        raise error

    return invoke


def test_errors_keep_their_exit_status_and_become_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(
        main_module, "_invoke", _raising(XpulaunchError("two\n  lines", exit_code=7))
    )
    assert exit_status() == 7
    assert capsys.readouterr().err == "xpulaunch: error: two lines\n"


@pytest.mark.parametrize(
    ("error", "line"),
    [
        (PermissionError(13, "Permission denied", "/home/bob/x"),
         "/home/bob/x: Permission denied (XPULAUNCH_DEBUG=1 shows where)"),
        (OSError(28, "No space left on device"),
         "No space left on device (XPULAUNCH_DEBUG=1 shows where)"),
    ],
)  # fmt: skip
def test_an_os_error_no_check_foresaw_is_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], error: OSError, line: str
) -> None:
    monkeypatch.setattr(main_module, "_invoke", _raising(error))
    assert exit_status() == 1
    assert capsys.readouterr().err == f"xpulaunch: error: {line}\n"
    monkeypatch.setenv("XPULAUNCH_DEBUG", "1")
    with pytest.raises(OSError, match=error.strerror):
        main([])


def test_debug_shows_the_traceback(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XPULAUNCH_DEBUG", "1")
    with pytest.raises(click.BadParameter, match="expected a count"):
        main(["--dry-run", "--nproc-per-node", "0", "--inventory", CPU_ONLY, "w.py"])


def test_interrupted(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(main_module, "_invoke", _raising(KeyboardInterrupt()))
    assert exit_status() == 130
    assert capsys.readouterr().err == "xpulaunch: error: interrupted\n"


def test_the_executable_and_python_dash_m(tmp_path: Path) -> None:
    for argv in ([XPULAUNCH], [sys.executable, "-m", "xpulaunch"]):
        done = subprocess.run(
            [*argv, "--version"], capture_output=True, text=True, timeout=60, check=False
        )
        assert (done.returncode, done.stdout) == (0, f"xpulaunch, version {__version__}\n")


def test_a_reader_that_went_away_is_a_quiet_exit_not_a_traceback() -> None:
    """``xpulaunch devices | head -1``: the pipe's reader is gone before we write."""
    read_fd, write_fd = os.pipe()
    os.close(read_fd)
    inventory = str(inventory_path("8x-h100.json"))
    try:
        done = subprocess.run(
            [XPULAUNCH, "devices", "--inventory", inventory],
            stdout=write_fd, stderr=subprocess.PIPE, text=True, timeout=60, check=False,
        )  # fmt: skip
    finally:
        os.close(write_fd)
    assert (done.returncode, done.stderr) == (141, "")
