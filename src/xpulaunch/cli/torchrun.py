"""``xpulaunch torchrun [TORCHRUN_OPTIONS] SCRIPT [ARGS]...``: torchrun's command line
(``torch/distributed/run.py``), run by xpulaunch (device selection, leases, supervision and
cleanup on top).

Declared with click, like ``run``, whose options it has too: an option both have takes
torchrun's underscore spelling besides ours and reads torchrun's ``PET_<NAME>`` variable
before ours (torchrun's ``argparse_util.env`` action); torchrun's own options are declared
here, each mapped onto run's, accepted because it changes nothing here, or refused by name.
What click cannot say is kept small below: the ``PET_*`` flags (on when their integer is not
0, which no click flag type reads) and the meaning of a few values (``--nproc-per-node gpu``,
``--standalone``, ``-m``).
"""

from __future__ import annotations

import os
import shutil
import sys
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

import click

from xpulaunch.cli.commands import CONTEXT_SETTINGS
from xpulaunch.cli.params import Integer, ParamType
from xpulaunch.cli.run_options import Spec, run_parameters
from xpulaunch.errors import UsageError
from xpulaunch.nodes.settings import parse_rdzv_conf

# torchrun's default --signals-to-handle, and the two its help suggests for Slurm: xpulaunch
# stops the job on the first four and sends USR1 and USR2 on to the workers, whichever are
# listed (torch's agent would stop the workers on those too).
HANDLED_SIGNALS = frozenset({"SIGTERM", "SIGINT", "SIGHUP", "SIGQUIT", "SIGUSR1", "SIGUSR2"})
REFUSED = {
    "local_addr": "xpulaunch binds no agent address of its own",
    "logs_specs": "log destinations are --log-dir",
    "virtual_local_rank": "every worker gets its own LOCAL_RANK",
    "duplicate_stdout_filters": "use --log-dir (every worker's output is kept there)",
    "duplicate_stderr_filters": "use --log-dir (every worker's output is kept there)",
}
# torchrun's flags, read from PET_<NAME> when not given (bool(int(value)), as torchrun does).
FLAGS = ("standalone", "module", "no_python", "run_path", "virtual_local_rank")
# The two options torchrun declares without its env action: no PET_ variable sets them.
_NO_VARIABLE = frozenset({"logs_specs", "numa_binding"})


def _torchrun(*decls: str, flag: bool = False, **kwargs: Any) -> Spec:
    """One of torchrun's own options, by both its spellings."""
    dest = next(d for d in decls if d.startswith("--"))[2:].replace("-", "_")
    if flag:
        kwargs["is_flag"] = True
    elif dest not in _NO_VARIABLE:
        kwargs.setdefault("envvar", "PET_" + dest.upper())
    kwargs.setdefault("hidden", dest in REFUSED)
    return Spec((*dict.fromkeys([*decls, "--" + dest]), dest), kwargs)


TORCHRUN_ONLY = (
    _torchrun("--standalone", flag=True, help="One node, a free rendezvous port."),
    _torchrun("-m", "--module", flag=True, help="SCRIPT is a module: python -m SCRIPT."),
    _torchrun("--no-python", flag=True, help="SCRIPT is a program, not run under Python."),
    _torchrun("--run-path", flag=True, help="SCRIPT is run with python (runpy)."),
    _torchrun("--monitor-interval", type=float, help="Accepted; xpulaunch does not poll."),
    _torchrun(
        "--start-method",
        type=click.Choice(["spawn", "fork", "forkserver"]),
        help="Accepted; every worker is a fresh process.",
    ),
    _torchrun("--event-log-handler", help="Accepted; events are --events."),
    _torchrun(
        "--role",
        type=click.Choice(["default"]),
        help="Only default (every worker has ROLE_NAME=default).",
    ),
    _torchrun("-r", "--redirects", help="Accepted; the console and --log-dir keep both streams."),
    _torchrun("-t", "--tee", help="Accepted; the console and --log-dir keep both streams."),
    _torchrun(
        "--signals-to-handle",
        help="Accepted: TERM, INT, HUP, QUIT stop the job; USR1, USR2 reach the workers.",
    ),
    _torchrun("--shutdown-timeout", type=Integer(0), help="--grace, in whole seconds."),
    _torchrun("--local-addr"),
    _torchrun("--logs-specs"),
    _torchrun("--numa-binding", help="As --cpu-bind: node, socket, exclusive, core-complex."),
    _torchrun("--virtual-local-rank", flag=True),
    _torchrun("--duplicate-stdout-filters"),
    _torchrun("--duplicate-stderr-filters"),
)


