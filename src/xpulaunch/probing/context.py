"""What every vendor adapter gets (roots, runner, env, limits) and what it hands back."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from xpulaunch.model import Problem
from xpulaunch.probing.runner import tool_env

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Mapping, Sequence
    from typing import TypeVar

    from xpulaunch.probing.observe import Observation
    from xpulaunch.probing.runner import Runner, RunResult

    T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class ProbeContext:
    # Roots as strings, walked with os.path (probe_host takes a Path too).
    sys_root: str
    proc_root: str
    runner: Runner
    env: Mapping[str, str]
    timeout_s: float
    report_missing: bool = False
    perfmon: bool = False
    use_nvml: bool = True
    nvml_module: object | None = None
    use_pyzes: bool = True
    pyzes_module: object | None = None
    use_torch: bool = False
    torch_python: str = "python3"
    torch_timeout_s: float = 60.0
    # Read how GPUs are linked (NVLink, XGMI, PCIe relations): bench/ and
    # docs/hardware/topology_check.sh time the probe without it.
    read_topology: bool = True


@dataclass(slots=True)
class VendorResult:
    """One vendor's observations, the problems met, and expected outcomes (``notes``).

    Notes (a tool not installed, no driver library on a host without that vendor's GPUs) only
    become problems when the caller asks for them (``devices --debug``).
    """

    observations: list[Observation] = field(default_factory=list)
    problems: list[Problem] = field(default_factory=list)
    notes: list[Problem] = field(default_factory=list)

    def all_problems(self, report_missing: bool) -> list[Problem]:
        return self.problems + (self.notes if report_missing else [])


def run_tool(
    ctx: ProbeContext,
    argv: Sequence[str],
    *,
    drop_env: Iterable[str] = (),
    set_env: Mapping[str, str] | None = None,
    timeout_s: float | None = None,
) -> RunResult | Problem | None:
    """Run a vendor tool found on PATH; ``None`` when it is not installed (an expected outcome).

    The tool's environment is a fresh dict: ``ctx.env`` without ``drop_env``, plus ``set_env``.
    """
    env = {**tool_env(ctx.env, drop_env), **(set_env or {})}
    path = ctx.runner.which(argv[0], env)
    if path is None:
        return None
    limit = ctx.timeout_s if timeout_s is None else timeout_s
    return ctx.runner.run([path, *argv[1:]], env=env, timeout_s=limit)


def parsed_run(
    ctx: ProbeContext,
    argv: Sequence[str],
    parse: Callable[[str], T],
    tool: str,
    *,
    failed_as: str | None = None,
    drop_env: Iterable[str] = (),
    set_env: Mapping[str, str] | None = None,
    timeout_s: float | None = None,
) -> T | Problem | None:
    """``parse`` of a tool's standard output (:func:`run_tool`'s None when it is not
    installed); a ``tool`` problem when it cannot run, exits non-zero (:func:`failed`, named
    ``failed_as``) or prints what ``parse`` cannot read."""
    from xpulaunch.probing.parsers.common import ParseError

    run = run_tool(ctx, argv, drop_env=drop_env, set_env=set_env, timeout_s=timeout_s)
    if run is None or isinstance(run, Problem):
        return run
    if run.returncode != 0:
        return failed(run, failed_as or tool)
    try:
        return parse(run.stdout)
    except ParseError as exc:
        return Problem(tool, str(exc))


def failed(result: RunResult, tool: str) -> Problem:
    """A tool that ran but exited non-zero, quoting its first line."""
    first = result.first_line()
    detail = f": {first}" if first else ""
    return Problem(tool, f"exited with status {result.returncode}{detail}")


def not_installed(tool: str) -> Problem:
    return Problem(tool, "not installed (not found on PATH)")


def parallel(calls: Sequence[Callable[[], T]]) -> list[T]:
    """Run independent calls on threads and return their results in order.

    A handful of calls, each waiting on a tool or a library: plain threads do, without a pool
    (``concurrent.futures`` also brings in ``logging``). An exception in a call is re-raised
    here, never lost with its thread.
    """
    if len(calls) <= 1:
        return [call() for call in calls]
    results: dict[int, T] = {}
    errors: dict[int, BaseException] = {}

    def target(i: int) -> None:
        try:
            results[i] = calls[i]()
        except BaseException as exc:  # noqa: BLE001 - re-raised by the caller below, not swallowed
            errors[i] = exc

    threads = [threading.Thread(target=target, args=(i,), daemon=True) for i in range(len(calls))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[min(errors)]
    return [results[i] for i in range(len(calls))]
