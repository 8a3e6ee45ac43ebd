"""The Prometheus text exposition format (version 0.0.4): writing it, and relabelling another
exporter's samples. Pure: no sockets, no clocks.

https://prometheus.io/docs/instrumenting/exposition_formats/ : ``# HELP`` and ``# TYPE`` once
per family, then ``name{label="value",...} number`` lines; label values escape ``\\``, ``"``
and newlines.
"""

from __future__ import annotations

from collections.abc import Iterable

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
Labels = tuple[tuple[str, str], ...]
Sample = tuple[Labels, float]
Family = tuple[str, str, str, list[Sample]]  # name, type, help, samples


def render(families: Iterable[Family]) -> str:
    """Prometheus text for ``families``; a family without samples is left out."""
    lines: list[str] = []
    for name, kind, help_text, samples in families:
        if not samples:
            continue
        lines += [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}"]
        lines += [f"{name}{_labels(labels)} {_number(value)}" for labels, value in samples]
    return "\n".join(lines) + "\n"


def _labels(labels: Labels) -> str:
    if not labels:
        return ""
    escaped = (
        (k, v.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")) for k, v in labels
    )
    return "{" + ",".join(f'{k}="{v}"' for k, v in escaped) + "}"


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else repr(float(value))


def relabel(text: str, extra: Labels) -> list[str]:
    """Another exporter's sample lines with ``extra`` labels added (comments dropped: the
    same family from several replicas must be declared once, and we do not know its type)."""
    out = []
    added = _labels(extra)[1:-1]
    for line in text.splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        head, sep, rest = line.partition("{")
        if sep:
            inner = rest.partition("}")
            out.append(f"{head}{{{added},{inner[0]}}}{inner[2]}" if inner[0] else
                       f"{head}{{{added}}}{inner[2]}")  # fmt: skip
        else:
            name, _, value = line.partition(" ")
            out.append(f"{name}{{{added}}} {value}")
    return out