class TorchrunNproc(ParamType):
    """torchrun's ``--nproc-per-node``: a count, ``auto``, ``gpu``/``cuda``, ``xpu``, ``cpu``."""

    name = "nproc"
    WORDS = ("auto", "gpu", "cuda", "xpu", "cpu")

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        text = str(value).strip().lower()
        if text in self.WORDS or (text.isascii() and text.isdigit() and int(text) > 0):
            return text
        self.fail(f"{value!r}: expected auto, gpu, xpu, cpu or a count", param, ctx)


def torchrun_command(args: tuple[str, ...], dry_run: bool, as_json: bool, **values: Any) -> int:
    """torchrun's options (dash or underscore spellings), then SCRIPT and its arguments.

    \b
    Mapped:   --nnodes --node-rank --master-addr --master-port --rdzv-endpoint
              --nproc-per-node N|auto|gpu|xpu|cpu --standalone --max-restarts --log-dir
              --local-ranks-filter --shutdown-timeout (as --grace) -m/--module --no-python
              --run-path --rdzv-conf --rdzv-backend static|c10d --rdzv-id
    Accepted: --monitor-interval --start-method --tee --redirects
              --event-log-handler --role default
              --signals-to-handle (TERM, INT, HUP, QUIT, USR1, USR2)
    As --cpu-bind: --numa-binding node|socket (numa), exclusive|core-complex (exclusive)
    Refused:  --local-addr --logs-specs --virtual-local-rank
              --duplicate-stdout-filters --duplicate-stderr-filters --rdzv-backend etcd
    Also:     every option of xpulaunch run, such as --gpus, --isolate, --dry-run.

    As in torchrun, an option not given is read from PET_<NAME> (PET_NPROC_PER_NODE=2,
    PET_STANDALONE=1); the command line wins.

    --rdzv-conf: join_timeout (or timeout) is --join-timeout; torch's other c10d keys
    (last_call_timeout=S, close_timeout, heartbeat_timeout, keep_alive_interval,
    keep_alive_max_attempt, read_timeout, is_host) go to the agent of a multi-node c10d job.

    --log-dir DIR is laid out as torchrun's: DIR/RUNID_XXXXXXXX/attempt_N/LOCAL_RANK/ with
    stdout.log, stderr.log (the lines as written) and error.json; in a multi-node c10d job
    torch's agent writes it. xpulaunch's console always shows and its log files always keep
    both streams of every worker, so --tee and --redirects change nothing. --nproc-per-node
    auto is one worker per selected device (one on the CPU).
    """
    from xpulaunch.cli.run_options import launch

    flags = {name: _flag(name, values.pop(name), os.environ) for name in FLAGS}
    sources = click.get_current_context().get_parameter_source
    default = click.core.ParameterSource.DEFAULT
    from_env = {name for name, on in flags.items() if on and sources(name) is default}
    _refuse(values, flags, from_env)
    program = _program(list(args), flags, os.environ.get("PYTHON_EXEC") or sys.executable)
    _map(values, flags, from_env)
    return launch(program, values, dry_run=dry_run, as_json=as_json)


def _flag(name: str, given: bool, env: Mapping[str, str]) -> bool:
    source = click.get_current_context().get_parameter_source(name)
    if given or source is not click.core.ParameterSource.DEFAULT:
        return given
    variable = "PET_" + name.upper()
    value = env.get(variable, "")
    if not value:  # an empty variable counts as unset, as click reads its own
        return False
    try:
        return int(value) != 0
    except ValueError:
        raise UsageError(f"{variable}={value}: expected 1 (on) or 0 (off)") from None


