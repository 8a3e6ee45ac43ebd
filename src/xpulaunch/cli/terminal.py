"""Text for a terminal: control characters shown, not acted on."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Sequence

# C0 controls but the newline, DEL, and C1 controls: an ESC in a device name (from a driver,
# an inventory file, another user's command line) would be a terminal escape sequence.
_CONTROL = re.compile(r"[\x00-\x09\x0b-\x1f\x7f-\x9f]")
# The same and the newline, for what must stay on its row: a cell of a table, a line of top.
# Anyone may put a newline in an argument of their command line (``python -c "a\nb"``), and
# in a table of other users' commands its second line would read as a row of its own.
_CONTROL_OR_NEWLINE = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def terminal_safe(text: str) -> str:
    """``text`` with control characters shown as ``\\x1b`` instead of acted on by the terminal
    (for tables and plans; JSON escapes them itself, worker output is passed on as written)."""
    return _CONTROL.sub(_shown, text)


def one_line(text: str) -> str:
    """:func:`terminal_safe` for text that must stay on one row: a newline is shown too."""
    return _CONTROL_OR_NEWLINE.sub(_shown, text)


def _shown(match: re.Match[str]) -> str:
    return f"\\x{ord(match[0]):02x}"


def aligned(rows: Sequence[Sequence[str]]) -> list[str]:
    """Rows of cells (the header first) as lines: every column but the last padded to its
    widest cell, two spaces apart; the last one runs free. Cells are :func:`one_line`: a
    row stays one line, and its columns stay aligned with the escapes shown."""
    rows = [[one_line(cell) for cell in row] for row in rows]
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]) - 1)]
    return [
        "  ".join([*(cell.ljust(w) for cell, w in zip(row[:-1], widths, strict=True)), row[-1]])
        for row in rows
    ]
