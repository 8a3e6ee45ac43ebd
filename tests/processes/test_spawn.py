"""Starting one worker: the parent-death signal both ways (setpriv, prctl in preexec_fn), and
the rule that picks setpriv only when the exec is sure to succeed, so that a program that
cannot run is still an OSError at spawn time."""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from helpers import wait_for
from process_kit import alive
from xpulaunch.processes import spawn as spawn_mod
from xpulaunch.processes.spawn import spawn

SETPRIV = spawn_mod._setpriv()


@pytest.fixture(autouse=True)
def _fresh_setpriv_lookup() -> Iterator[None]:
    lookup = spawn_mod._setpriv  # a test may replace it meanwhile
    lookup.cache_clear()
    yield
    lookup.cache_clear()


def _executable(path: Path, text: str) -> Path:
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


# -- which way ------------------------------------------------------------------------------


def test_an_elf_binary_execs(tmp_path: Path) -> None:
    assert spawn_mod._exec_will_succeed(os.path.realpath(sys.executable), {}, None)


def test_a_name_is_looked_up_on_the_workers_path(tmp_path: Path) -> None:
    _executable(tmp_path / "tool", "#!/bin/sh\nexit 0\n")
    assert spawn_mod._exec_will_succeed("tool", {"PATH": str(tmp_path)}, None)
    assert not spawn_mod._exec_will_succeed("tool", {"PATH": "/nonexistent"}, None)


def test_a_relative_path_is_taken_from_the_workers_directory(tmp_path: Path) -> None:
    _executable(tmp_path / "run.sh", "#!/bin/sh\nexit 0\n")
    assert spawn_mod._exec_will_succeed("./run.sh", {}, str(tmp_path))
    assert not spawn_mod._exec_will_succeed("./run.sh", {}, str(tmp_path / "elsewhere"))


@pytest.mark.parametrize(
    ("text", "mode", "execs"),
    [
        ("#!/bin/sh\nexit 0\n", 0o755, True),
        ("#! /bin/sh -e\nexit 0\n", 0o755, True),
        ("#!/nonexistent/interpreter\n", 0o755, False),  # Popen: FileNotFoundError
        ("#!/bin/sh\r\nexit 0\r\n", 0o755, False),  # CRLF: the kernel looks for "/bin/sh\r"
        ("#!\t/bin/sh\t-e\nexit 0\n", 0o755, True),
        ("#!sh\n", 0o755, False),  # a relative interpreter: not a sure yes
        ("echo no shebang\n", 0o755, False),  # Popen: ENOEXEC (no /bin/sh fallback)
        ("#!/bin/sh\nexit 0\n", 0o644, False),  # Popen: PermissionError
        ("", 0o755, False),
    ],
)
def test_only_a_sure_exec_goes_through_setpriv(
    tmp_path: Path, text: str, mode: int, execs: bool
) -> None:
    program = tmp_path / "program"
    program.write_text(text)
    program.chmod(mode)
    assert spawn_mod._exec_will_succeed(str(program), {}, None) is execs


def test_a_directory_or_a_missing_file_does_not_exec(tmp_path: Path) -> None:
    assert not spawn_mod._exec_will_succeed(str(tmp_path), {}, None)
    assert not spawn_mod._exec_will_succeed(str(tmp_path / "missing"), {}, None)


def _fake_setpriv(path: Path, version_text: str) -> Path:
    return _executable(path, f"#!/bin/sh\necho '{version_text}'\n")


