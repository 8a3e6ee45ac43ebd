"""Why a worker failed: the exception it died of, from torch's error file or its stderr.

torchrun hands each worker ``TORCHELASTIC_ERROR_FILE``; a script whose entry point is wrapped
in ``torch.distributed.elastic.multiprocessing.errors.record`` writes the exception there as
JSON (``ErrorHandler.record_exception`` in the installed torch)::

    {"message": {"message": "ValueError: bad value",
                 "extraInfo": {"py_callstack": "Traceback (most recent call last): ...",
                               "timestamp": "1700000000"}}}

``message`` may also be a plain string (a file written by hand, or an older torch). Without a
file, the last Python traceback in the worker's stderr is the next best thing. Pure: the
caller reads the file and keeps the tail.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass

FRAMES_KEPT = 3  # the innermost frames: where it failed, and what called it
# The @record wrapper's own frame says nothing about the user's failure.
_WRAPPER_FRAME = "torch/distributed/elastic/multiprocessing/errors/"
# "ValueError: msg", "torch.distributed.DistBackendError: msg", "KeyboardInterrupt"
_EXCEPTION_LINE = re.compile(
    r"^(?P<type>[A-Za-z_][\w.]*(?:Error|Exception|Interrupt|Exit))(?::\s?(?P<message>.*))?$"
)


@dataclass(frozen=True, slots=True)
class RootCause:
    """An exception a worker died of. ``source``: ``error_file`` or ``stderr``."""

    type: str
    message: str
    frames: tuple[str, ...]  # innermost last, each "File "x.py", line 3, in f: code"
    source: str

    def headline(self) -> str:
        return f"{self.type}: {self.message}" if self.message else self.type

    def as_dict(self) -> dict[str, object]:
        return {
            "type": self.type,
            "message": self.message,
            "frames": list(self.frames),
            "source": self.source,
        }


def from_error_file(text: str) -> RootCause | None:
    """The exception in a torch ``@record`` error file; None when it holds none."""
    try:
        data = json.loads(text)
    except ValueError:
        return None
    message = data.get("message") if isinstance(data, dict) else None
    callstack = ""
    if isinstance(message, dict):
        extra = message.get("extraInfo")
        callstack = extra.get("py_callstack", "") if isinstance(extra, dict) else ""
        message = message.get("message")
    if not isinstance(message, str) or not message.strip():
        return None
    kind, _, detail = message.partition(": ")
    lines = str(callstack).splitlines()
    return RootCause(kind.strip(), detail.strip(), _frames(lines), "error_file")


def from_stderr(lines: Sequence[str]) -> RootCause | None:
    """The last Python traceback in ``lines`` (a worker's stderr tail); None without one."""
    starts = [i for i, line in enumerate(lines) if line.startswith("Traceback (most recent")]
    if not starts:
        return None
    block = list(lines[starts[-1] :])
    for line in reversed(block):
        found = _EXCEPTION_LINE.match(line.strip())
        if found:
            message = found.group("message") or ""
            return RootCause(found.group("type"), message.strip(), _frames(block), "stderr")
    return None


def _frames(lines: Sequence[str]) -> tuple[str, ...]:
    """The innermost ``FRAMES_KEPT`` frames of a formatted traceback, one string each."""
    frames: list[str] = []
    for index, line in enumerate(lines):
        if line.startswith('  File "') and _WRAPPER_FRAME not in line:
            code = lines[index + 1].strip() if index + 1 < len(lines) else ""
            is_code = code and not code.startswith(("File ", "^", "~"))
            frames.append(line.strip() + (f": {code}" if is_code else ""))
    return tuple(frames[-FRAMES_KEPT:])
