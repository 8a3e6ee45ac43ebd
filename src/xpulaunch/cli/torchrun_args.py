"""torchrun's command line (``torch/distributed/run.py``) translated into ``xpulaunch run``'s.

Every torchrun option is known here by both its spellings (``--nproc-per-node`` and
``--nproc_per_node``), so none is ever forwarded to the script by mistake. Each one is mapped
onto ours, accepted because it changes nothing here, or refused by name in one line. As in
torchrun (``torch/distributed/argparse_util.py``), an option not on the command line is read
from ``PET_<NAME>`` (``PET_NPROC_PER_NODE``; a flag such as ``PET_STANDALONE`` is on when its
integer is not 0); the command line wins, and a refusal names the variable.
No I/O but the ``PATH`` lookup of a ``--no-python`` program (and ``os.cpu_count``); the
environment is an argument.
"""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from xpulaunch.errors import UsageError

# torchrun options without a value.
FLAGS = frozenset({"--standalone", "--module", "--no-python", "--run-path", "--virtual-local-rank"})
# torchrun options with a value (canonical dash spelling).
VALUED = frozenset({
    "--nnodes", "--nproc-per-node", "--rdzv-backend", "--rdzv-endpoint", "--rdzv-id",
    "--rdzv-conf", "--max-restarts", "--monitor-interval", "--start-method",
    "--event-log-handler", "--role", "--log-dir", "--redirects", "--tee",
    "--local-ranks-filter", "--duplicate-stdout-filters", "--duplicate-stderr-filters",
    "--node-rank", "--master-addr", "--master-port", "--local-addr", "--logs-specs",
    "--numa-binding", "--signals-to-handle", "--shutdown-timeout",
})  # fmt: skip
SHORT = {"-m": "--module", "-r": "--redirects", "-t": "--tee"}
# Options that only torchrun has: after PROGRAM in plain ``run`` they reach the script, and
# the user is warned (their dash spellings that are also ours are consumed by ``run``).
REFUSED = {
    "--local-addr": "xpulaunch binds no agent address of its own",
    "--logs-specs": "log destinations are --log-dir",
    "--numa-binding": "NUMA binding is not done by xpulaunch",
    "--virtual-local-rank": "every worker gets its own LOCAL_RANK",
    "--duplicate-stdout-filters": "use --log-dir (every worker's output is kept there)",
    "--duplicate-stderr-filters": "use --log-dir (every worker's output is kept there)",
}
_HANDLED_SIGNALS = {"SIGTERM", "SIGINT", "SIGHUP", "SIGQUIT"}
# The two options torchrun declares without its ``env`` action: no PET_ variable sets them.
NO_VARIABLE = frozenset({"--logs-specs", "--numa-binding"})
# torchrun's argparse types other than str, checked here so that a bad value is refused by
# the name the user gave it (the option, or its PET_ variable).
_NUMBERS: dict[str, Callable[[str], object]] = {
    "--max-restarts": int, "--node-rank": int, "--master-port": int,
    "--shutdown-timeout": int, "--monitor-interval": float,
}  # fmt: skip


def variable(option: str) -> str:
    """torchrun's variable for an option: ``PET_`` and its argparse ``dest`` in capitals
    (``--nproc-per-node`` -> ``PET_NPROC_PER_NODE``, ``-m/--module`` -> ``PET_MODULE``)."""
    return "PET_" + option[2:].replace("-", "_").upper()


def canonical(option: str) -> str | None:
    """The dash spelling of a torchrun option (``--nproc_per_node`` -> ``--nproc-per-node``),
    or None when ``option`` is not one."""
    name = SHORT.get(option, option)
    if not name.startswith("--"):
        return None
    name = "--" + name[2:].replace("_", "-")
    return name if name in FLAGS or name in VALUED else None