def test_setpriv_needs_util_linux_2_33(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(spawn_mod, "SETPRIV_PATH", str(tmp_path))
    fake = _fake_setpriv(tmp_path / "setpriv", "setpriv from util-linux 2.31.1")  # no option
    assert spawn_mod._setpriv() is None
    spawn_mod._setpriv.cache_clear()
    _fake_setpriv(fake, "setpriv from util-linux 2.33")
    assert spawn_mod._setpriv() == str(fake)


@pytest.mark.parametrize(
    ("text", "version"),
    [
        ("setpriv from util-linux 2.38.1\n", (2, 38, 1)),
        ("setpriv from util-linux 2.33-rc2\n", (2, 33)),
        ("setpriv from util-linux 2.40\n", (2, 40)),
        ("BusyBox v1.36.1 (2023-11-07) multi-call binary.\n", None),
        ("setpriv: unrecognized option '--version'\n", None),
        ("", None),
    ],
)
def test_util_linux_version(text: str, version: tuple[int, ...] | None) -> None:
    assert spawn_mod.util_linux_version(text) == version


def test_a_busybox_setpriv_is_not_used(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    busybox = _fake_setpriv(tmp_path / "busybox", "BusyBox v1.36.1 multi-call binary.")
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "setpriv").symlink_to(busybox)
    monkeypatch.setattr(spawn_mod, "SETPRIV_PATH", str(tmp_path / "bin"))
    assert spawn_mod._setpriv() is None


def test_setpriv_is_looked_for_only_in_the_system_directories(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _fake_setpriv(tmp_path / "setpriv", "setpriv from util-linux 2.38.1")
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    found = spawn_mod._setpriv()
    assert found is None or not found.startswith(str(tmp_path))


# -- what the worker gets -------------------------------------------------------------------

_REPORT = "import json, os, sys; print(json.dumps({'argv': sys.argv, 'env': dict(os.environ)}))"


@pytest.mark.parametrize("way", ["setpriv", "prctl"])
def test_the_worker_gets_its_argv_and_env_unchanged(
    way: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    if way == "setpriv" and SETPRIV is None:
        pytest.skip("no util-linux setpriv with --pdeathsig (2.33+) on this host")
    if way == "prctl":
        monkeypatch.setattr(spawn_mod, "_setpriv", lambda: None)
    env = {"ONLY": "this", "PATH": os.environ["PATH"]}
    proc = spawn([sys.executable, "-c", _REPORT, "a b", ""], env)
    out, _ = proc.communicate(timeout=30)
    report = json.loads(out)
    assert report["argv"] == ["-c", "a b", ""]
    # LC_CTYPE: the child Python's own C-locale coercion (PEP 538) may set it, not us.
    assert {k: v for k, v in report["env"].items() if k != "LC_CTYPE"} == env
    assert (proc.args[0] == SETPRIV) is (way == "setpriv")  # the way under test was taken


@pytest.mark.parametrize(
    ("name", "text", "mode", "error"),
    [
        ("missing", None, 0, FileNotFoundError),
        ("plain.sh", "#!/bin/sh\nexit 0\n", 0o644, PermissionError),
        ("no-shebang", "echo hi\n", 0o755, OSError),  # ENOEXEC
        ("bad-interpreter", "#!/nonexistent/sh\n", 0o755, FileNotFoundError),
    ],
)
def test_a_program_that_cannot_run_fails_at_spawn(
    tmp_path: Path, name: str, text: str | None, mode: int, error: type[OSError]
) -> None:
    program = tmp_path / name
    if text is not None:
        program.write_text(text)
        program.chmod(mode)
    with pytest.raises(error):
        spawn([str(program)], {"PATH": os.defpath})


# -- the parent-death signal ----------------------------------------------------------------

_PARENT = """
import os, sys, time
from xpulaunch.processes import spawn as spawn_mod
if sys.argv[1] == "prctl":
    spawn_mod._setpriv = lambda: None
proc = spawn_mod.spawn(["/bin/sleep", "60"], dict(os.environ))
print(proc.pid, proc.args[0], flush=True)
time.sleep(60)
"""


@pytest.mark.parametrize("way", ["setpriv", "prctl"])
def test_the_worker_dies_with_its_parent(way: str) -> None:
    if way == "setpriv" and SETPRIV is None:
        pytest.skip("no util-linux setpriv with --pdeathsig (2.33+) on this host")
    parent = subprocess.Popen(
        [sys.executable, "-c", _PARENT, way], stdout=subprocess.PIPE, text=True
    )
    try:
        assert parent.stdout is not None
        pid_text, program = parent.stdout.readline().split()
        worker = int(pid_text)
        assert (program == SETPRIV) is (way == "setpriv")
        wait_for(lambda: _exe(worker).endswith("/sleep"), "the worker to exec sleep")
        assert alive(worker)
    finally:
        parent.send_signal(signal.SIGKILL)
        parent.wait(timeout=10)
    wait_for(lambda: not alive(worker), "the worker to die with its parent")


def _exe(pid: int) -> str:
    try:
        return os.readlink(f"/proc/{pid}/exe")
    except OSError:
        return ""