def _given(name: str, value: object, *, from_env: bool = False) -> str:
    """How the user gave an option, for a message: ``--role x`` or ``PET_ROLE=x``."""
    ctx = click.get_current_context()
    if from_env or ctx.get_parameter_source(name) is click.core.ParameterSource.ENVIRONMENT:
        return f"PET_{name.upper()}={value}"
    return f"--{name.replace('_', '-')} {value}".rstrip()


def _refuse(values: dict[str, Any], flags: Mapping[str, bool], from_env: set[str]) -> None:
    for name, why in REFUSED.items():
        if flags.get(name) or values.get(name) is not None:
            value = ("1" if name in from_env else "") if name in flags else values[name]
            shown = _given(name, value, from_env=name in from_env)
            raise UsageError(f"{shown}: not supported by xpulaunch torchrun ({why})")
    signals = (values.pop("signals_to_handle") or "").split(",")
    other = [s.strip() for s in signals if s.strip() and s.strip() not in HANDLED_SIGNALS]
    if other:
        raise UsageError(
            f"{_given('signals_to_handle', ','.join(other))}: not supported (xpulaunch stops "
            "the job on SIGINT, SIGTERM, SIGHUP and SIGQUIT, and sends SIGUSR1 and SIGUSR2 on "
            "to every worker without stopping it)"
        )


def _map(values: dict[str, Any], flags: Mapping[str, bool], from_env: set[str]) -> None:
    """torchrun's values -> run's, in place."""
    accepted = ("monitor_interval", "start_method", "event_log_handler", "role", "redirects", "tee")
    for name in (*REFUSED, *accepted):  # the refused ones are None by now
        values.pop(name, None)
    numa = values.pop("numa_binding")
    if numa is not None:
        from xpulaunch.core.cpu_bind import from_torchrun

        mode, note = from_torchrun(numa)
        values["cpu_bind"] = mode.value
        values["notes"] = (*values.get("notes", ()), *([note] if note else []))
    timeout = values.pop("shutdown_timeout")
    if timeout is not None:
        values["grace"] = float(timeout)
    _nproc(values)
    one_node = (values["nnodes"] or "1") in ("1", "1:1")
    backend = values["rdzv_backend"]
    if backend not in (None, "static", "c10d"):
        raise UsageError(
            f"{_given('rdzv_backend', backend)}: not supported by xpulaunch torchrun; use "
            "static (--master-addr/--master-port) or c10d (--rdzv-endpoint HOST:PORT)"
        )
    elastic = backend == "c10d" and not one_node
    if backend == "static":
        values["rdzv_backend"] = None  # run's default
    if backend == "c10d" and one_node:
        # torchrun's usual one-node line (--rdzv-backend c10d --rdzv-endpoint localhost:0):
        # one node needs no rendezvous server, and xpulaunch picks a free port itself.
        values["rdzv_backend"] = values["rdzv_endpoint"] = None
    _rdzv_conf(values, elastic)
    run_id = values["rdzv_id"]
    if not elastic:
        values["rdzv_id"] = None  # the static rendezvous has no use for it
    if flags["standalone"]:
        _standalone(values, one_node, from_env)
    # torchrun makes a one-node static line that names no port (no --master-port, no
    # --rdzv-endpoint) a standalone one (run() in torch/distributed/run.py): either way its
    # run id, TORCHELASTIC_RUN_ID and the --log-dir folder's name, is a new uuid, even over
    # a --rdzv-id.
    implicit = backend in (None, "static") and one_node and not values["rdzv_endpoint"]
    if flags["standalone"] or (implicit and values["master_port"] is None):
        run_id = str(uuid.uuid4())
    values["log_layout"] = "torchrun"
    values["log_run_id"] = run_id or "none"