@dataclass
class Translation:
    """What has been read so far: ``run``'s options and the program to start."""

    run_args: list[str] = field(default_factory=list)
    flags: set[str] = field(default_factory=set)
    values: dict[str, str] = field(default_factory=dict)
    program: list[str] = field(default_factory=list)
    from_env: dict[str, str] = field(default_factory=dict)  # option -> "PET_NAME=value"

    def given(self, option: str, shown: str = "") -> str:
        """``option`` as the user gave it, for a message: ``--rdzv-backend etcd`` (``shown``
        after the option), or ``PET_RDZV_BACKEND=etcd`` when it came from the environment."""
        return self.from_env.get(option) or f"{option} {shown}".rstrip()


def translate(
    args: Sequence[str],
    ours: Mapping[str, int],
    python: str,
    env: Mapping[str, str],
    *,
    new_run_id: Callable[[], str] = lambda: str(uuid.uuid4()),
) -> list[str]:
    """torchrun's ``args`` -> ``xpulaunch run`` arguments (ending ``-- PROGRAM ARGS...``).

    ``ours``: run's own option names and how many values each takes (they may be mixed in,
    e.g. ``--gpus``); ``python``: the interpreter for ``-m`` and scripts; ``env``: where the
    ``PET_*`` defaults are read; ``new_run_id``: the run id of ``--standalone``."""
    done = _read(args, ours, _from_env(env))
    _map_values(done)
    return [*done.run_args, *_log_layout(done, new_run_id), "--", *_program(done, python)]


def _from_env(env: Mapping[str, str]) -> Translation:
    """torchrun's options from their ``PET_*`` variables; an empty one counts as unset (as
    click reads its own ``envvar=``)."""
    done = Translation()
    for option in sorted((FLAGS | VALUED) - NO_VARIABLE):
        value = env.get(variable(option), "")
        if not value:
            continue
        done.from_env[option] = said = f"{variable(option)}={value}"
        if option in VALUED:
            done.values[option] = value
        elif _flag_on(value, said):  # argparse_util.check_env: bool(int(value))
            done.flags.add(option)
    return done


def _flag_on(value: str, said: str) -> bool:
    try:
        return int(value) != 0
    except ValueError:
        raise UsageError(f"{said}: expected 1 (on) or 0 (off)") from None


def _read(args: Sequence[str], ours: Mapping[str, int], done: Translation) -> Translation:
    """The command line over what the environment gave (``done``): its options win."""
    i = 0
    while i < len(args):
        arg = args[i]
        name, has_value, value = arg.partition("=")
        torchrun = canonical(name) if arg.startswith("-") else None
        if arg == "--" or not arg.startswith("-"):
            done.program = list(args[i + 1 :] if arg == "--" else args[i:])
            return done
        if torchrun in FLAGS:
            done.flags.add(torchrun)
            done.from_env.pop(torchrun, None)
        elif torchrun is not None:
            if not has_value:
                i += 1
                if i >= len(args):
                    raise UsageError(f"{name}: expected a value")
                value = args[i]
            done.values[torchrun] = value
            done.from_env.pop(torchrun, None)
        elif name in ours:
            takes = 0 if has_value else ours[name]
            done.run_args.extend(args[i : i + 1 + takes])
            i += takes
        else:
            raise UsageError(f"{name}: not an option of torchrun or xpulaunch run")
        i += 1
    return done


def _map_values(done: Translation) -> None:
    for option in (*sorted(done.flags), *done.values):
        if option in REFUSED:
            raise UsageError(
                f"{done.given(option)}: not supported by xpulaunch torchrun ({REFUSED[option]})"
            )
    for option, kind in _NUMBERS.items():
        if option in done.values:
            _check_number(done, option, kind)
    if done.values.get("--rdzv-backend") == "c10d" and _one_node(done):
        # torchrun's usual one-node line (--rdzv-backend c10d --rdzv-endpoint localhost:0):
        # one node needs no rendezvous server, and xpulaunch picks a free port itself.
        done.values.pop("--rdzv-endpoint", None)
    for option, value in list(done.values.items()):
        handler = _HANDLERS.get(option)
        if handler is not None:
            done.run_args += handler(value, done)
    if "--standalone" in done.flags:
        if not _one_node(done):
            raise UsageError(
                f"{done.given('--standalone')}: a standalone job has one node; "
                f"drop {done.given('--nnodes', done.values['--nnodes'])}"
            )
        if "--rdzv-endpoint" in done.values:
            raise UsageError(
                f"{done.given('--standalone')}: it picks a free port itself; "
                f"drop {done.given('--rdzv-endpoint', done.values['--rdzv-endpoint'])}"
            )


