"""A gang: the workers that are stopped and restarted together, and its phase.

In gang mode all workers form one gang, so one failure stops and restarts all (torchrun);
otherwise each worker is its own gang (supervisord). Every change of a gang's phase goes
through :meth:`Gang.advance` and the one table :data:`TRANSITIONS`::

    RUNNING  --ended, stop-->  STOPPING
    STOPPING --down_restart--> BACKOFF --start--> RUNNING
                               BACKOFF --settle--> SETTLING --start--> RUNNING
                                                   SETTLING --refused--> FAILED
    STOPPING --down_done-->    DONE
    STOPPING --down_give_up--> FAILED
    STOPPING, BACKOFF, SETTLING --stop--> STOPPING

A gang is restarted only when every process of every worker is gone (``down``), the backoff
has passed and the ``settle`` hook (NVIDIA: VRAM released; several static nodes: every node
is down too) has returned; a hook that refuses the restart (it raised ``LaunchError``: the
other nodes never came) fails the gang. A stop moves a
waiting gang back to STOPPING, which is what cancels its pending backoff or settle callback:
those act only in the phase they were scheduled for.
"""

from __future__ import annotations

from enum import Enum
from typing import TYPE_CHECKING

from xpulaunch.supervisor.restart import RestartState

if TYPE_CHECKING:
    from xpulaunch.supervisor.restart import Decision
    from xpulaunch.supervisor.worker import Worker


class Phase(str, Enum):
    RUNNING = "running"
    STOPPING = "stopping"  # bringing every worker down (failure, restart or stop)
    BACKOFF = "backoff"  # down; waiting for the restart delay
    SETTLING = "settling"  # down; waiting for the settle hook before a restart
    DONE = "done"
    FAILED = "failed"  # the restart policy gave up


class GangEvent(str, Enum):
    ENDED = "ended"  # a worker failed, or every worker exited cleanly
    STOP = "stop"  # a stop was requested, or the job's start was aborted
    DOWN_RESTART = "down_restart"  # every process is gone; the decision: restart
    DOWN_DONE = "down_done"  # every process is gone; the decision: done
    DOWN_GIVE_UP = "down_give_up"  # every process is gone; the decision: give up
    SETTLE = "settle"  # the backoff passed; the settle hook runs
    START = "start"  # the backoff passed (and the gang settled): start it again
    REFUSED = "refused"  # the settle hook refused the restart


TRANSITIONS: dict[tuple[Phase, GangEvent], Phase] = {
    (Phase.RUNNING, GangEvent.ENDED): Phase.STOPPING,
    (Phase.RUNNING, GangEvent.STOP): Phase.STOPPING,
    (Phase.STOPPING, GangEvent.STOP): Phase.STOPPING,
    (Phase.BACKOFF, GangEvent.STOP): Phase.STOPPING,
    (Phase.SETTLING, GangEvent.STOP): Phase.STOPPING,
    (Phase.STOPPING, GangEvent.DOWN_RESTART): Phase.BACKOFF,
    (Phase.STOPPING, GangEvent.DOWN_DONE): Phase.DONE,
    (Phase.STOPPING, GangEvent.DOWN_GIVE_UP): Phase.FAILED,
    (Phase.BACKOFF, GangEvent.SETTLE): Phase.SETTLING,
    (Phase.BACKOFF, GangEvent.START): Phase.RUNNING,
    (Phase.SETTLING, GangEvent.START): Phase.RUNNING,
    (Phase.SETTLING, GangEvent.REFUSED): Phase.FAILED,
}

FINAL_PHASES = frozenset({Phase.DONE, Phase.FAILED})


class Gang:
    """Workers restarted together; a gang starts RUNNING (it is made to be started)."""

    def __init__(self, workers: list[Worker]) -> None:
        self.workers = workers
        self.restart = RestartState()
        self.attempt = 0
        self.phase = Phase.RUNNING
        self.decision: Decision | None = None
        self.first_failure: Worker | None = None
        # Failed from outside (another node's failure), with none of its workers failing:
        # why, and the exit status the job gets if it gives up on it.
        self.outside_failure: tuple[str, int] | None = None
        self.ended_at_s = 0.0

    def exit_status(self) -> int:
        """The status of a gang that failed for good: its first failed worker's, else the
        outside failure's, else 1."""
        failed = self.first_failure
        if failed is not None and failed.job_status is not None:
            return failed.job_status
        return self.outside_failure[1] if self.outside_failure is not None else 1

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(w.name for w in self.workers)

    def can(self, event: GangEvent) -> bool:
        return (self.phase, event) in TRANSITIONS

    def advance(self, event: GangEvent) -> None:
        """Take the transition for ``event``; one that the table lacks is a bug."""
        after = TRANSITIONS.get((self.phase, event))
        if after is None:
            raise RuntimeError(f"gang {self.names}: no transition from {self.phase} on {event}")
        self.phase = after

    @property
    def is_down(self) -> bool:
        """Stopping, and every process of every worker is gone."""
        return self.phase is Phase.STOPPING and all(w.down for w in self.workers)
