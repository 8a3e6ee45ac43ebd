"""Click types for numbers that must be finite: a parse-time check, so that a dry run and a
real run accept exactly the same values (``nan`` and ``inf`` parse as floats, and ``nan``
compares false with every bound, so ``FloatRange`` alone lets it through)."""

from __future__ import annotations

import math
from typing import Any

import click


class Seconds(click.FloatRange):
    """A finite number of seconds, >= 0 (or > 0 with ``positive``); help shows the range."""

    def __init__(self, *, positive: bool = False) -> None:
        super().__init__(min=0, min_open=positive)

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        seconds = super().convert(value, param, ctx)
        if not math.isfinite(seconds):
            self.fail(f"{str(value)[:40]!r} is not a finite number of seconds", param, ctx)
        return seconds


SECONDS = Seconds()
POSITIVE_SECONDS = Seconds(positive=True)