def _check_number(done: Translation, option: str, kind: Callable[[str], object]) -> None:
    value = done.values[option]
    try:
        kind(value)
    except ValueError:
        what = "an integer" if kind is int else "a number"
        raise UsageError(f"{done.given(option, value)}: expected {what}") from None


def _one_node(done: Translation) -> bool:
    return done.values.get("--nnodes", "1") in ("1", "1:1")


def _elastic(done: Translation) -> bool:
    """A c10d job of several nodes: torch's agent runs it (see :mod:`xpulaunch.core.elastic`)."""
    return done.values.get("--rdzv-backend") == "c10d" and not _one_node(done)


def _same(option: str) -> Callable[[str, Translation], list[str]]:
    return lambda value, _: [option, value]


def _ignored(value: str, done: Translation) -> list[str]:
    """Accepted: no behaviour of ours depends on it (see the option's entry in the table)."""
    return []


def _nproc(value: str, done: Translation) -> list[str]:
    """torchrun's ``auto`` (its GPUs, else its CPUs), ``gpu``, ``xpu``, ``cpu`` or N."""
    named = {
        "gpu": ["--backend", "cuda"],
        "cuda": ["--backend", "cuda"],
        "xpu": ["--backend", "xpu"],
    }
    if value in named:
        return [*named[value], "--nproc-per-node", "auto"]
    if value == "cpu":  # one worker per CPU, as torchrun does
        return ["--gpus", "none", "--nproc-per-node", str(os.cpu_count() or 1)]
    if value != "auto" and not (value.isdigit() and int(value) > 0):
        raise UsageError(
            f"{done.given('--nproc-per-node', value)}: expected auto, gpu, xpu, cpu or a count"
        )
    return ["--nproc-per-node", value]


def _rdzv_backend(value: str, done: Translation) -> list[str]:
    """static; c10d (on one node, no rendezvous is needed: xpulaunch picks a free port)."""
    if value == "static" or (value == "c10d" and _one_node(done)):
        return []
    if value == "c10d":
        return ["--rdzv-backend", "c10d"]
    raise UsageError(
        f"{done.given('--rdzv-backend', value)}: not supported by xpulaunch torchrun; use "
        "static (--master-addr/--master-port) or c10d (--rdzv-endpoint HOST:PORT)"
    )


def _rdzv_id(value: str, done: Translation) -> list[str]:
    """The run id names a c10d rendezvous; the static one has no use for it (but for the
    name of the run's log directory: :func:`_log_layout`)."""
    return ["--rdzv-id", value] if _elastic(done) else []


def _rdzv_conf(value: str, done: Translation) -> list[str]:
    """``join_timeout`` (and ``timeout``, the static rendezvous's name) become
    ``--join-timeout``; torch's other c10d settings go to the agent of a multi-node c10d job
    (elsewhere no c10d rendezvous runs, and they change nothing, as in torchrun); a key torch's
    c10d rendezvous does not read is refused by name."""
    from xpulaunch.core.elastic import parse_rdzv_conf

    mapped: list[str] = []
    others: list[str] = []
    for pair in filter(None, (p.strip() for p in value.split(","))):
        key, _, setting = pair.partition("=")
        if key.strip() in ("join_timeout", "timeout"):
            mapped = ["--join-timeout", setting.strip()]
        else:
            parse_rdzv_conf(pair, said=lambda text: done.given("--rdzv-conf", text))
            others.append(pair)
    if others and _elastic(done):
        mapped += ["--rdzv-conf", ",".join(others)]
    return mapped


