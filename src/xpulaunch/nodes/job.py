"""One node of a static multi-node job, wired into its supervisor: the first meeting and the
global ranks it gives, the meetings before restarts, this node's failures told to the
others and theirs turned into a failure of this node's workers (:mod:`xpulaunch.nodes.member`
says why)."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from xpulaunch.core.plan import layout_env, with_layout
from xpulaunch.errors import NODES_FAILED_STATUS
from xpulaunch.events import Exited, HangDetected, Stopping, Unhealthy
from xpulaunch.nodes.link import Meeting
from xpulaunch.nodes.member import open_link

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping, Sequence

    from xpulaunch.events import Event
    from xpulaunch.model import Plan
    from xpulaunch.supervisor.spec import WorkerSpec


class NodeJob:
    """``say``: a line on this node's console; ``fail(why, status)``: fail this node's
    running workers (the supervisor's :meth:`~xpulaunch.supervisor.supervisor.Supervisor.fail`),
    None where another node's failure is not this node's (workers restarted one by one)."""

    def __init__(
        self,
        meeting: Meeting,
        say: Callable[[str], None],
        fail: Callable[[str, int], None] | None,
    ) -> None:
        self.meeting = meeting
        self._say, self._fail = say, fail
        self.link = open_link(meeting, say, self._other_failed if fail is not None else None)

    def _other_failed(self, why: str) -> None:
        if self._fail is not None:
            self._say(f"{why}: stopping this node's workers too")
            self._fail(why, NODES_FAILED_STATUS)

    def ranked(self, specs: Sequence[WorkerSpec], plan: Plan) -> list[WorkerSpec]:
        """``specs`` whose rank variables follow the counts of the last meeting, at every
        start (a node that came back with another count changes the others' ranks)."""
        nproc = len(plan.workers)

        def prepare(spec: WorkerSpec, local_rank: int) -> Callable[[int], WorkerSpec]:
            def at_start(attempt: int) -> WorkerSpec:
                nodes = replace(plan.nodes, counts=self.link.counts)
                return replace(spec, env={**spec.env, **layout_env(nodes, nproc, local_rank)})

            return at_start

        return [
            replace(spec, prepare=prepare(spec, worker.local_rank))
            for spec, worker in zip(specs, plan.workers, strict=True)
        ]

    def meet(self, plan: Plan, parent_env: Mapping[str, str]) -> Plan:
        """The first meeting: ``plan`` with the global ranks it gave."""
        return with_layout(plan, self.link.meet(), parent_env)

    def settle(
        self, gpus: Callable[[Sequence[str]], None] | None
    ) -> Callable[[Sequence[str]], None]:
        """The supervisor's ``settle`` hook: the GPUs' memory released, then every node met
        again, its old workers gone. A meeting that fails raises
        :class:`~xpulaunch.errors.NodesError`, which fails the gang instead of restarting it."""

        def settle(names: Sequence[str]) -> None:
            if gpus is not None:
                gpus(names)
            self.link.meet()

        return settle

    def on_event(self, event: Event) -> None:
        """A supervisor event: this node's own failure (or stop) is told to the others."""
        why = own_failure(event)
        if why is not None:
            self.link.tell(why)

    def close(self, status: int) -> None:
        self.link.close(status)


def own_failure(event: Event) -> str | None:
    """What the other nodes should hear of ``event``: a worker of this node failed on its
    own (not stopped by us), or this node is being stopped; None for anything else."""
    if isinstance(event, Exited) and not event.expected and event.exit_code != 0:
        if event.signal:
            return f"worker {event.name} was killed by {event.signal}"
        return f"worker {event.name} exited with code {event.exit_code}"
    if isinstance(event, Unhealthy):
        return f"worker {event.name} was unhealthy: {event.reason}"
    if isinstance(event, HangDetected):
        return f"worker {event.name} was silent for {event.silent_s:.0f} s"
    if isinstance(event, Stopping) and not event.kill:
        if event.cause == "max_runtime":
            return "it ran for its --max-runtime"
        return f"stopped by {event.signal}"
    return None
