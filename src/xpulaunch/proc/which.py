"""``which``: find a program on PATH exactly as ``shutil.which`` does on POSIX.

Why not ``shutil.which``: importing shutil costs ~2 ms of start-up (it pulls in bz2, lzma,
zlib and fnmatch), and every launch looks a program up (issue 4: ``xpulaunch run`` may add
at most 60 ms over the bare program). This is CPython 3.11's POSIX branch of it, step for
step: a name with a directory part is checked as it is; ``PATH=""`` finds nothing while an
empty entry (``PATH=":/bin"``) means the current directory; entries are tried once each, in
order; a hit is an existing, executable (``F_OK | X_OK``) non-directory. There is no PATHEXT
on POSIX. tests/proc/test_which.py compares it with ``shutil.which`` case by case.
"""

from __future__ import annotations

import os


def which(program: str, path: str | None = None) -> str | None:
    """The file ``program`` runs as, or None; ``path`` None means ``$PATH`` (else the
    system default search path), like ``shutil.which(program, path=path)``."""
    if os.path.dirname(program):  # a path: checked as it is, not searched on PATH
        return program if is_executable_file(program) else None
    if path is None:
        path = os.environ.get("PATH")
        if path is None:
            try:
                path = os.confstr("CS_PATH")
            except (AttributeError, ValueError):  # no confstr or no CS_PATH here
                path = os.defpath
    if not path:  # PATH="" finds nothing, whereas PATH=":" searches the current directory
        return None
    seen: set[str] = set()
    for directory in os.fsdecode(path).split(os.pathsep):
        if directory not in seen:
            seen.add(directory)
            candidate = os.path.join(directory, program)
            if is_executable_file(candidate):
                return candidate
    return None


def is_executable_file(path: str) -> bool:
    return os.path.exists(path) and os.access(path, os.F_OK | os.X_OK) and not os.path.isdir(path)
