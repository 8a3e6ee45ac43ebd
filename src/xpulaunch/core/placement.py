"""Which units each worker sees: job-wide visibility (default) or ``--isolate``.

Job-wide is the collective-safe default: oneCCL needs every device of a communicator visible in
each rank, and per-rank masks break NCCL/oneCCL setups (oneCCL #217,
torch-ccl #71, nccl-tests #300). ``--isolate`` is for independent workers
(sweeps, servers): each sees only its share, renumbered from 0.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from xpulaunch.errors import SelectionError, UsageError

if TYPE_CHECKING:
    from collections.abc import Sequence


# A bound far above any node (8 GPUs x tiles x a few workers each), far below what makes
# planning itself run out of memory (a plan of 10**8 workers).
MAX_WORKERS = 4096


def worker_count(nproc_per_node: int | None, units: int) -> int:
    """``None`` means ``auto``: one worker per unit (one on the CPU)."""
    if nproc_per_node is None:
        return max(units, 1)
    if not 1 <= nproc_per_node <= MAX_WORKERS:
        raise UsageError(
            f"must be from 1 to {MAX_WORKERS}, or auto",
            option="nproc_per_node",
            value=nproc_per_node,
        )
    return nproc_per_node


def place(units: int, workers: int, *, isolate: bool) -> tuple[tuple[int, ...], ...]:
    """Positions of the selected units each worker sees.

    >>> place(4, 2, isolate=True)
    ((0, 1), (2, 3))
    >>> place(2, 2, isolate=False)
    ((0, 1), (0, 1))
    """
    everything = tuple(range(units))
    if not isolate or units == 0:
        return tuple(everything for _ in range(workers))
    if workers > units:
        raise SelectionError(
            f"{workers} isolated workers need at least {workers} devices; {units} selected "
            f"(select {workers} devices or use fewer workers)",
            option="isolate",
            value=True,
        )
    return split_evenly(everything, workers)


def split_evenly(items: Sequence[int], parts: int) -> tuple[tuple[int, ...], ...]:
    """Consecutive shares; the first ``len % parts`` shares get one more."""
    size, extra = divmod(len(items), parts)
    shares: list[tuple[int, ...]] = []
    start = 0
    for i in range(parts):
        end = start + size + (1 if i < extra else 0)
        shares.append(tuple(items[start:end]))
        start = end
    return tuple(shares)