def _role(value: str, done: Translation) -> list[str]:
    if value != "default":
        said = done.given("--role", value)
        raise UsageError(f"{said}: not supported (every worker has ROLE_NAME=default)")
    return []


def _start_method(value: str, done: Translation) -> list[str]:
    if value not in ("spawn", "fork", "forkserver"):
        said = done.given("--start-method", value)
        raise UsageError(f"{said}: expected spawn, fork or forkserver")
    return []  # every worker is a fresh process (exec), as with spawn


def _signals(value: str, done: Translation) -> list[str]:
    other = [s for s in (s.strip() for s in value.split(",")) if s and s not in _HANDLED_SIGNALS]
    if other:
        said = done.given("--signals-to-handle", ",".join(other))
        raise UsageError(f"{said}: not supported (xpulaunch forwards SIGINT, SIGTERM and SIGHUP)")
    return []


_HANDLERS: dict[str, Callable[[str, Translation], list[str]]] = {
    "--nnodes": _same("--nnodes"),
    "--node-rank": _same("--node-rank"),
    "--master-addr": _same("--master-addr"),
    "--master-port": _same("--master-port"),
    "--rdzv-endpoint": _same("--rdzv-endpoint"),
    "--max-restarts": _same("--max-restarts"),
    "--log-dir": _same("--log-dir"),
    "--local-ranks-filter": _same("--ranks"),
    "--shutdown-timeout": _same("--grace"),
    "--nproc-per-node": _nproc,
    "--rdzv-backend": _rdzv_backend,
    "--rdzv-conf": _rdzv_conf,
    "--rdzv-id": _rdzv_id,
    "--role": _role,
    "--start-method": _start_method,
    "--signals-to-handle": _signals,
    # Accepted, changing nothing: xpulaunch waits for its children instead of polling them;
    # its console always shows and its --log-dir always keeps both streams of every worker
    # (torchrun's stdout.log and stderr.log, as with --redirects 3 --tee 3, which is what a
    # multi-node c10d agent is given); events are xpulaunch's own.
    "--monitor-interval": _ignored,
    "--redirects": _ignored,
    "--tee": _ignored,
    "--event-log-handler": _ignored,
}


def _log_layout(done: Translation, new_run_id: Callable[[], str]) -> list[str]:
    """torchrun's layout for ``--log-dir`` (however it is given: torchrun's option,
    ``PET_LOG_DIR``, ``XPULAUNCH_LOG_DIR``), the run's directory named after the rendezvous
    id as torchrun names it: a new uuid under ``--standalone``, else ``--rdzv-id`` (torchrun's
    default ``none``). In a multi-node c10d job torch's agent writes the layout itself
    (:func:`xpulaunch.cli.multinode_options.node_kwargs`), naming the run by ``--rdzv-id``."""
    run_id = new_run_id() if "--standalone" in done.flags else done.values.get("--rdzv-id")
    return ["--log-layout", "torchrun", "--log-run-id", run_id or "none"]


def _program(done: Translation, python: str) -> list[str]:
    if not done.program:
        raise UsageError("no script given: xpulaunch torchrun [OPTIONS] SCRIPT [ARGS]...")
    first, rest = done.program[0], done.program[1:]
    if "--module" in done.flags and "--no-python" in done.flags:
        raise UsageError("--module and --no-python: give one of them")
    if "--module" in done.flags:
        return [python, "-m", first, *rest]
    if "--no-python" in done.flags:
        found = first if "/" in first else shutil.which(first)
        if found is None:
            raise UsageError(f"{done.given('--no-python')} {first}: command not found on PATH")
        return [found, *rest]
    if first.endswith(".py"):
        return done.program
    return [python, first, *rest]  # torchrun runs any script under Python


def torchrun_options_in(args: Sequence[str]) -> list[str]:
    """The torchrun options among a program's arguments (``--nproc_per_node=2`` ->
    ``--nproc_per_node``): in plain ``run`` they reach the program, probably by mistake."""
    names = (arg.partition("=")[0] for arg in args if arg.startswith("--"))
    return [name for name in names if canonical(name) is not None]
