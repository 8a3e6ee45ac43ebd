"""What every command shares: ``-h``/``--help``, and option groups applied as one decorator."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

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
