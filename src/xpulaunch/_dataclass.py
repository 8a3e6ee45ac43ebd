"""``from xpulaunch._dataclass import dataclass, field, replace``: the package's dataclasses.

For type checkers this module *is* the stdlib (mypy's dataclass plugin keys on
``dataclasses.dataclass``, so constructor signatures and frozen assignments stay checked). At
run time the names come from :mod:`xpulaunch._dataclass_runtime`, a light implementation of the
subset the package uses, because creating ~30 stdlib dataclasses and importing dataclasses (and
with it inspect) cost ~25 ms of the 60 ms start-up budget (issue 4).

Supported: ``@dataclass`` and ``@dataclass(frozen=..., slots=..., eq=...)``; ``field(default=...,
default_factory=..., init=..., repr=..., hash=..., compare=...)``; ``__post_init__``,
``__match_args__``, inheritance from classes decorated here, ``ClassVar`` annotations (skipped).
Any other argument is a TypeError at decoration time. ``dataclasses.fields``, ``asdict``,
``replace`` and ``is_dataclass`` work on these classes (they import dataclasses on first use).
A frozen instance raises :class:`FrozenInstanceError`, an AttributeError but not the stdlib's
class: catch AttributeError to catch both.
"""

from __future__ import annotations

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (mypy knows the name)
if TYPE_CHECKING:
    # Explicit "as" re-exports: what mypy strict (no implicit re-export) reads as public.
    from dataclasses import FrozenInstanceError as FrozenInstanceError  # noqa: PLC0414
    from dataclasses import dataclass as dataclass  # noqa: PLC0414
    from dataclasses import field as field  # noqa: PLC0414
    from dataclasses import replace as replace  # noqa: PLC0414
else:
    from xpulaunch._dataclass_runtime import FrozenInstanceError, dataclass, field, replace

__all__ = ["FrozenInstanceError", "dataclass", "field", "replace"]
