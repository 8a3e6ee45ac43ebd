"""Click parameter types for xpulaunch's values: each checks and converts while click parses,
so a dry run and a real run accept exactly the same command lines, environment variables and
config-file values, and a bad one is refused in click's one line naming the option.

Numbers must be finite: ``nan`` and ``inf`` parse as floats, and ``nan`` compares false with
every bound, so ``FloatRange`` alone lets it through. Config files hand over TOML values, not
text: a boolean or a fraction never passes for a count (``max-restarts = 2.9`` is refused, not
taken as 2).
"""

from __future__ import annotations

import math
import re
from typing import TYPE_CHECKING, Any

import click

from xpulaunch.core.units import parse_size
from xpulaunch.errors import UsageError
from xpulaunch.launch.request import Backoff
from xpulaunch.nodes.settings import host_problem

_SHOWN_CHARS = 40

if TYPE_CHECKING:  # generic for type checkers only: older click cannot subscript it
    ParamType = click.ParamType[Any]
else:
    ParamType = click.ParamType


def _shown(value: object) -> str:
    text = str(value)
    return repr(text if len(text) <= _SHOWN_CHARS else text[:_SHOWN_CHARS] + "...")


def _number(value: object) -> float:
    """``value`` as a float; NaN (which every bound refuses) where it is none. Booleans are
    ints in Python, and TOML has them: never a number here."""
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        return math.nan
    try:
        return float(value)
    except ValueError:
        return math.nan


class Seconds(ParamType):
    """A finite number of seconds, at least ``minimum`` (exclusive with ``positive``)."""

    name = "seconds"

    def __init__(self, *, positive: bool = False, minimum: float = 0.0) -> None:
        self.positive, self.minimum = positive, minimum

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        seconds = _number(value)
        low_ok = seconds > self.minimum if self.positive else seconds >= self.minimum
        if not math.isfinite(seconds) or not low_ok:
            bound = f"> {self.minimum:g}" if self.positive else f">= {self.minimum:g}"
            self.fail(f"{_shown(value)} is not a number of seconds {bound}", param, ctx)
        return seconds


# ASCII digits only: str.isdigit() also takes "²", and a sign check by hand let "+-3" through,
# both then refused by int() with a traceback.
_WHOLE = re.compile(r"\s*[+-]?[0-9]+\s*")


class Integer(ParamType):
    """A whole number from ``low`` to ``high`` (inclusive; None: unbounded)."""

    name = "integer"

    def __init__(self, low: int | None = None, high: int | None = None) -> None:
        self.low, self.high = low, high

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        number: int | None = None
        if isinstance(value, int) and not isinstance(value, bool):
            number = value
        elif isinstance(value, str) and _WHOLE.fullmatch(value):
            number = int(value)
        if number is None:
            self.fail(f"{_shown(value)} is not a whole number", param, ctx)
        if (self.low is not None and number < self.low) or (
            self.high is not None and number > self.high
        ):
            bounds = f"{self.low} or more" if self.high is None else f"{self.low} to {self.high}"
            self.fail(f"{number} is not in the range {bounds}", param, ctx)
        return number


class Percent(ParamType):
    name = "percent"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        number = _number(value)
        if not 0 <= number <= 100:
            self.fail(f"{_shown(value)} is not a percentage from 0 to 100", param, ctx)
        return number


class Size(ParamType):
    """``8GiB``, ``512MiB``, ``8G``, ``8000000000`` -> bytes."""

    name = "size"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        try:
            return parse_size(str(value))
        except UsageError as exc:
            self.fail(exc.detail, param, ctx)


class Count(ParamType):
    """``N`` (at least 1) or ``auto`` (None: one per selected device)."""

    name = "count"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if value is None or (isinstance(value, str) and value.strip().lower() == "auto"):
            return None
        number = value if isinstance(value, int) and not isinstance(value, bool) else None
        if isinstance(value, str) and _WHOLE.fullmatch(value):
            number = int(value)
        if number is None or number < 1:
            self.fail(f"{_shown(value)}: expected a count of at least 1, or auto", param, ctx)
        return number


class BackoffType(ParamType):
    """``FIRST[:MAX[:FACTOR]]`` in seconds; ``0`` restarts at once."""

    name = "backoff"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, Backoff):
            return value
        text = str(value) if not isinstance(value, bool) else ""
        try:
            numbers = [float(p) for p in text.split(":")]
        except ValueError:
            numbers = []
        if not 1 <= len(numbers) <= 3 or any(not 0 <= n < math.inf for n in numbers):
            self.fail(
                f"{_shown(value)}: expected FIRST[:MAX[:FACTOR]], e.g. 1:30:2 or 0", param, ctx
            )
        first_s = numbers[0]
        cap_s = numbers[1] if len(numbers) > 1 else max(30.0, first_s)
        factor = numbers[2] if len(numbers) > 2 else 2.0
        if cap_s < first_s:
            self.fail(f"{_shown(value)}: the cap {cap_s:g} is below the first delay", param, ctx)
        if factor < 1:
            self.fail(f"{_shown(value)}: the factor {factor:g} must be at least 1", param, ctx)
        return Backoff(first_s, cap_s, factor)


class Names(ParamType):
    """A comma-separated list of worker names (``0,2``) -> a frozenset; empty -> None."""

    name = "list"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, frozenset):
            return value
        text = str(value)
        if not text.strip():
            return None
        names = [t.strip() for t in text.split(",")]
        if any(not n for n in names):
            self.fail(f"{_shown(value)}: expected a comma-separated list such as 0,2", param, ctx)
        return frozenset(names)


class Host(click.types.StringParamType):
    """A host name or address that a socket call can take (``--master-addr``, ``--host``).
    One it cannot (a part over 63 characters, bytes that are not UTF-8) made the socket
    module raise UnicodeError or TypeError, a traceback, when the name was looked up."""

    name = "host"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        host = super().convert(value, param, ctx)
        why = host_problem(host)
        if why is not None:
            self.fail(f"{_shown(host)} is not a host name or address ({why})", param, ctx)
        return host


SECONDS = Seconds()
POSITIVE_SECONDS = Seconds(positive=True)
PORT = Integer(1, 65535)
ANY_PORT = Integer(0, 65535)  # 0: a free one
HOST = Host()
