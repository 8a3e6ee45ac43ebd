"""``echo``: what click.echo does for our plain-text output, without importing click."""

from __future__ import annotations

import sys


def echo(text: str, *, err: bool = False) -> None:
    """Write one line of text to stdout (or stderr) and flush it, as click.echo does.

    Our lines carry no ANSI styles, so click's stripping of them for non-terminals is moot.
    """
    stream = sys.stderr if err else sys.stdout
    stream.write(text + "\n")
    stream.flush()
