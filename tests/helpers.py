"""Test helpers shared by every test folder (importable as ``helpers``)."""

from __future__ import annotations

import fcntl
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from xpulaunch.core import inventory as inventory_doc
from xpulaunch.launch.request import RunRequest
from xpulaunch.model import Inventory

FIXTURES = Path(__file__).parent / "fixtures"
INVENTORIES = FIXTURES / "inventories"


def load_inventory(name: str) -> Inventory:
    return inventory_doc.loads((INVENTORIES / name).read_text(), source=name)


def inventory_path(name: str) -> Path:
    return INVENTORIES / name


def inventory_names() -> list[str]:
    return sorted(p.name for p in INVENTORIES.glob("*.json"))


def write_inventory(path: Path, devices: list[dict[str, object]]) -> Path:
    path.write_text(json.dumps({"schema": "xpulaunch.inventory/1", "devices": devices}))
    return path


def processes_marked(markers: tuple[str, ...]) -> list[Any]:
    """Live processes (not zombies, not this one) whose command line or environment contains
    one of ``markers``: how real-process tests find everything a launch started, grandchildren
    and the guardian included."""
    import os

    import psutil

    found = []
    for proc in psutil.process_iter(["cmdline", "environ", "status"]):
        if proc.info["status"] == psutil.STATUS_ZOMBIE or proc.pid == os.getpid():
            continue
        words = [*(proc.info["cmdline"] or []), *(proc.info["environ"] or {}).values()]
        if any(marker in word for word in words for marker in markers):
            found.append(proc)
    return found


def kill_all(procs: list[Any]) -> None:
    """SIGKILL ``procs`` (already gone is fine) and reap them, bounded."""
    import psutil

    for proc in procs:
        try:
            proc.kill()
        except psutil.NoSuchProcess:
            continue
    psutil.wait_procs(procs, timeout=10)


def reap(procs: list[Any], timeout_s: float = 60.0) -> None:
    """A fixture's teardown: kill whichever of ``procs`` (``subprocess.Popen``) still runs,
    then reap each and close its pipes."""
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
        proc.communicate(timeout=timeout_s)


def wait_for(condition: Callable[[], Any], what: object = "", timeout_s: float = 20.0) -> Any:
    """Poll ``condition`` until it returns something truthy, and return that; fail the test
    after ``timeout_s``, naming ``what`` it waited for (made into text only then)."""
    import time

    import pytest

    deadline_s = time.monotonic() + timeout_s
    while not (value := condition()):
        if time.monotonic() > deadline_s:
            pytest.fail(f"timed out after {timeout_s} s waiting for {what or condition}")
        time.sleep(0.02)
    return value


def lock_is_free(lock_file: str | Path) -> bool:
    """Whether a device lease's lock could be taken now (tried without keeping it: closing
    our descriptor drops ours)."""
    fd = os.open(lock_file, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    finally:
        os.close(fd)
    return True


ERROR = "xpulaunch: error: "


def one_line_error(err: str) -> str:
    """``err`` is exactly one xpulaunch error line, without a traceback; that line."""
    assert err.startswith(ERROR) and err.count("\n") == 1, err
    assert "Traceback" not in err
    return err.rstrip("\n")


def process_gone(proc: Any) -> bool:
    """A ``psutil.Process`` exited (a zombie holds no files); ``is_running`` also tells a
    reused pid apart."""
    import psutil

    try:
        return not proc.is_running() or proc.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def request_of(*argv: str, env: dict[str, str] | None = None) -> RunRequest:
    """The request a command line (``run ...`` or ``torchrun ...``, through the group and its
    config files) builds; nothing runs."""
    import click
    from click.testing import CliRunner

    from xpulaunch.cli import run_options
    from xpulaunch.cli.group import cli

    seen: list[RunRequest] = []
    real = run_options.to_request

    def spy(*a: object) -> RunRequest:
        seen.append(real(*a))  # type: ignore[arg-type]
        raise click.exceptions.Exit(0)

    run_options.to_request = spy  # type: ignore[assignment]
    try:
        result = CliRunner().invoke(cli, list(argv), env=env)
    finally:
        run_options.to_request = real
    assert result.exit_code == 0 and seen, (result.output, result.exception)
    return seen[0]


def cli_error(*argv: str, env: dict[str, str] | None = None) -> tuple[int, str]:
    """The exit status and stderr of ``xpulaunch ARGV`` that fails before anything starts."""
    import contextlib
    import io

    from xpulaunch.cli.main import main

    err = io.StringIO()
    saved = dict(os.environ)
    os.environ.update(env or {})
    code = 0
    try:
        with contextlib.redirect_stderr(err):
            main(list(argv))
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    finally:
        os.environ.clear()
        os.environ.update(saved)
    return code, err.getvalue()


def run_request(*args: str, env: dict[str, str] | None = None) -> RunRequest:
    """The request ``xpulaunch run ARGS -- prog`` builds; nothing runs."""
    return request_of("run", *args, "--", "prog", env=env)


def run_refused(*args: str, env: dict[str, str] | None = None) -> str:
    """The one error line click gives for ``xpulaunch run ARGS -- prog``."""
    from click.testing import CliRunner

    from xpulaunch.cli import run as run_module

    result = CliRunner().invoke(run_module.run, [*args, "--", "prog"], env=env)
    assert result.exit_code == 2, result.output
    return result.output
