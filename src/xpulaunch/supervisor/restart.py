"""Restart policy as a value, and the pure decision of what to do when a run ends.

The supervisor (``supervisor/``) owns processes and clocks; this module only answers "a run just
ended like *this*: restart after how long, give up, or are we done?" from a
:class:`RestartState`, the :class:`Outcome`, the :class:`RestartPolicy` and ``now`` (seconds
on any monotonic clock the caller injects). Nothing here sleeps.

Two lessons from other supervisors shape the policy:

* supervisord restarts instantly after RUNNING and torchrun restarts the gang immediately;
  together with asynchronously released VRAM (the driver frees a dead process's memory
  after it exits) an instant restart often fails
  again. So restarts wait a capped exponential backoff.
* a job that ran fine for a long time and then failed once should not be treated like one
  that crash-loops: after ``stable_window_s`` of uptime the restart count starts over
  (supervisord ``startsecs``, circus' flapping window).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from enum import Enum

from xpulaunch.errors import UsageError, member_of

DEFAULT_MAX_RESTARTS = 3  # with --restart and no --max-restarts


class RestartMode(str, Enum):
    """When a run that ended is started again (docker's ``--restart`` words)."""

    NO = "no"
    ON_FAILURE = "on-failure"
    ALWAYS = "always"


class Outcome(str, Enum):
    """How a run ended, as far as the restart policy cares."""

    SUCCEEDED = "succeeded"  # every process exited with a success code
    FAILED = "failed"  # a non-zero exit, a signal, a failed health check, a failed start
    STOPPED = "stopped"  # stopped on request (stop(), Ctrl-C): never restarted


class Action(str, Enum):
    RESTART = "restart"
    GIVE_UP = "give-up"  # failed, and no restart is allowed
    DONE = "done"  # finished: succeeded, or stopped on request


@dataclass(frozen=True, slots=True)
class RestartPolicy:
    """How failures are answered.

    ``max_restarts`` counts restarts inside the current stability window; ``None`` means no
    limit. ``gang`` restarts every worker when one fails (torchrun, the default for one
    distributed job); without it each worker restarts on its own (supervisord, servers).
    """

    mode: RestartMode = RestartMode.ON_FAILURE
    max_restarts: int | None = 3
    backoff_initial_s: float = 1.0
    backoff_factor: float = 2.0
    backoff_max_s: float = 30.0
    stable_window_s: float = 60.0
    gang: bool = True

    def __post_init__(self) -> None:
        # A Python caller's word ("always"): decide() compares with `is`.
        object.__setattr__(self, "mode", member_of(RestartMode, "mode", self.mode))
        if self.max_restarts is not None and self.max_restarts < 0:
            raise UsageError(f"max restarts {self.max_restarts}: expected 0 or more")
        for name in ("backoff_initial_s", "backoff_max_s", "stable_window_s"):
            value = getattr(self, name)
            if not math.isfinite(value) or value < 0:
                raise UsageError(f"{name} {value}: expected a number of seconds >= 0")
        if not math.isfinite(self.backoff_factor) or self.backoff_factor < 1:
            raise UsageError(f"backoff factor {self.backoff_factor}: expected a number >= 1")

    def backoff_s(self, restarts: int) -> float:
        """Delay before restart number ``restarts + 1`` of the current window."""
        if self.backoff_initial_s == 0:
            return 0.0
        # Cap the exponent first: factor**k overflows a float long before k gets large.
        exponent = min(restarts, 64)
        delay_s = self.backoff_initial_s * self.backoff_factor**exponent
        return float(min(delay_s, self.backoff_max_s))


def restart_limit(mode: RestartMode, max_restarts: int | None) -> int | None:
    """How many restarts a worker may see (``TORCHELASTIC_MAX_RESTARTS``): 0 when restarts
    are off, None when there is no limit."""
    return 0 if mode is RestartMode.NO else max_restarts


@dataclass(frozen=True, slots=True)
class RestartState:
    """What the policy remembers about one restart unit (a gang, or one worker)."""

    restarts: int = 0  # restarts counted in the current stability window
    total_restarts: int = 0  # restarts since the supervisor started
    started_at_s: float | None = None  # when the current run started; None: not started

    def started(self, now: float) -> RestartState:
        """The state after a (re)start at ``now``."""
        return replace(self, started_at_s=now)


@dataclass(frozen=True, slots=True)
class Decision:
    action: Action
    state: RestartState  # the state to keep for the next decision
    delay_s: float = 0.0  # for RESTART: how long to wait before starting again
    reason: str = ""  # one human phrase for logs and the failure summary


def decide(state: RestartState, event: Outcome, policy: RestartPolicy, now: float) -> Decision:
    """What to do after a run of one restart unit ended with ``event`` at time ``now``."""
    if event is Outcome.STOPPED:
        return Decision(Action.DONE, state, reason="stopped on request")
    wants_restart = policy.mode is RestartMode.ALWAYS or (
        policy.mode is RestartMode.ON_FAILURE and event is Outcome.FAILED
    )
    if not wants_restart:
        if event is Outcome.SUCCEEDED:
            return Decision(Action.DONE, state, reason="finished")
        # Only mode NO gets here with a failure: the user asked for nothing, so do not quote
        # a policy back at them as if they had chosen it.
        return Decision(Action.GIVE_UP, state, reason="no restarts were requested")
    restarts = state.restarts
    ran_s = None if state.started_at_s is None else now - state.started_at_s
    if ran_s is not None and ran_s >= policy.stable_window_s:
        restarts = 0  # it ran stably: a fresh budget and the initial backoff
    if policy.max_restarts is not None and restarts >= policy.max_restarts:
        reason = f"no restarts left ({policy.max_restarts} allowed)"
        action = Action.GIVE_UP if event is Outcome.FAILED else Action.DONE
        return Decision(action, replace(state, restarts=restarts), reason=reason)
    delay_s = policy.backoff_s(restarts)
    next_state = RestartState(restarts + 1, state.total_restarts + 1, None)
    budget = "unlimited" if policy.max_restarts is None else str(policy.max_restarts)
    reason = f"restart {restarts + 1} of {budget} in {delay_s:g} s"
    return Decision(Action.RESTART, next_state, delay_s=delay_s, reason=reason)
