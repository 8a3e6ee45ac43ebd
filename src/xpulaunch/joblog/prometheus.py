"""The Prometheus text exposition format (version 0.0.4): writing it, and relabelling another
exporter's samples. Pure: no sockets, no clocks.

https://prometheus.io/docs/instrumenting/exposition_formats/ : ``# HELP`` and ``# TYPE`` once
per family, then ``name{label="value",...} number`` lines; label values escape ``\\``, ``"``
and newlines. Another exporter's text is read with ``prometheus_client``'s parser (imported
only when a scrape relabels one).
"""

from __future__ import annotations

import math
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
        (k, _utf8(v).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n"))
        for k, v in labels
    )
    return "{" + ",".join(f'{k}="{v}"' for k, v in escaped) + "}"


def _utf8(value: str) -> str:
    """``value`` as UTF-8 can carry it (a scrape is UTF-8): a lone surrogate, which is how
    Python holds a path's bytes that are not UTF-8 (a model file's name), becomes ``?``."""
    return value.encode("utf-8", "replace").decode()


def _number(value: float) -> str:
    number = float(value)
    if math.isnan(number):
        return "NaN"
    if math.isinf(number):
        return "+Inf" if number > 0 else "-Inf"
    return str(int(number)) if number.is_integer() else repr(number)


# The text format 0.0.4 knows these types; OpenMetrics-only ones are written as untyped.
_TEXT_TYPES = frozenset({"counter", "gauge", "histogram", "summary"})


# One family of another exporter, relabelled: declared name, type, help, samples (name,
# labels, value).
Relabelled = tuple[str, str, str, list[tuple[str, Labels, float]]]


def relabel(text: str, extra: Labels) -> list[Relabelled]:
    """Another exporter's families, each sample with ``extra`` labels added first. Parsed
    with ``prometheus_client``'s parser (which names counters ``..._total``, as the
    OpenMetrics convention does); a label a sample already has under one of our names keeps
    its value as ``exported_NAME`` (Prometheus's own rule for ``honor_labels: false``).
    Raises ``ValueError`` for text that is not the exposition format."""
    from prometheus_client.parser import text_string_to_metric_families

    ours = dict(extra)
    out: list[Relabelled] = []
    try:
        for family in text_string_to_metric_families(text):
            kind = family.type if family.type in _TEXT_TYPES else "untyped"
            declared = family.name + "_total" if kind == "counter" else family.name
            samples = [
                (
                    s.name,
                    (
                        *extra,
                        *((f"exported_{k}" if k in ours else k, v) for k, v in s.labels.items()),
                    ),
                    float(s.value),
                )
                for s in family.samples
            ]
            out.append((declared, kind, family.documentation, samples))
    except (IndexError, KeyError) as exc:  # the parser's own errors on odd lines
        raise ValueError(f"not the Prometheus text format: {exc!r}") from exc
    return out


def render_relabelled(sources: Iterable[list[Relabelled]]) -> str:
    """Relabelled families of several sources as one valid exposition: each family declared
    once (``# HELP``, ``# TYPE``), then the samples of every source."""
    merged: dict[str, tuple[str, str, list[tuple[str, Labels, float]]]] = {}
    for families in sources:
        for declared, kind, help_text, samples in families:
            merged.setdefault(declared, (kind, help_text, []))[2].extend(samples)
    lines: list[str] = []
    for declared, (kind, help_text, samples) in merged.items():
        escaped = help_text.replace("\\", "\\\\").replace("\n", "\\n")
        lines += [f"# HELP {declared} {escaped}", f"# TYPE {declared} {kind}"]
        lines += [f"{name}{_labels(labels)} {_number(value)}" for name, labels, value in samples]
    return "\n".join(lines) + "\n" if lines else ""
