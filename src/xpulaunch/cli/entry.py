"""The ``xpulaunch`` executable and ``python -m xpulaunch``.

Before anything else of ours is imported, a command line that will run a job starts what does
not depend on how it is parsed: the probe of this host, in a forked child
(:class:`~xpulaunch.probing.isolated.ForkedProbe`), and under c10d the agent's interpreter
(:mod:`xpulaunch.proc.prestart`). Then :mod:`xpulaunch.cli.main` runs the command, which
takes both (:func:`forked_probe`) or ends them (:func:`discard_early`).
``XPULAUNCH_PRESTART=0`` starts neither early.

A run also imports its modules with the cyclic garbage collector paused: the objects an
import creates live as long as the process, so the collections they trigger free next to
nothing and only delay the workers' start. The run resumes the collector once its modules are
imported (:func:`resume_collector`), freezing what they created first, so that no later
collection walks it either (as torch's agent does in :mod:`xpulaunch.proc.prestart`).
"""

from __future__ import annotations

import gc
import os
import sys
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from xpulaunch.proc import prestart

if TYPE_CHECKING:
    from xpulaunch.probing.isolated import ForkedProbe

# The commands that run no job; the first word of a command line that is none of these (nor
# an option of the group) runs one (xpulaunch.cli.group: "run" is the default command).
# A test holds this equal to the group's commands less run and torchrun.
NOT_A_RUN = frozenset({"devices", "llama", "status", "config", "logs"})
# Words after which the command line does not probe as a run does (or probes nothing).
_NO_PROBE = frozenset({"--dry-run", "--help", "-h", "--version", "--inventory"})


# Whether this process paused the collector for its start (a list: nothing to rebind).
_collector_paused: list[bool] = []
# The probe console_main() started, until forked_probe() takes it or discard_early() ends it.
_early: list[ForkedProbe] = []


def console_main() -> None:
    args, environ = sys.argv[1:], os.environ
    if prestart.wanted(args, environ):
        prestart.start()  # in the forked child this runs the agent and never returns
    if probe_wanted(args, environ):
        if gc.isenabled():
            gc.disable()
            _collector_paused.append(True)
        from xpulaunch.probing.isolated import ForkedProbe

        _early.append(ForkedProbe(environ))
    from xpulaunch.cli.main import console_main as run_command

    run_command()


def probe_wanted(args: Sequence[str], environ: Mapping[str, str]) -> bool:
    """Whether this command line runs a job that probes this host, guessed from its words
    alone (before click is imported): a run (or ``torchrun``), not a dry run nor help, no
    ``--inventory``. A wrong yes costs a child that is ended unused; a wrong no, the probe's
    start as it was, after the parse."""
    words = prestart.own_words(args, environ)
    if words is None or any(word.partition("=")[0] in _NO_PROBE for word in words):
        return False
    first = after_profile(words)
    return first < len(words) and words[first] not in NOT_A_RUN


def forked_probe(env: Mapping[str, str]) -> ForkedProbe:
    """The probe :func:`console_main` started, when it probes ``env``; else a new one (and
    the early one, which probed another environment, is ended)."""
    from xpulaunch.probing.isolated import ForkedProbe

    early = _early.pop() if _early else None
    if early is not None and early.env == env:
        return early
    if early is not None:
        early.cancel()
    return ForkedProbe(env)


def discard_early() -> None:
    """End what this entry point started early and no run took (the command was another, or
    failed first): the probe, and c10d's agent."""
    while _early:
        _early.pop().cancel()
    prestart.discard()


def resume_collector() -> None:
    """Freeze what the start created and resume the collector, if :func:`console_main`
    paused it (never one that the application embedding us turned off)."""
    if _collector_paused:
        _collector_paused.clear()
        gc.freeze()
        gc.enable()


def after_profile(args: Sequence[str]) -> int:
    """Index of the first argument after leading ``-p NAME`` / ``--profile[=]NAME``."""
    i = 0
    while i < len(args):
        if args[i] in ("-p", "--profile"):
            i += 2
        elif args[i].startswith("--profile=") or (args[i].startswith("-p") and args[i] != "-p"):
            i += 1
        else:
            break
    return i
