"""``xpulaunch.proc.which.which`` finds exactly what ``shutil.which`` finds (POSIX).

The launch path looks programs up without importing shutil (issue 4); check_program, the
probe's tool runner and ``api.resolve_argv`` all use it, with an explicit search path or
``$PATH``. tests/core/test_masks_startup.py covers more ``$PATH`` values.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from xpulaunch.errors import LaunchError
from xpulaunch.proc.launch import check_program
from xpulaunch.proc.which import which

PROGRAMS = ("tool", "./tool", "a/tool", "b/tool", "c/tool", "{t}/a/tool", "nope", "", "sh")
SEARCH_PATHS = (
    None, "", ":", os.pathsep.join(["{t}/b", "{t}/a"]), "{t}/c:{t}/a", "{t}/e", "{t}/a:{t}/a",
    "a", "b:", ":{t}/b", "{t}/missing:/bin", "/bin:{t}/a", "{t}/a/tool",
)  # fmt: skip


@pytest.mark.parametrize("search_path", SEARCH_PATHS)
def test_explicit_search_path_finds_what_shutil_finds(
    search_path: str | None, search_dirs: Path
) -> None:
    path = None if search_path is None else search_path.format(t=search_dirs)
    for program in (p.format(t=search_dirs) for p in PROGRAMS):
        assert which(program, path) == shutil.which(program, path=path), (path, program)


@pytest.mark.parametrize("environ_path", [None, "", "{t}/b:{t}/a", ":"])
def test_no_search_path_means_the_environment(
    environ_path: str | None, search_dirs: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if environ_path is None:
        monkeypatch.delenv("PATH", raising=False)  # then the system default (CS_PATH)
    else:
        monkeypatch.setenv("PATH", environ_path.format(t=search_dirs))
    for program in (p.format(t=search_dirs) for p in PROGRAMS):
        assert which(program) == shutil.which(program), (environ_path, program)


def test_check_program_searches_the_childs_path(search_dirs: Path) -> None:
    check_program(["tool"], {"PATH": f"{search_dirs}/b:{search_dirs}/a"}, None)
    with pytest.raises(LaunchError, match="tool: command not found on PATH"):
        check_program(["tool"], {"PATH": f"{search_dirs}/b"}, None)
