"""Slurm host lists cross-checked with ``scontrol show hostnames`` where it is installed.

Our parser (:mod:`xpulaunch.nodes.hostlist`) needs no Slurm tools, so a dry run of a cluster
plan works anywhere; on a node where ``scontrol`` exists, Slurm's own expansion is the
authority, and a disagreement is said aloud (it would be our bug) and resolved Slurm's way.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Callable, Mapping

from xpulaunch.nodes.hostlist import expand_hostlist

_SCONTROL_TIMEOUT_S = 10.0


def checked_expander(
    env: Mapping[str, str], say: Callable[[str], None]
) -> Callable[[str], tuple[str, ...]]:
    """A host list expander for :func:`xpulaunch.nodes.settings.resolve_nodes`."""

    def expand(text: str) -> tuple[str, ...]:
        ours = expand_hostlist(text)
        theirs = scontrol_hostnames(text, env)
        if theirs is None or theirs == ours:
            return ours
        say(f"scontrol expands {text!r} to {' '.join(theirs)}, not {' '.join(ours)}; using it")
        return theirs

    return expand


def scontrol_hostnames(text: str, env: Mapping[str, str]) -> tuple[str, ...] | None:
    """``scontrol show hostnames TEXT``, or None where scontrol is missing or fails."""
    scontrol = shutil.which("scontrol", path=env.get("PATH"))
    if scontrol is None:
        return None
    try:
        done = subprocess.run(
            [scontrol, "show", "hostnames", text],
            capture_output=True,
            text=True,
            timeout=_SCONTROL_TIMEOUT_S,
            check=False,
            env=dict(env),
        )
    except (OSError, subprocess.TimeoutExpired):
        return None  # a broken or hung scontrol: our own expansion stands
    if done.returncode != 0:
        return None
    return tuple(done.stdout.split())
