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
}


def load_command(name: str) -> click.Command:
    """The click command called ``name`` (one of :data:`COMMANDS`), its module imported."""
    module_name, attr = COMMANDS[name].split(":")
    command = getattr(importlib.import_module(module_name), attr)
    if not isinstance(command, click.Command):
        raise TypeError(f"{COMMANDS[name]} is not a click command")
    return command


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
