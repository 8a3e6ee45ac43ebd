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
    +-- WorkerFailedError           a worker failed for good; carries its exit code
    +-- LeaseError                  the lock directory cannot be used
    |   +-- DeviceBusyError         an explicit device is leased by another live job
    |   +-- WaitTimeoutError        --wait-timeout expired before devices became free
    +-- ServerStartError            llama-server did not become healthy (exit code, log tail)
"""

from __future__ import annotations


class XpulaunchError(Exception):
    """Base of every error xpulaunch raises on purpose."""

    exit_code: int = 1

    def __init__(self, message: str, *, exit_code: int | None = None) -> None:
        super().__init__(message)
        if exit_code is not None:
            self.exit_code = exit_code

    @property
    def message(self) -> str:
        return str(self.args[0]) if self.args else ""


class UsageError(XpulaunchError):
    """A malformed option, environment variable or value given by the user."""

    exit_code = 2


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
