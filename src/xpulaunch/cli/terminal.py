"""Text for a terminal: control characters shown, not acted on."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Sequence

# C0 controls but the newline, DEL, and C1 controls: an ESC in a device name (from a driver,
# an inventory file, another user's command line) would be a terminal escape sequence.
_CONTROL = re.compile(r"[\x00-\x09\x0b-\x1f\x7f-\x9f]")


def terminal_safe(text: str) -> str:
    """``text`` with control characters shown as ``\\x1b`` instead of acted on by the terminal
    (for tables and plans; JSON escapes them itself, worker output is passed on as written)."""
    return _CONTROL.sub(lambda m: f"\\x{ord(m[0]):02x}", text)


def aligned(rows: Sequence[Sequence[str]]) -> list[str]:
    """Rows of cells (the header first) as lines: every column but the last padded to its
    widest cell, two spaces apart; the last one runs free."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]) - 1)]
    return [
        "  ".join([*(cell.ljust(w) for cell, w in zip(row[:-1], widths, strict=True)), row[-1]])
        for row in rows
    ]
