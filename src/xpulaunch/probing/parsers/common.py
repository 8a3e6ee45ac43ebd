"""Cell-level helpers shared by the nvidia-smi, xpu-smi and amd-smi parsers."""

from __future__ import annotations

import json
import math
import re

from xpulaunch.core.device_ids import normalize_bus_id

MIB = 1024 * 1024


class ParseError(ValueError):
    """Tool output that does not have the documented shape; the message says what was seen."""


_NUMBER = re.compile(r"^[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?")


def number(cell: object) -> float | None:
    """The leading number of a cell (``"143771 MiB"`` -> 143771.0); ``None`` for anything else.

    ``[N/A]``, ``[Not Supported]``, ``N/A``, empty cells and the like are unknown, never 0
    (nvidia-smi prints such sentinels for unsupported fields, e.g. ``[N/A]``).
    """
    if isinstance(cell, bool):
        return None
    if isinstance(cell, (int, float)):
        value = float(cell)
    elif isinstance(cell, str):
        match = _NUMBER.match(cell.strip())
        if match is None:
            return None
        value = float(match.group(0))
    else:
        return None
    return value if math.isfinite(value) else None


def integer(cell: object) -> int | None:
    value = number(cell)
    return None if value is None or value != int(value) else int(value)


def mib_to_bytes(cell: object) -> int | None:
    value = number(cell)
    return None if value is None or value < 0 else round(value * MIB)


def percent(cell: object) -> float | None:
    value = number(cell)
    return value if value is not None and 0 <= value <= 100 else None


def text(cell: object) -> str | None:
    """A string cell, with sentinels such as ``[N/A]`` mapped to ``None``."""
    if not isinstance(cell, str):
        return None
    value = cell.strip()
    if (
        not value
        or value.upper() in {"N/A", "[N/A]", "NA"}
        or (value.startswith("[") and value.endswith("]"))
    ):
        return None
    return value


def pci_address(cell: object) -> str | None:
    """A PCI address cell in our spelling (:func:`~xpulaunch.core.device_ids.normalize_bus_id`)."""
    return normalize_bus_id(cell) if isinstance(cell, str) else None


def split_csv_rows(
    text_out: str, fields: list[str] | None = None
) -> tuple[list[str], list[dict[str, str]]]:
    """Rows of ``--query-...`` CSV as dicts keyed by field name.

    With ``fields=None`` the first line is a header such as ``memory.total [MiB]`` (nvidia-smi)
    or ``memory.total (MiB)`` (xpu-smi 2.x) and the unit suffix is dropped. Cells are separated
    by ``", "``; the last field takes the rest of the line, so a free-text field (a GPU name) is
    safest queried last.
    """
    lines = [line for line in text_out.splitlines() if line.strip()]
    if fields is None:
        if not lines:
            return [], []
        fields = [re.sub(r"\s*[\[(].*$", "", h).strip() for h in lines[0].split(",")]
        lines = lines[1:]
    rows = []
    for line in lines:
        cells = [c.strip() for c in line.split(",", len(fields) - 1)]
        if len(cells) == len(fields):
            rows.append(dict(zip(fields, cells, strict=True)))
    return fields, rows


def load_json(output: str, what: str) -> object:
    try:
        return json.loads(output)
    except json.JSONDecodeError as exc:
        raise ParseError(f"{what}: not JSON ({exc.msg}): {clip(output)!r}") from exc


def clip(output: str, limit: int = 120) -> str:
    """Tool output flattened to one short line, for a problem message."""
    flat = " ".join(output.split())
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."
