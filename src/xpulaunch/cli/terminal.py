"""Text for a terminal: control characters shown, not acted on."""

from __future__ import annotations

import os
import re
import shutil
import sys
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


# The end of a cut line: a reader sees it was cut, and a cut "job 1|2" never reads as job 1.
CUT = "…"
_WORD_END = re.compile(r"\w+$")


def output_width() -> int | None:
    """The columns a line of a table may take: ``COLUMNS`` when set, else the terminal's
    width; None (no cut) when stdout is not a terminal: a pipe or a file gets whole lines."""
    columns = os.environ.get("COLUMNS", "")
    if columns.isdigit() and int(columns) > 0:
        return int(columns)
    if not sys.stdout.isatty():
        return None
    return shutil.get_terminal_size().columns


def cut(text: str, width: int | None) -> str:
    """``text`` in at most ``width`` characters (None: all of it). A cut line ends with
    :data:`CUT`, and is cut before a word or number it would split: ``shared by job 1…``
    for jobs 11 and 12 would name the wrong job."""
    if width is None or len(text) <= width:
        return text
    kept = text[: max(width - 1, 0)]
    if kept[-1:].isalnum() and text[len(kept)].isalnum():  # in the middle of a word
        kept = _WORD_END.sub("", kept) or kept  # a word wider than the line: cut in it
    return kept.rstrip() + CUT


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
