"""``xpulaunch submit [RUN OPTIONS] [--priority N] [--after ID] [--hold] -- PROGRAM [ARGS]...``:
queue a run and print its job id alone on stdout (``id=$(xpulaunch submit ...)``). With
``--array``, one job per index, and stdout is still one id, the array's first: that id (or
the ``--name``) means the whole array to ``cancel``, ``hold``, ``release``, ``wait`` and
``--after``; the ids of all of them are said on stderr.

The job is ``xpulaunch run --wait`` with the same options, started by this user's runner
when its turn comes, with the environment and working directory of this command. Its
options are checked now, by a dry run that ignores today's leases: a request that can never
be met fails here in one line, not hours later in a log.
"""

from __future__ import annotations

import os
import sys
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import click

from xpulaunch.cli.commands import CONTEXT_SETTINGS
from xpulaunch.cli.group import ProgramCommand, option_arity, split_args
from xpulaunch.cli.params import ParamType
from xpulaunch.cli.run import run as run_command, warn_torchrun_options
from xpulaunch.cli.run_options import accelerate_applied, dry_run_plan, to_request
from xpulaunch.errors import UsageError
from xpulaunch.jobqueue import actions
from xpulaunch.jobqueue.files import JobSpec
from xpulaunch.jobqueue.store import Store
from xpulaunch.processes.program import resolve_program

if TYPE_CHECKING:
    from xpulaunch.leases.lock_directory import LockDirectory
    from xpulaunch.model import Plan

_RAW_ARGS = "xpulaunch.submit_raw_args"
_NOT_FOR_SUBMIT = frozenset({"dry_run", "as_json"})
_OWN = {
    "--priority": 1,
    "--after": 1,
    "--after-any": 1,
    "--after-fail": 1,
    "--hold": 0,
    "--name": 1,
    "--array": 1,
    "--notify": 1,
}


class SubmitCommand(ProgramCommand):
    """``run``'s parameters plus the queue's own; keeps the raw arguments for the job."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        ctx.meta[_RAW_ARGS] = list(args)
        return super().parse_args(ctx, args)


def _submit(
    *,
    program: tuple[str, ...],
    priority: int,
    after: tuple[int | str, ...],
    after_any: tuple[int | str, ...],
    after_fail: tuple[int | str, ...],
    hold: bool,
    name: str | None,
    array: str | None,
    notify: str | None,
    **_: Any,
) -> int:
    ctx = click.get_current_context()
    if name is not None:
        actions.check_name(name)
    indices = actions.parse_array(array) if array is not None else ()
    run_args = run_arguments(ctx.meta[_RAW_ARGS], option_arity(ctx.command))
    plan, options = _checked_plan(ctx, run_args)  # run's values: config files' included
    env = dict(os.environ)
    cwd = _cwd()
    # The dry run plans for any machine; the job runs on this one: its program must exist.
    resolve_program(list(program), env=env, cwd=cwd)
    directory = actions.queue_directory(options.get("lock_dir"), env)
    if notify is not None:
        check_notify(notify, env, cwd)
    events, log_dir = options.get("events"), options.get("log_dir")
    if events == "-":
        raise UsageError("--events -: a queued job has no terminal; give a FILE")
    job = actions.Submission(
        spec=JobSpec(
            args=tuple(run_args),
            env=env,
            cwd=cwd,
            python=sys.executable,
            profile=ctx.parent.params.get("profile") if ctx.parent else None,
            events=os.path.abspath(events) if events else "",
            add_events=events is None,
            log_dir=os.path.abspath(log_dir) if log_dir else "",
            add_log_dir=log_dir is None,
            notify=notify or "",
        ),
        command=tuple(program),
        gpus=str(options.get("gpus") or "auto"),
        wanted=tuple(unit.label() for unit in plan.devices),
        shares=plan.share is not None,
        grace_s=float(options.get("grace") or 10.0),
        priority=priority,
        after=tuple(dict.fromkeys(after)),
        after_any=tuple(dict.fromkeys(after_any)),
        after_fail=tuple(dict.fromkeys(after_fail)),
        hold=hold,
        name=name,
        array=indices,
    )
    store = Store.open(directory, env, create=True)
    if store is None:  # pragma: no cover - created
        raise UsageError(f"cannot create the queue in {directory.root}")
    with store:
        actions.runner_can_start(directory)
        ids = actions.submit(directory, store, job)
    if len(ids) > 1:
        shown = f"{ids[0]}-{ids[-1]}" if ids == list(range(ids[0], ids[-1] + 1)) else ids_text(ids)
        also = f" or {name}" if name else ""
        click.echo(
            f"xpulaunch: jobs {shown}: an array of {len(ids)} (XPULAUNCH_ARRAY_INDEX "
            f"{indices[0]}-{indices[-1]}); {ids[0]}{also} means all of them",
            err=True,
        )
    if draining(directory):
        click.echo(
            "xpulaunch: queued; your runner drains: it starts no job until "
            "'xpulaunch runner --resume'",
            err=True,
        )
    else:
        actions.ensure_runner(directory, env)
    click.echo(str(ids[0]))
    return 0


def ids_text(ids: list[int]) -> str:
    return ", ".join(str(i) for i in ids)


def check_notify(command: str, env: dict[str, str], cwd: str) -> None:
    """``--notify CMD`` runs as ``sh -c CMD``: its first word must be a program found (or a
    builtin of sh), so that a typo is said now, not in the runner's log when the job ends."""
    import shlex
    import shutil

    try:
        words = shlex.split(command)
    except ValueError as exc:
        raise UsageError(f"--notify {command!r}: {exc}") from None
    while words and "=" in words[0] and not words[0].startswith("="):
        words = words[1:]  # VAR=value before the program
    if not words:
        raise UsageError("--notify needs a command, such as 'notify-send \"job ended\"'")
    first = os.path.expanduser(os.path.expandvars(words[0]))  # "$HOME/bin/alert"
    if first in _SH_BUILTINS or "$" in first or "`" in first:  # what sh alone can tell
        return
    where = first if "/" in first else shutil.which(first, path=env.get("PATH", os.defpath))
    path = os.path.join(cwd, where) if where and not os.path.isabs(where) else where
    if path is None or not os.path.isfile(path) or not os.access(path, os.X_OK):
        raise UsageError(f"--notify {command!r}: {first} is not an executable program here")


