"""resolve_program: where a PROGRAM is, and a one-line reason when it cannot run."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from xpulaunch.errors import LaunchError
from xpulaunch.processes.program import ResolvedProgram, find_executable, resolve_program


def test_a_script_runs_under_this_python_and_programs_are_found_on_path(
    search_dirs: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", f"{search_dirs}/b{os.pathsep}{search_dirs}/a")
    (search_dirs / "train.py").write_text("")
    assert resolve_program(["train.py", "--lr", "1"]) == ResolvedProgram(
        (sys.executable, "train.py", "--lr", "1")
    )
    assert resolve_program(["tool"]) == ResolvedProgram((f"{search_dirs}/a/tool",))
    assert resolve_program(["nope"], must_exist=False) == ResolvedProgram(
        ("nope",), "nope: not found on PATH here"
    )


@pytest.mark.parametrize(
    ("argv", "error", "note"),
    [
        (["missing.py"], "missing.py: no such script", "missing.py: no such script here"),
        (["nope"], "nope: command not found on PATH", "nope: not found on PATH here"),
        (["./nope"], "./nope: no such file", "./nope: no such file here"),
        (["b/tool"], "b/tool: not executable", "b/tool: not executable here"),
        # A directory: bash says "Is a directory", status 126 (it used to be "no such file").
        (["c/tool"], "c/tool: is a directory, not a program", "c/tool: a directory here"),
        (["python3", "gone.py"], "gone.py: no such script", "gone.py: no such script here"),
        # xpulaunch torchrun's python -u SCRIPT
        (["python3", "-u", "gone.py"], "gone.py: no such script", "gone.py: no such script here"),
    ],
)
def test_what_cannot_run_is_one_line_or_a_note_for_a_dry_run(
    search_dirs: Path, argv: list[str], error: str, note: str
) -> None:
    env = {"PATH": f"{search_dirs}/e{os.pathsep}{os.defpath}"}
    with pytest.raises(LaunchError) as caught:
        resolve_program(argv, env=env)
    assert caught.value.message == error
    # The shell's statuses: found but not runnable is 126, not found 127.
    assert caught.value.exit_code == (126 if "not executable" in error or "dir" in error else 127)
    assert resolve_program(argv, env=env, must_exist=False).note == note


def test_the_path_and_the_directory_are_the_workers(search_dirs: Path) -> None:
    assert resolve_program(["tool"], env={"PATH": f"{search_dirs}/a"}).argv == (
        f"{search_dirs}/a/tool",
    )
    with pytest.raises(LaunchError, match="tool: command not found on PATH"):
        resolve_program(["tool"], env={"PATH": f"{search_dirs}/e"})
    (search_dirs / "a" / "job.py").write_text("")
    resolve_program([sys.executable, "job.py"], env={}, cwd=str(search_dirs / "a"))
    with pytest.raises(LaunchError, match=r"job\.py: no such script"):
        resolve_program([sys.executable, "job.py"], env={}, cwd=str(search_dirs / "e"))


def test_a_resolved_command_resolves_to_itself(search_dirs: Path) -> None:
    (search_dirs / "train.py").write_text("")
    env = {"PATH": f"{search_dirs}/a"}
    for argv in (["train.py", "-x"], ["tool", "y"]):
        once = resolve_program(argv, env=env).argv
        assert resolve_program(once, env=env).argv == once


def test_a_plans_command_that_ends_in_py_is_run_as_it_is(search_dirs: Path) -> None:
    script = search_dirs / "a" / "run.py"
    script.write_text("#!/bin/sh\n")
    with pytest.raises(LaunchError, match=r"run\.py: not executable"):
        resolve_program([str(script)], python_scripts=False)
    script.chmod(0o755)
    assert resolve_program([str(script)], python_scripts=False).argv == (str(script),)
    assert resolve_program([str(script)]).argv == (sys.executable, str(script))


def test_no_program_is_an_error() -> None:
    with pytest.raises(LaunchError, match="no PROGRAM given"):
        resolve_program([])


def test_find_executable_is_the_lookup_exec_makes(search_dirs: Path) -> None:
    assert find_executable("tool", f"{search_dirs}/b:{search_dirs}/a", None) == (
        f"{search_dirs}/a/tool"
    )
    assert find_executable("./tool", "", str(search_dirs)) == f"{search_dirs}/./tool"
    assert find_executable("./tool", "", str(search_dirs / "e")) is None
    assert find_executable("b/tool", "", str(search_dirs)) is None


def test_a_mistyped_script_gets_the_closest_name_beside_it(tmp_path: Path) -> None:
    """``xpulaunch trian.py`` said only ``no such script``."""
    (tmp_path / "sub").mkdir()
    for name in ("train.py", "eval.py", "sub/train.py", "notes.txt"):
        (tmp_path / name).write_text("")
    cases = {
        "trian.py": "trian.py: no such script; did you mean train.py?",
        "sub/trian.py": "sub/trian.py: no such script; did you mean sub/train.py?",
        "zzzz.py": "zzzz.py: no such script",  # nothing close
        "gone/trian.py": "gone/trian.py: no such script",  # no such folder either
    }
    for script, error in cases.items():
        with pytest.raises(LaunchError) as caught:
            resolve_program([script], env={}, cwd=str(tmp_path))
        assert caught.value.message == error
        note = resolve_program([script], env={}, cwd=str(tmp_path), must_exist=False).note
        assert note == f"{script}: no such script here"  # a plan for another machine: no guess
