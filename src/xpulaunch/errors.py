"""The one error tree of xpulaunch.

Every error a user can cause or meet is an :class:`XpulaunchError`. The CLI turns it into a
single line on stderr and its ``exit_code``; nothing else escapes as a traceback unless
``XPULAUNCH_DEBUG=1``::

    XpulaunchError                  exit 1 unless noted
    +-- UsageError                  exit 2: malformed option, environment variable or value
    |   +-- MaskError               a visibility variable that cannot be parsed
    |   +-- InventoryError          an inventory document that is not valid
    +-- SelectionError              a device request that cannot be met (names candidates)
    +-- ProbeError                  a probe that could not run at all
    +-- LaunchError                 a program that cannot be started (missing, not executable)
    |   +-- NodesError              exit 125: the nodes of a job could not meet, or another
    |                               node failed or left (this node's workers did not fail)
    +-- WorkerFailedError           a worker failed for good; carries its exit code
    +-- LeaseError                  the lock directory cannot be used
    |   +-- DeviceBusyError         an explicit device is leased by another live job
    |   +-- WaitTimeoutError        --wait-timeout expired before devices became free
    +-- ServerStartError            llama-server did not become healthy (exit code, log tail)
    +-- QueueError                  the job queue cannot be used, or a job id is not one of yours
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from enum import Enum
from typing import TypeVar

E = TypeVar("E", bound=Enum)


class XpulaunchError(Exception):
    """Base of every error xpulaunch raises on purpose.

    An error about one parameter carries its name (``option``, the Python API's keyword) and
    the ``value`` it was given, and its text says only what is wrong with it. ``message`` (and
    ``str()``) names the parameter as a Python caller wrote it (``gpus='2': only 1 free
    device``); :meth:`cli_message` names the command-line option instead (``--gpus 2: ...``),
    so neither kind of user reads about an interface they did not use.
    """

    exit_code: int = 1

    def __init__(
        self,
        message: str,
        *,
        option: str | None = None,
        value: object = None,
        malformed: bool = False,
        exit_code: int | None = None,
    ) -> None:
        super().__init__(message)
        self.detail = message
        self.option = option
        self.value = value
        # A value that could not be parsed at all is quoted on the command line too, so that
        # an empty or odd text is visible; a value that parsed but cannot be met is shown as typed.
        self.malformed = malformed
        if exit_code is not None:
            self.exit_code = exit_code

    @property
    def message(self) -> str:
        """The text for a Python caller: ``gpus='2': ...``."""
        if self.option is None:
            return self.detail
        return f"{self.option}={self.value!r}: {self.detail}"

    def cli_message(self) -> str:
        """The text for a command-line user: ``--gpus 2: ...``."""
        if self.option is None:
            return self.detail
        flag = CLI_FLAGS.get(self.option, "--" + self.option.replace("_", "-"))
        if self.value is None or self.value is True:
            return f"{flag}: {self.detail}"
        shown = repr(self.value) if self.malformed else str(self.value)
        return f"{flag} {shown}: {self.detail}"

    def __str__(self) -> str:
        return self.message


# Python API keyword -> the command-line option that sets the same thing, where the names
# differ by more than ``_`` -> ``-`` (the API names carry their units).
CLI_FLAGS = {
    "min_free_memory_bytes": "--min-free-memory",
    "max_utilization_percent": "--max-utilization",
}


class UsageError(XpulaunchError):
    """A malformed option, environment variable or value given by the user."""

    exit_code = 2


def member_of(kind: type[E], option: str, value: object) -> E:
    """``value`` as a member of the str-Enum ``kind``: a member, or its word (a Python
    caller's ``restart="always"``); a :class:`UsageError` naming the words otherwise. Readers
    compare members with ``is``, so a word kept as a plain string would match none."""
    try:
        return kind(value)
    except ValueError:
        words = ", ".join(m.value for m in kind)
        raise UsageError(f"expected one of {words}", option=option, value=value) from None


def nearest(word: str, choices: Iterable[str]) -> str | None:
    """The choice closest to a mistyped ``word`` (difflib's measure), or None."""
    import difflib

    close = difflib.get_close_matches(word, list(choices), n=1)
    return close[0] if close else None


def not_one_of(word: str, choices: Iterable[str], what: str, where: str) -> UsageError:
    """``where: 'word' is not a WHAT; did you mean 'nearest'?`` as one error."""
    close = nearest(word, choices)
    hint = f"; did you mean {close!r}?" if close else ""
    return UsageError(f"{where}: {word!r} is not a {what}{hint}")


def refuse_unknown_keys(given: Iterable[object], known: Sequence[str], where: str) -> None:
    """A table's first unknown key, as one line naming the nearest known one and all of them."""
    unknown = sorted(str(k) for k in given if k not in known)
    if unknown:
        close = nearest(unknown[0], known)
        hint = f"did you mean {close!r}? " if close else ""
        raise UsageError(f"{where}: unknown key {unknown[0]!r}; {hint}expected {', '.join(known)}")


class MaskError(UsageError):
    """A visibility variable (CUDA_VISIBLE_DEVICES, ZE_AFFINITY_MASK, ...) that cannot be used."""


class InventoryError(UsageError):
    """An inventory document that is not valid; the message names the bad key."""


class SelectionError(XpulaunchError):
    """A device request that cannot be met by the visible, free devices."""


class ProbeError(XpulaunchError):
    """A probe that could not run at all (as opposed to a recorded problem)."""


class LaunchError(XpulaunchError):
    """A program that cannot be started."""

    exit_code = 127


# The exit status of a node whose job could not go on because of the other nodes: they did
# not meet, or one failed, gave up or left. 125 is what coreutils' env, nice and timeout and
# docker run exit with when they themselves fail rather than the command they run; 126 and
# 127 are the shell's "cannot execute" and "not found" for the program.
NODES_FAILED_STATUS = 125


class NodesError(LaunchError):
    """The nodes of a multi-node job could not meet (a node missing, refused or gone)."""

    exit_code = NODES_FAILED_STATUS


class WorkerFailedError(XpulaunchError):
    """A worker that failed for good."""


class LeaseError(XpulaunchError):
    """The lock directory cannot be used (permissions, no working locks)."""


class DeviceBusyError(LeaseError):
    """An explicitly requested device is leased by another live job."""


class WaitTimeoutError(LeaseError):
    """``--wait-timeout`` expired before enough devices became free."""


class ServerStartError(XpulaunchError):
    """A server (llama-server) exited or did not become healthy in time."""


class QueueError(XpulaunchError):
    """The job queue cannot be used (a corrupt or locked database, a network filesystem), or
    a job id that is unknown or belongs to another user."""


# The plain fields, by annotation, and the types a Python caller's value may have (click has
# converted the command line's already); a bool is no number, NaN no float.
_PLAIN_TYPES: dict[str, tuple[type, ...]] = {
    "str": (str,),
    "str | None": (str, type(None)),
    "bool": (bool,),
    "bool | None": (bool, type(None)),
    "int": (int,),
    "int | None": (int, type(None)),
    "float": (int, float),
    "float | None": (int, float, type(None)),
}  # fmt: skip (one row per annotation reads as a table)


def check_plain(name: str, value: object, annotation: str) -> None:
    """A Python caller's ``value`` for a parameter annotated as a plain type (str, bool, int,
    float, or one of them or None) is of that type; other annotations are not checked here.
    A bool is no number and NaN no float; an int is a float."""
    accepted = _PLAIN_TYPES.get(annotation)
    if accepted is None:
        return
    a_bool_for_a_number = isinstance(value, bool) and bool not in accepted
    nan = isinstance(value, float) and math.isnan(value)
    if isinstance(value, accepted) and not a_bool_for_a_number and not nan:
        return
    expected = annotation.replace(" | ", " or ").replace("float", "a number")
    raise UsageError(f"expected {expected}", option=name, value=value)
