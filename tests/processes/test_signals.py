"""Signals sent to an xpulaunch-like parent (drive_plan.py calling supervise)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from process_kit import alive, pids_in, wait_for
from xpulaunch.processes.signals import HANDLER_DELAY_S

Argv = Callable[..., list[str]]
Drive = Callable[..., subprocess.Popen[str]]


def pidfiles(tmp_path: Path, count: int) -> list[Path]:
    return [tmp_path / f"w{i}.pid" for i in range(count)]


def started(files: list[Path]) -> Callable[[], bool]:
    return lambda: all(f.exists() for f in files)


def test_sigterm_is_forwarded_and_gives_143(child: Argv, drive: Drive, tmp_path: Path) -> None:
    files = pidfiles(tmp_path, 2)
    proc = drive([child("sleeper.py", "--pidfile", f) for f in files], grace_s=30)
    wait_for(started(files))
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 143
    assert "SIGTERM: stopping every worker" in err
    assert not [f for f in files if alive(int(f.read_text()))]


def test_sigint_reaches_the_workers_once(child: Argv, drive: Drive, tmp_path: Path) -> None:
    files = pidfiles(tmp_path, 2)
    argvs = [child("sleeper.py", "--exit-7-on-int", "--pidfile", f) for f in files]
    proc = drive(argvs, grace_s=30)
    wait_for(started(files))
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 130, (out, err)
    # Each worker got exactly one SIGINT (its own session: not a second one from a terminal).
    got = sorted(line for line in out.splitlines() if "got" in line)
    assert got == ["[0] got SIGINT", "[1] got SIGINT"], (out, err)
    assert "failed" not in err, err  # exits during a requested stop are not failures


def test_second_signal_kills_at_once(child: Argv, drive: Drive, tmp_path: Path) -> None:
    out_dir = tmp_path / "pids"
    out_dir.mkdir()
    proc = drive([child("tree.py", out_dir, "--ignore-term")], grace_s=600)
    wait_for(lambda: len(pids_in(out_dir)) == 3)
    proc.send_signal(signal.SIGTERM)
    # Two signals sent back to back may reach Python as one (a pending signal is not
    # queued twice), so send the second after the first was acted on.
    assert proc.stderr is not None
    while "stopping every worker" not in proc.stderr.readline():
        assert proc.poll() is None
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=30)  # far below the 600 s grace
    assert proc.returncode == 143
    assert not [p for p in pids_in(out_dir) if alive(p)]


def test_sighup_is_forwarded(child: Argv, drive: Drive, tmp_path: Path) -> None:
    files = pidfiles(tmp_path, 1)
    proc = drive([child("sleeper.py", "--pidfile", files[0])], grace_s=30)
    wait_for(started(files))
    proc.send_signal(signal.SIGHUP)
    proc.communicate(timeout=30)
    assert proc.returncode == 128 + signal.SIGHUP


def test_sigquit_stops_the_job_as_torchrun_does(child: Argv, drive: Drive, tmp_path: Path) -> None:
    """torchrun's agent stops its workers on SIGQUIT (Ctrl-\\) as on SIGTERM, and `xpulaunch
    torchrun --help` says xpulaunch does: before, xpulaunch died of it at once (status -3,
    no message) and its workers were SIGKILLed by their parent-death signal, with no grace."""
    files = pidfiles(tmp_path, 2)
    argvs = [child("sleeper.py", "--exit-7-on-quit", "--pidfile", f) for f in files]
    proc = drive(argvs, grace_s=30)
    wait_for(started(files))
    proc.send_signal(signal.SIGQUIT)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 128 + signal.SIGQUIT, (out, err)
    assert "SIGQUIT: stopping every worker" in err
    got = sorted(line for line in out.splitlines() if "got" in line)
    assert got == ["[0] got SIGQUIT", "[1] got SIGQUIT"], (out, err)


def test_missing_program_is_one_line(child: Argv, drive: Drive) -> None:
    proc = drive([child("sleeper.py"), ["/nonexistent/prog"]])
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 127
    lines = [line for line in err.splitlines() if not line.startswith("driver pid")]
    assert lines == ["xpulaunch: error: /nonexistent/prog: no such file"]
    assert out == ""


# A signal that the kernel hands to a thread other than the main one: Python runs the handler
# only once the main thread runs Python code again. The main thread waits with
# wait_answering(); a plain wait on the same event is the control (its handler runs late).
_OTHER_THREAD = """
import json, signal, threading, time
from xpulaunch.processes.signals import forwarding, wait_answering

handled = threading.Event()
other = threading.Thread(target=time.sleep, args=(60,), daemon=True)
other.start()

def send_to_other():
    signal.pthread_kill(other.ident, signal.SIGTERM)

with forwarding(lambda signum: handled.set()):
    threading.Timer(0.1, send_to_other).start()
    plain = handled.wait(2.0)  # the control: a blocking wait does not run the handler
    handled.clear()
    threading.Timer(0.1, send_to_other).start()
    started = time.monotonic()
    answered = wait_answering(lambda timeout: True if handled.wait(timeout) else None, None)
    print(json.dumps({"plain": plain, "answered": answered,
                      "took_s": time.monotonic() - started}))
"""


def test_a_signal_taken_by_another_thread_is_answered_while_the_main_thread_waits() -> None:
    done = subprocess.run(
        [sys.executable, "-c", _OTHER_THREAD], capture_output=True, text=True, timeout=30,
        check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["plain"] is False  # no handler ran during the blocking wait
    assert result["answered"] is True
    assert result["took_s"] < 10 * HANDLER_DELAY_S


def test_wait_answering_keeps_the_callers_timeout() -> None:
    import time

    from xpulaunch.processes.signals import wait_answering

    slices: list[float | None] = []

    def never(timeout: float | None) -> None:
        slices.append(timeout)
        time.sleep(timeout or 0)

    started = time.monotonic()
    assert wait_answering(never, 1.2) is None
    assert 1.2 <= time.monotonic() - started < 1.2 + 2 * HANDLER_DELAY_S
    assert all(s is not None and s <= HANDLER_DELAY_S for s in slices) and len(slices) >= 3
    assert wait_answering(lambda timeout: 7, None) == 7  # what the wait returns, at once
