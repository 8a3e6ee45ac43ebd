"""How much memory a model needs, and llama.cpp's own fit. Pure.

Builds since ggml-org/llama.cpp#16653 have ``--fit on`` by default with ``-ngl auto``: the
server measures the free memory of its devices when it starts and sets the layers it
offloads, the tensor split and, when those are not given, the context size, keeping
``--fit-target`` MiB free on each device (default 1024). xpulaunch then pins the devices and
leaves the sizing to llama.cpp; for builds without ``--fit`` it keeps ``-ngl 999`` and a
``--tensor-split`` by free memory.

To choose devices before a server starts (``--gpus auto``: the fewest free devices that hold
the model) xpulaunch needs an estimate, from the same build's ``llama-fit-params
--fit-print on`` when it is there (one line per device, ``NAME model context compute`` in
MiB, then ``Host ...``; tools/fit-params/fit-params.cpp), else from the GGUF header: the
tensors' bytes, the KV cache of the context and a compute buffer.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from xpulaunch.core.units import format_bytes

MIB = 1024 * 1024
# llama.cpp's defaults (common/common.h): --fit-target 1024 MiB per device, --fit-ctx 4096,
# -ub 512.
FIT_TARGET_MIB = 1024
FIT_MIN_CONTEXT = 4096
DEFAULT_UBATCH = 512
# Bytes per KV cache element for each -ctk/-ctv type: ggml's block sizes (32 values a block).
KV_TYPE_BYTES = {
    "f32": 4.0,
    "f16": 2.0,
    "bf16": 2.0,
    "q8_0": 34 / 32,
    "q4_0": 18 / 32,
    "q4_1": 20 / 32,
    "iq4_nl": 18 / 32,
    "q5_0": 22 / 32,
    "q5_1": 24 / 32,
}
_FIT_ROW = re.compile(r"^(?P<name>\S+) (?P<model>\d+) (?P<context>\d+) (?P<compute>\d+)\s*$")
_HELP_OPTION = re.compile(r"^\s*(?:-\w+,\s*)?(?P<long>--[\w-]+)")


@dataclass(frozen=True, slots=True)
class BuildFeatures:
    """What ``llama-server --help`` says the build can do; None: it could not be asked."""

    fit: bool
    fit_target: bool

    @staticmethod
    def from_help(text: str) -> BuildFeatures:
        """Options are read from the start of their help lines (``-fit,  --fit [on|off]``)."""
        names = {m["long"] for line in text.splitlines() if (m := _HELP_OPTION.match(line))}
        return BuildFeatures(fit="--fit" in names, fit_target="--fit-target" in names)


@dataclass(frozen=True, slots=True)
class Estimate:
    """What one replica needs on its devices, for ``context`` tokens: the weights it offloads,
    its KV cache, and a compute buffer that each device it spans has once."""

    weights_bytes: int
    kv_bytes: int
    compute_bytes: int
    context: int | None
    source: str

    def on_devices(self, count: int) -> int:
        return self.weights_bytes + self.kv_bytes + self.compute_bytes * max(count, 1)

    def describe(self) -> str:
        ctx = f" for -c {self.context}" if self.context else ""
        size = self._size
        return (
            f"model needs about {size(self.on_devices(1))} (weights {size(self.weights_bytes)}"
            f" + KV cache {size(self.kv_bytes)}{ctx} + compute {size(self.compute_bytes)}; "
            f"{self.source})"
        )

    def _size(self, value: int) -> str:
        # llama-fit-params counts whole MiB, rounded down.
        return (
            "< 1 MiB" if value == 0 and self.source == "llama-fit-params" else format_bytes(value)
        )


# -- llama-fit-params ------------------------------------------------------------------
def parse_fit_print(text: str) -> dict[str, tuple[int, int, int]]:
    """``--fit-print on`` output: device (or ``Host``) -> (model, context, compute) bytes.
    Raises ``ValueError`` when there is no ``Host`` line (another tool, an older build)."""
    rows: dict[str, tuple[int, int, int]] = {}
    for line in text.splitlines():
        match = _FIT_ROW.match(line.strip())
        if match is not None:
            rows[match["name"]] = (
                int(match["model"]) * MIB,
                int(match["context"]) * MIB,
                int(match["compute"]) * MIB,
            )
    if "Host" not in rows:
        raise ValueError("no 'Host' line in the output of llama-fit-params --fit-print on")
    return rows


def estimate_from_fit(rows: Mapping[str, tuple[int, int, int]], context: int | None) -> Estimate:
    """The devices' rows when the build has devices (what they must hold); on a CPU build
    everything is on the host."""
    devices = [row for name, row in rows.items() if name != "Host"] or [rows["Host"]]
    weights, kv, compute = (sum(row[i] for row in devices) for i in range(3))
    return Estimate(weights, kv, compute, context, "llama-fit-params")


# -- the GGUF header -------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class GgufFacts:
    """What a GGUF header tells about memory (``None``: the key is missing)."""

    tensor_bytes: int
    layers: int | None
    context_train: int | None
    embedding: int | None
    heads: int | None
    kv_heads: int | None
    key_length: int | None
    value_length: int | None
    vocab: int | None


def estimate_from_gguf(
    facts: GgufFacts,
    context: int,
    *,
    cache_type_k: str = "f16",
    cache_type_v: str = "f16",
    ubatch: int = DEFAULT_UBATCH,
) -> Estimate:
    """Weights: every tensor. KV cache: per layer and token, K and V of every KV head. Compute:
    the attention mask (f16, ubatch x context, with flash attention as llama.cpp picks it by
    default) plus the logits and a few activations (f32, ubatch x (vocab + 4 x embedding)),
    which is how ``llama-fit-params`` counts a small model's buffer. llama.cpp caps the
    batch (and so the ubatch) at the context (src/llama-context.cpp)."""
    ubatch = min(ubatch, context) if context > 0 else ubatch
    heads = facts.heads or 1
    embedding = facts.embedding or 0
    head_dim = embedding // heads if embedding else 0
    kv_heads = facts.kv_heads or heads
    k_len = facts.key_length or head_dim
    v_len = facts.value_length or head_dim
    k_bytes = k_len * KV_TYPE_BYTES.get(cache_type_k, 2.0)
    v_bytes = v_len * KV_TYPE_BYTES.get(cache_type_v, 2.0)
    per_token = (facts.layers or 0) * kv_heads * (k_bytes + v_bytes)
    compute = ubatch * context * 2 + ubatch * ((facts.vocab or 0) + 4 * embedding) * 4
    return Estimate(facts.tensor_bytes, int(per_token * context), compute, context, "GGUF header")


def estimate_context(
    user_context: int | None, context_train: int | None, *, fit: bool, fit_min: int | None
) -> tuple[int | None, str | None]:
    """The context the estimate counts, and a note when it is not the user's ``-c``.

    Without ``-c`` (or with ``-c 0``) llama.cpp uses the model's training context; with
    ``--fit`` it shrinks that down to ``--fit-ctx`` when memory is short, so the smallest
    context llama.cpp would accept is what the model *needs*."""
    if user_context:
        return user_context, None
    if fit:
        floor = fit_min or FIT_MIN_CONTEXT
        context = min(context_train, floor) if context_train else floor
        return context, (
            f"no -c: counting {context} tokens of context, the least that llama.cpp's --fit "
            "keeps (it takes more when memory allows)"
        )
    return context_train, None


def fit_target_bytes(text: str | None) -> int:
    """The margin of ``--fit-target MiB0,MiB1,...`` (the largest; a single value is
    broadcast); llama.cpp's default when not given or not a number."""
    parts = [v.strip() for v in (text or "").split(",")]
    values = [int(v) for v in parts if v.isascii() and v.isdigit()]
    return (max(values) if values else FIT_TARGET_MIB) * MIB


# -- holding a model ---------------------------------------------------------------------
def holds(free_bytes: Sequence[int | None], estimate: Estimate, margin_bytes: int) -> bool | None:
    """Whether devices with these free bytes (None: unknown) hold one replica, keeping
    ``margin_bytes`` free on each; None when a device's memory is unknown."""
    if any(free is None for free in free_bytes):
        return None
    room = sum(max(0, (free or 0) - margin_bytes) for free in free_bytes)
    return room >= estimate.on_devices(len(free_bytes))
