"""Can this program run, and where is it: :func:`resolve_program`.

The contract's rule: a PROGRAM ending in ``.py`` runs under this interpreter
(``sys.executable``), a PROGRAM with a ``/`` is run as it is (from the worker's directory), and
anything else is looked up on the worker's ``PATH``, as ``execvpe`` would. A plan holds the
resolved command; a launch fails with one line before any device is reserved or any worker
started, instead of as a worker exiting 127.
"""

from __future__ import annotations

import difflib
import os
import shutil
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from xpulaunch.errors import LaunchError

# What is wrong -> (the error of a launch, the note of a dry run made for another machine).
_NO_SCRIPT = ("no such script", "no such script here")
_NO_FILE = ("no such file", "no such file here")
_NOT_EXECUTABLE = ("not executable", "not executable here")
_DIRECTORY = ("is a directory, not a program", "a directory here")
_FOUND = (_NOT_EXECUTABLE, _DIRECTORY)  # there, but cannot run: the shell's status 126
_NOT_ON_PATH = ("command not found on PATH", "not found on PATH here")


@dataclass(frozen=True, slots=True)
class ResolvedProgram:
    """The command to run, and why it cannot run here (only when that was allowed)."""

    argv: tuple[str, ...]
    note: str | None = None


def resolve_program(
    argv: Sequence[str],
    *,
    env: Mapping[str, str] | None = None,
    cwd: str | None = None,
    must_exist: bool = True,
    python_scripts: bool = True,
) -> ResolvedProgram:
    """The command that runs ``argv``, checked: raises a one-line :class:`LaunchError`
    (``train.py: no such script``, ``foo: command not found on PATH``, ``./x: not
    executable``); with ``must_exist=False`` (a dry run for another machine) the problem is
    returned as a note instead. ``env`` gives ``PATH`` (default: this process's), ``cwd``
    the directory relative paths start from. ``python_scripts``: a PROGRAM ending in ``.py``
    runs under this interpreter, the rule for what a user types; False for a command that is
    run as it is, such as a plan's. Resolving a resolved command changes nothing.
    """
    if not argv or not argv[0]:
        raise LaunchError("no PROGRAM given")
    program, args = argv[0], tuple(argv[1:])
    search_path = (os.environ if env is None else env).get("PATH", os.defpath)
    if python_scripts and program.endswith(".py"):
        command = (sys.executable, program, *args)
    elif os.sep in program:
        command = (program, *args)
    else:
        found = find_executable(program, search_path, cwd)
        command = (found or program, *args)
        if found is None:
            return _cannot_run(command, program, _NOT_ON_PATH, must_exist=must_exist)
    problem = _problem(command, cwd)
    if problem is None:
        return ResolvedProgram(command)
    return _cannot_run(command, *problem, must_exist=must_exist, cwd=cwd)


def find_executable(program: str, search_path: str, cwd: str | None) -> str | None:
    """Where ``execve`` finds ``program``: a path with a ``/`` from ``cwd``, a bare name on
    ``search_path``. None when there is no executable file there."""
    if os.sep in program:
        path = _from(cwd, program)
        return path if os.path.isfile(path) and os.access(path, os.X_OK) else None
    return shutil.which(program, path=search_path)


def _problem(command: tuple[str, ...], cwd: str | None) -> tuple[str, tuple[str, str]] | None:
    """What keeps a command whose program is a path from running: (the word to blame, what
    is wrong with it), or None."""
    program = _from(cwd, command[0])
    if os.path.isdir(program):
        return command[0], _DIRECTORY
    if not os.path.isfile(program):
        return command[0], _NO_FILE
    if not os.access(program, os.X_OK):
        return command[0], _NOT_EXECUTABLE
    script = _script(command) if _is_python(command[0]) else ""
    if script.endswith(".py") and not os.path.isfile(_from(cwd, script)):
        return script, _NO_SCRIPT
    return None


def _script(command: tuple[str, ...]) -> str:
    """The script of ``python SCRIPT ...`` or ``python -u SCRIPT ...`` (xpulaunch torchrun
    runs its scripts with ``-u``, as torchrun does)."""
    args = command[2:] if command[1:2] == ("-u",) else command[1:]
    return args[0] if args else ""


def _cannot_run(
    command: tuple[str, ...],
    culprit: str,
    problem: tuple[str, str],
    *,
    must_exist: bool,
    cwd: str | None = None,
) -> ResolvedProgram:
    error, note = problem
    if must_exist:
        if problem is _NO_SCRIPT:
            error += _closest_script(culprit, cwd)
        # The shell's statuses: 126 for a program found but not runnable, 127 not found.
        raise LaunchError(f"{culprit}: {error}", exit_code=126 if problem in _FOUND else 127)
    return ResolvedProgram(command, f"{culprit}: {note}")


def _closest_script(script: str, cwd: str | None) -> str:
    """``; did you mean train.py?`` for a mistyped script: the closest ``.py`` file in the
    folder it names (none close: nothing)."""
    folder, name = os.path.split(script)
    try:
        names = [n for n in os.listdir(_from(cwd, folder or os.curdir)) if n.endswith(".py")]
    except OSError:  # no such folder either, or not readable
        return ""
    close = difflib.get_close_matches(name, sorted(names), n=1)
    return f"; did you mean {os.path.join(folder, close[0])}?" if close else ""


def _from(cwd: str | None, path: str) -> str:
    return path if cwd is None else os.path.join(cwd, path)


def _is_python(program: str) -> bool:
    return program == sys.executable or os.path.basename(program).startswith("python")
