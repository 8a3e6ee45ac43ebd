"""torchrun's command line (``torch/distributed/run.py``) translated into ``xpulaunch run``'s.

Every torchrun option is known here by both its spellings (``--nproc-per-node`` and
``--nproc_per_node``), so none is ever forwarded to the script by mistake. Each one is mapped
onto ours, accepted because it changes nothing here, or refused by name in one line.
No I/O but the ``PATH`` lookup of a ``--no-python`` program (and ``os.cpu_count``).
"""

from __future__ import annotations

import os
import shutil
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


def translate(args: Sequence[str], ours: Mapping[str, int], python: str) -> list[str]:
    """torchrun's ``args`` -> ``xpulaunch run`` arguments (ending ``-- PROGRAM ARGS...``).

    ``ours``: run's own option names and how many values each takes (they may be mixed in,
    e.g. ``--gpus``); ``python``: the interpreter for ``-m`` and scripts."""
    done = _read(args, ours)
    _map_values(done)
    return [*done.run_args, "--", *_program(done, python)]


def _read(args: Sequence[str], ours: Mapping[str, int]) -> Translation:
    done, i = Translation(), 0
    while i < len(args):
        arg = args[i]
        name, has_value, value = arg.partition("=")
        torchrun = canonical(name) if arg.startswith("-") else None
        if arg == "--" or not arg.startswith("-"):
            done.program = list(args[i + 1 :] if arg == "--" else args[i:])
            return done
        if torchrun in FLAGS:
            done.flags.add(torchrun)
        elif torchrun is not None:
            if not has_value:
                i += 1
                if i >= len(args):
                    raise UsageError(f"{name}: expected a value")
                value = args[i]
            done.values[torchrun] = value
        elif name in ours:
            takes = 0 if has_value else ours[name]
            done.run_args.extend(args[i : i + 1 + takes])
            i += takes
        else:
            raise UsageError(f"{name}: not an option of torchrun or xpulaunch run")
        i += 1
    return done


def _map_values(done: Translation) -> None:
    for option in (*done.flags, *done.values):
        if option in REFUSED:
            raise UsageError(f"{option}: not supported by xpulaunch torchrun ({REFUSED[option]})")
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
            raise UsageError("--standalone: a standalone job has one node; drop --nnodes")
        if "--rdzv-endpoint" in done.values:
            raise UsageError("--standalone: it picks a free port itself; drop --rdzv-endpoint")


def _one_node(done: Translation) -> bool:
    return done.values.get("--nnodes", "1") in ("1", "1:1")


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
    return ["--nproc-per-node", value]


def _rdzv_backend(value: str, done: Translation) -> list[str]:
    """static; c10d (on one node, no rendezvous is needed: xpulaunch picks a free port)."""
    if value == "static" or (value == "c10d" and _one_node(done)):
        return []
    if value == "c10d":
        return ["--rdzv-backend", "c10d"]
    raise UsageError(
        f"--rdzv-backend {value}: not supported by xpulaunch torchrun; use static "
        "(--master-addr/--master-port) or c10d (--rdzv-endpoint HOST:PORT)"
    )


def _rdzv_id(value: str, done: Translation) -> list[str]:
    """The run id names a c10d rendezvous; the static one has no use for it."""
    elastic = done.values.get("--rdzv-backend") == "c10d" and not _one_node(done)
    return ["--rdzv-id", value] if elastic else []


def _rdzv_conf(value: str, done: Translation) -> list[str]:
    """``join_timeout`` (and ``timeout``) become ``--join-timeout``; other keys are refused."""
    mapped: list[str] = []
    for pair in filter(None, value.split(",")):
        key, _, setting = pair.partition("=")
        if key.strip() not in ("join_timeout", "timeout"):
            raise UsageError(f"--rdzv-conf {key.strip()}: not supported (only join_timeout)")
        mapped = ["--join-timeout", setting.strip()]
    return mapped


def _role(value: str, done: Translation) -> list[str]:
    if value != "default":
        raise UsageError(f"--role {value}: not supported (every worker has ROLE_NAME=default)")
    return []


def _start_method(value: str, done: Translation) -> list[str]:
    if value not in ("spawn", "fork", "forkserver"):
        raise UsageError(f"--start-method {value}: expected spawn, fork or forkserver")
    return []  # every worker is a fresh process (exec), as with spawn


def _signals(value: str, done: Translation) -> list[str]:
    other = [s for s in (s.strip() for s in value.split(",")) if s and s not in _HANDLED_SIGNALS]
    if other:
        raise UsageError(
            f"--signals-to-handle {','.join(other)}: not supported (xpulaunch forwards "
            "SIGINT, SIGTERM and SIGHUP)"
        )
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
    # its console always shows and its --log-dir always keeps both streams of every worker;
    # events are xpulaunch's own.
    "--monitor-interval": _ignored,
    "--redirects": _ignored,
    "--tee": _ignored,
    "--event-log-handler": _ignored,
}


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
            raise UsageError(f"--no-python {first}: command not found on PATH")
        return [found, *rest]
    if first.endswith(".py"):
        return done.program
    return [python, first, *rest]  # torchrun runs any script under Python


def torchrun_options_in(args: Sequence[str]) -> list[str]:
    """The torchrun options among a program's arguments (``--nproc_per_node=2`` ->
    ``--nproc_per_node``): in plain ``run`` they reach the program, probably by mistake."""
    names = (arg.partition("=")[0] for arg in args if arg.startswith("--"))
    return [name for name in names if canonical(name) is not None]
