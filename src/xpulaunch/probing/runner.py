"""Run a vendor tool with an explicit environment and a bounded timeout.

Every probe that shells out goes through a :class:`Runner`, so tests can hand in a fake one and
the real one is the only place that spawns. A tool that is not installed is an expected outcome
(``which`` returns ``None``); a tool that cannot run, times out or dies is returned as a
:class:`~xpulaunch.model.Problem` and never raised.
"""

from __future__ import annotations

import contextlib
import os
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from xpulaunch.model import Problem

if TYPE_CHECKING:
    import subprocess
    from collections.abc import Iterable, Mapping, Sequence


@dataclass(frozen=True, slots=True)
class RunResult:
    """A tool that ran to completion (any exit code)."""

    argv: tuple[str, ...]
    returncode: int
    stdout: str
    stderr: str
    elapsed_s: float = 0.0

    def first_line(self) -> str:
        """The first non-empty line of stdout, else stderr: what a one-line problem quotes."""
        for text in (self.stdout, self.stderr):
            for line in text.splitlines():
                if line.strip():
                    return line.strip()
        return ""


class Runner(Protocol):
    """Runs vendor tools. ``run`` never raises for a tool that misbehaves."""

    def which(self, tool: str, env: Mapping[str, str]) -> str | None:
        """Absolute path of ``tool`` on ``env["PATH"]``, or ``None`` when it is not installed."""

    def run(
        self, argv: Sequence[str], *, env: Mapping[str, str], timeout_s: float
    ) -> RunResult | Problem:
        """Run ``argv`` with exactly ``env``; a :class:`Problem` when it could not finish."""


class SubprocessRunner:
    """The real runner: a new session per tool, so a timeout kills the tool's whole group.
    ``shutil`` and ``subprocess`` are imported when a tool is first looked for: a probe that
    NVML answers runs none."""

    def which(self, tool: str, env: Mapping[str, str]) -> str | None:
        import shutil

        # The tool's own PATH, not this process's: ``env`` is what the tool will run with.
        return shutil.which(tool, path=env.get("PATH", os.defpath))

    def run(
        self, argv: Sequence[str], *, env: Mapping[str, str], timeout_s: float
    ) -> RunResult | Problem:
        import subprocess

        tool = os.path.basename(argv[0])
        started = time.monotonic()
        try:
            proc = subprocess.Popen(
                list(argv),
                env=dict(env),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                start_new_session=True,
            )
        except OSError as exc:
            return Problem(tool, f"cannot run {argv[0]}: {exc.strerror or exc}")
        try:
            out, err = proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            return Problem(tool, f"timed out after {timeout_s:g} s and was killed")
        except BaseException:
            # Ctrl-C (KeyboardInterrupt) while it runs: the terminal's SIGINT went to our
            # process group, not the tool's session, so nothing else would ever stop it.
            _kill_group(proc)
            raise
        return RunResult(
            argv=tuple(argv),
            returncode=proc.returncode,
            stdout=out.decode("utf-8", "replace"),
            stderr=err.decode("utf-8", "replace"),
            elapsed_s=time.monotonic() - started,
        )


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL the tool's process group, then reap it.

    1. The tool runs in its own session, so its pgid is its pid: helpers it forked die too.
    2. "Already gone" (ProcessLookupError) is success.
    3. Reap with a short bound: a grandchild that escaped the group could keep our pipes open,
       and a probe must never hang on it (closing the pipes ends that wait).
    """
    import signal
    import subprocess

    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    try:
        proc.communicate(timeout=1.0)
    except subprocess.TimeoutExpired:
        for stream in (proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()
        proc.wait(timeout=1.0)


def tool_env(parent_env: Mapping[str, str], drop: Iterable[str] = ()) -> dict[str, str]:
    """A fresh environment for a tool: ``parent_env`` without the names in ``drop``."""
    dropped = set(drop)
    return {k: v for k, v in parent_env.items() if k not in dropped}
