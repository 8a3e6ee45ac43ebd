"""Shell completion through click's own protocol.

``xpulaunch completion bash|zsh|fish`` prints the script that the shell sources; the script
calls ``xpulaunch`` back with ``_XPULAUNCH_COMPLETE`` set (:func:`complete`, called by
:func:`xpulaunch.cli.main.main` before any command is parsed). The values completed beyond
click's commands and options (device ids, job ids) are :mod:`xpulaunch.cli.completion_values`.
"""

from __future__ import annotations

import os
import re

import click
from click.shell_completion import BashComplete, CompletionItem, split_arg_string

from xpulaunch.cli.commands import COMPLETE_VAR, CONTEXT_SETTINGS

PROG_NAME = "xpulaunch"
SHELLS = ("bash", "zsh", "fish")


@click.command(context_settings=CONTEXT_SETTINGS)
@click.argument("shell", type=click.Choice(SHELLS))
def completion(shell: str) -> int:
    """Print the shell completion script (eval "$(xpulaunch completion bash)")."""
    click.echo(script(shell))
    return 0


def script(shell: str) -> str:
    """The completion script click writes for ``shell``, for the ``xpulaunch`` executable."""
    from click.shell_completion import get_completion_class

    from xpulaunch.cli.group import cli

    _use_whole_words()
    kind = get_completion_class(shell)
    if kind is None:  # click.Choice refused it already; a clear line all the same
        raise click.BadParameter(f"no completion for {shell!r}; one of {', '.join(SHELLS)}")
    return kind(cli, {}, PROG_NAME, COMPLETE_VAR).source()


def complete(instruction: str) -> int:
    """Answer the shell's call-back (``bash_complete``, ``zsh_source``, ...), as click does."""
    from click.shell_completion import shell_complete

    from xpulaunch.cli.group import cli

    _use_whole_words()
    return shell_complete(cli, {}, PROG_NAME, COMPLETE_VAR, instruction)


def _use_whole_words() -> None:
    """Bash's completion for xpulaunch is :class:`WholeWordsBash` (click's own, otherwise)."""
    from click.shell_completion import add_completion_class

    add_completion_class(WholeWordsBash, "bash")


_BASH_BREAKS = "=:"  # of bash's COMP_WORDBREAKS, those our values contain (device=0, nvidia:0)


class WholeWordsBash(BashComplete):
    """click's bash completion, given the words as the user typed them.

    Bash splits ``--gpus device=0,`` at ``=`` (and ``nvidia:0`` at ``:``: COMP_WORDBREAKS), so
    click's script, which hands over COMP_WORDS, makes ``device``, ``=`` and ``0,`` of it and
    no value of ``--gpus`` is completed. This script hands over the line up to the cursor
    instead (COMP_LINE, COMP_POINT); the words are split from it as a shell would, and each
    value is given back as the part that replaces bash's own current word (after the last
    ``=`` or ``:``), which is what bash puts in its place.
    """

    source_template = BashComplete.source_template.replace(
        "COMP_CWORD=$COMP_CWORD",
        'COMP_CWORD=$COMP_CWORD COMP_LINE="$COMP_LINE" COMP_POINT=$COMP_POINT',
    )
    _drop = ""

    def get_completion_args(self) -> tuple[list[str], str]:
        line, point = os.environ.get("COMP_LINE"), os.environ.get("COMP_POINT", "")
        if line is None or not point.isdigit():  # an older script: click's own reading
            return super().get_completion_args()
        typed = line[: int(point)]
        words = split_arg_string(typed)
        incomplete = "" if not words or typed[-1:].isspace() else words.pop()
        # What click completes: the part after "=" of "--gpus=de"; bash replaces the part
        # after its last word break. What lies between is not sent back.
        clicks = incomplete.partition("=")[2] if incomplete.startswith("-") else incomplete
        bash_word = re.split(f"[{_BASH_BREAKS}]", incomplete)[-1]
        self._drop = clicks[: len(clicks) - len(bash_word)]
        return words[1:], incomplete

    def format_completion(self, item: CompletionItem) -> str:
        if item.type == "plain" and self._drop and item.value.startswith(self._drop):
            item = CompletionItem(item.value[len(self._drop) :], type=item.type, help=item.help)
        return super().format_completion(item)