_SH_BUILTINS = frozenset(
    {":", ".", "cd", "echo", "eval", "exec", "exit", "export", "printf", "set", "test", "true"}
)


def draining(directory: LockDirectory) -> bool:
    from xpulaunch.jobqueue.files import drain_requested

    return drain_requested(directory, os.getuid())


def run_arguments(raw: list[str], arity: dict[str, int]) -> list[str]:
    """``run``'s arguments among ``submit``'s: the queue's own options taken out."""
    ours, program = split_args(raw, arity)
    kept: list[str] = []
    i = 0
    while i < len(ours):
        name = ours[i].split("=", 1)[0]
        takes = 0 if "=" in ours[i] else arity.get(name, 0)
        if name not in _OWN:
            kept.extend(ours[i : i + 1 + takes])
        i += 1 + takes
    return [*kept, "--", *program]


def _checked_plan(ctx: click.Context, run_args: list[str]) -> tuple[Plan, dict[str, Any]]:
    """The job's plan as a dry run makes it with no device leased (the checks a real run
    makes, and what it asks for), and run's option values as the job's run will see them
    (config files' defaults included)."""
    with run_command.make_context("run", list(run_args), parent=ctx.parent) as run_ctx:
        values = dict(run_ctx.params)
        program = values.pop("program")
        warn_torchrun_options(program)  # as run says it, in run's context
        options = {k: v for k, v in values.items() if k not in _NOT_FOR_SUBMIT}
        env = dict(os.environ)
        with accelerate_applied(options, env):
            request = to_request(program, options)
            plan = dry_run_plan(replace(request, lock_dir=_no_leases()), env)
    return plan, values


def _no_leases() -> str:
    """A lock directory that does not exist: the dry run sees no device leased."""
    import tempfile

    return os.path.join(tempfile.gettempdir(), f"xpulaunch-no-leases-{os.getpid()}-none")


def _cwd() -> str:
    try:
        return os.getcwd()
    except OSError as exc:
        raise UsageError(f"the working directory is gone ({exc.strerror}); cd somewhere") from exc


class JobId(ParamType):
    """A job id as ``submit`` prints it, or a job's ``--name``; an empty one (``--after
    "$id"`` after a submit that failed) says what was missing, not click's "is not a valid
    integer range"."""

    name = "ID"

    def convert(
        self, value: Any, param: click.Parameter | None, ctx: click.Context | None
    ) -> int | str:
        if isinstance(value, int):
            return value
        text = str(value).strip()
        if text.isascii() and text.isdigit() and int(text) > 0:
            return int(text)
        if actions.is_name(text):
            return text
        what = "an empty value" if not text else repr(str(value))
        option = param.opts[0] if param is not None and param.opts else "--after"
        raise UsageError(
            f"{option} needs a job id (a number such as 17, as xpulaunch submit prints it) "
            f"or a job's --name, not {what}"
        )


_submit_options = [
    click.Option(
        ["--priority"],
        type=click.IntRange(-1000, 1000),
        default=0,
        show_default=True,
        metavar="N",
        help="Higher goes first; equal priorities in submission order.",
    ),
    click.Option(
        ["--after"],
        type=JobId(),
        multiple=True,
        metavar="ID",
        help="Start only once job ID has ended successfully (again for several; a failed "
        "or cancelled ID cancels this job).",
    ),
    click.Option(
        ["--after-any"],
        type=JobId(),
        multiple=True,
        metavar="ID",
        help="Start once job ID has ended, however it ended.",
    ),
    click.Option(
        ["--after-fail"],
        type=JobId(),
        multiple=True,
        metavar="ID",
        help="Start only if job ID failed or was cancelled (it succeeded: this job is cancelled).",
    ),
    click.Option(["--hold"], is_flag=True, help="Queue it held: it starts once released."),
    click.Option(
        ["--name"],
        metavar="NAME",
        help="A name for it, usable wherever its id is (unique among your jobs not ended).",
    ),
    click.Option(
        ["--array"],
        metavar="N|LOW-HIGH",
        help="One job per index (0..N-1, or LOW..HIGH), each with XPULAUNCH_ARRAY_INDEX; "
        "prints the first id, which means the whole array.",
    ),
    click.Option(
        ["--notify"],
        metavar="CMD",
        help="Run 'sh -c CMD' when the job ends, with XPULAUNCH_JOB_ID, XPULAUNCH_JOB_NAME, "
        "XPULAUNCH_JOB_STATE, XPULAUNCH_JOB_EXIT_CODE set (60 s at most).",
    ),
]
_run_params = [p for p in run_command.params if p.name not in _NOT_FOR_SUBMIT]

submit = SubmitCommand(
    name="submit",
    context_settings=CONTEXT_SETTINGS,
    params=[*_run_params[:-1], *_submit_options, _run_params[-1]],
    callback=_submit,
    help="Queue PROGRAM to run when its devices are free; print its job id.\n\n"
    "Takes every option of 'xpulaunch run'. The job runs later, as this user, with this "
    "environment and working directory; 'xpulaunch queue' lists it, 'xpulaunch logs ID' "
    "shows its output, 'xpulaunch cancel ID' stops it.",
)
