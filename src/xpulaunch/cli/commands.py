"""The ``xpulaunch`` commands by name, each imported only when it is used; and what every
command shares: ``-h``/``--help``, and option groups applied as one decorator."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any, TypeVar

import click

# name -> "module:attribute" of its click command. A command's module is imported when that
# command is used (click's documented "lazily loading subcommands" pattern), so that a dry run
# with --inventory never imports the probe or the llama.cpp code.
COMMANDS = {
    "run": "xpulaunch.cli.run:run",
    "devices": "xpulaunch.cli.devices:devices",
    "llama": "xpulaunch.cli.llama:llama",
    "status": "xpulaunch.cli.status:status",
    "config": "xpulaunch.cli.config:config",
    "logs": "xpulaunch.cli.logs:logs",
    "torchrun": "xpulaunch.cli.torchrun:torchrun",
    "submit": "xpulaunch.cli.submit:submit",
    "queue": "xpulaunch.cli.queue_list:queue",
    "cancel": "xpulaunch.cli.cancel:cancel",
    "hold": "xpulaunch.cli.hold:hold",
    "release": "xpulaunch.cli.hold:release",
    "runner": "xpulaunch.cli.runner:runner",
    "wait": "xpulaunch.cli.wait:wait",
    "top": "xpulaunch.cli.top:top",
    "completion": "xpulaunch.cli.completion:completion",
}

# What shell completion says of each command (zsh and fish show it beside the name), here so
# that completing a command name imports no command module.
SUMMARIES = {
    "run": "launch PROGRAM on chosen devices and supervise it",
    "devices": "list accelerators",
    "llama": "a llama-server pinned to chosen devices ('llama serve': the router)",
    "status": "device leases and launches waiting for devices",
    "config": "the config files and what they set",
    "logs": "a queued job's or a run's log files",
    "torchrun": "torchrun's options, then xpulaunch's supervision",
    "submit": "queue PROGRAM to run when its devices are free",
    "queue": "the queued, running and ended jobs",
    "cancel": "cancel jobs of yours",
    "hold": "keep queued jobs of yours from starting",
    "release": "let held jobs of yours start",
    "runner": "the runner that starts your queued jobs",
    "wait": "wait for queued jobs to end; their exit status",
    "top": "live view of devices, their jobs and the queue",
    "completion": "print the shell completion script",
}

COMPLETE_VAR = "_XPULAUNCH_COMPLETE"  # click's protocol: _{PROG_NAME}_COMPLETE


def load_command(name: str) -> click.Command:
    """The click command called ``name`` (one of :data:`COMMANDS`), its module imported."""
    module_name, attr = COMMANDS[name].split(":")
    command = getattr(importlib.import_module(module_name), attr)
    if not isinstance(command, click.Command):
        raise TypeError(f"{COMMANDS[name]} is not a click command")
    return command


def completer(name: str) -> Callable[[click.Context, click.Parameter, str], list[Any]]:
    """The ``shell_complete`` callback ``name`` of :mod:`xpulaunch.cli.completion_values`,
    imported only when the shell asks (a plain run never loads it)."""

    def complete(ctx: click.Context, param: click.Parameter, incomplete: str) -> list[Any]:
        from xpulaunch.cli import completion_values

        values: list[Any] = getattr(completion_values, name)(ctx, param, incomplete)
        return values

    return complete


F = TypeVar("F", bound=Callable[..., Any])

CONTEXT_SETTINGS: dict[str, Any] = {"help_option_names": ["-h", "--help"]}


def option_group(*options: Callable[[Any], Any]) -> Callable[[F], F]:
    """One decorator applying ``options`` (``click.option(...)`` results) in the order given,
    so that ``--help`` lists them in that order."""

    def apply(command: F) -> F:
        for option in reversed(options):  # the decorator nearest the function is listed last
            command = option(command)
        return command

    return apply