def _nproc(values: dict[str, Any]) -> None:
    """torchrun's ``auto`` (its GPUs, else its CPUs), ``gpu``, ``xpu``, ``cpu`` or N."""
    word = values["nproc_per_node"]
    if word in ("gpu", "cuda", "xpu"):
        values["backend"] = "xpu" if word == "xpu" else "cuda"
        values["nproc_per_node"] = None
    elif word == "cpu":  # one worker per CPU, as torchrun does
        values["gpus"], values["nproc_per_node"] = "none", os.cpu_count() or 1
    else:
        values["nproc_per_node"] = None if word == "auto" else int(word)


def _rdzv_conf(values: dict[str, Any], elastic: bool) -> None:
    """``join_timeout`` (and ``timeout``, the static rendezvous's name) become
    ``--join-timeout``; torch's other c10d settings go to the agent of a multi-node c10d job
    (elsewhere no c10d rendezvous runs, and they change nothing, as in torchrun); a key torch's
    c10d rendezvous does not read is refused by name."""
    text = values["rdzv_conf"]
    if not text:
        return
    others = []
    for pair in filter(None, (p.strip() for p in text.split(","))):
        key, _, setting = pair.partition("=")
        if key.strip() in ("join_timeout", "timeout"):
            values["join_timeout"] = float(setting.strip())
        else:
            parse_rdzv_conf(pair, said=lambda shown: _given("rdzv_conf", shown))
            others.append(pair)
    values["rdzv_conf"] = ",".join(others) if others and elastic else None


def _standalone(values: dict[str, Any], one_node: bool, from_env: set[str]) -> None:
    said = _given("standalone", "1", from_env=True) if "standalone" in from_env else "--standalone"
    if not one_node:
        raise UsageError(
            f"{said}: a standalone job has one node; drop {_given('nnodes', values['nnodes'])}"
        )
    if values["rdzv_endpoint"]:
        raise UsageError(
            f"{said}: it picks a free port itself; drop "
            f"{_given('rdzv_endpoint', values['rdzv_endpoint'])}"
        )


def _program(args: list[str], flags: Mapping[str, bool], python: str) -> tuple[str, ...]:
    """The worker's command as torchrun builds it (``config_from_args``): a script or module
    runs under ``python -u`` (``python``: ``PYTHON_EXEC``, else this interpreter), so that its
    lines reach the console as it prints them and are not lost in a buffer when it is killed;
    ``--no-python`` runs the program as it is. ``--run-path`` comes first: torchrun then runs
    the script by its path with this interpreter, whatever ``-m`` or ``--no-python`` say."""
    first, rest = args[0], args[1:]
    if flags["run_path"]:
        return (sys.executable, "-u", first, *rest)
    if flags["module"] and flags["no_python"]:
        raise UsageError("--module and --no-python: give one of them")
    if flags["module"]:
        return (python, "-u", "-m", first, *rest)
    if flags["no_python"]:
        found = first if "/" in first else shutil.which(first)
        if found is None:
            raise UsageError(f"--no-python {first}: command not found on PATH")
        return (found, *rest)
    return (python, "-u", first, *rest)  # torchrun runs any script under Python


def _parameters() -> list[click.Parameter]:
    params = run_parameters(as_torchrun=True)
    for param in params:
        if param.name == "nproc_per_node":
            param.type = TorchrunNproc()
    return [
        *params,
        *(spec.option() for spec in TORCHRUN_ONLY),
        click.Argument(["args"], nargs=-1, required=True, type=click.UNPROCESSED),
    ]


def torchrun_options_in(args: Sequence[str]) -> list[str]:
    """The torchrun options among a program's arguments (``--nproc_per_node=2`` ->
    ``--nproc_per_node``): in plain ``run`` they reach the program, probably by mistake."""
    names = {opt for param in torchrun.params for opt in getattr(param, "opts", ())}
    found = (arg.partition("=")[0] for arg in args if arg.startswith("-"))
    return [name for name in found if name in names and name.startswith("--")]


torchrun = click.Command(
    "torchrun",
    params=_parameters(),
    callback=torchrun_command,
    help=torchrun_command.__doc__,
    context_settings={**CONTEXT_SETTINGS, "allow_interspersed_args": False},
)
