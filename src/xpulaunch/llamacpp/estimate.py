"""A model's memory need, measured by the build's ``llama-fit-params`` or read from its GGUF
header (see :mod:`.fit`). ``llama-fit-params`` initialises the GPU runtime, so it only runs in
a child process; the GGUF header is read with the ``gguf`` package when it is installed.

Both are asked once per model file, build and memory-relevant arguments.
"""

from __future__ import annotations

import functools
import os
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from xpulaunch.llamacpp import args as llama_args
from xpulaunch.llamacpp.binary import LIST_TIMEOUT_S, fit_params_binary
from xpulaunch.llamacpp.fit import (
    DEFAULT_UBATCH,
    Estimate,
    GgufFacts,
    estimate_context,
    estimate_from_fit,
    estimate_from_gguf,
    parse_fit_print,
)

# The options of the user's that change the memory a model takes, and that llama-fit-params
# (common arguments only) accepts: with a value, and flags.
_MEMORY_OPTIONS = frozenset(
    {"-c", "--ctx-size", "-b", "--batch-size", "-ub", "--ubatch-size", "-ctk", "--cache-type-k",
     "-ctv", "--cache-type-v", "-fa", "--flash-attn", "-np", "--parallel", "-ot",
     "--override-tensor", "-fitc", "--fit-ctx"}
)  # fmt: skip
_MEMORY_FLAGS = frozenset({"-kvu", "--kv-unified", "-nkvo", "--no-kv-offload", "--swa-full"})


def memory_args(args: Sequence[str]) -> tuple[str, ...]:
    """The user's arguments that matter to memory, in their order."""
    picked: list[str] = []
    for i, arg in enumerate(args):
        if arg in _MEMORY_FLAGS:
            picked.append(arg)
        elif arg in _MEMORY_OPTIONS and i + 1 < len(args):
            picked += [arg, args[i + 1]]
    return tuple(picked)


def estimate_model(
    binary: str | None,
    model: str,
    passthrough: Sequence[str],
    parent_env: Mapping[str, str],
    *,
    fit: bool,
    device: str | None,
) -> tuple[Estimate | None, tuple[str, ...]]:
    """What one replica of ``model`` needs, and notes. ``binary``: the server found here
    (None: not here); ``device``: the build's first device name (``CUDA0``; None on a CPU
    build), so that the estimate is for one device holding all of the model."""
    notes: list[str] = []
    facts, problem = _facts(model)
    if problem:
        notes.append(problem)
    given = functools.partial(llama_args.passthrough_value, passthrough)
    user_ctx = _int(given("ctx_size"))
    if user_ctx is None:
        user_ctx = _int(parent_env.get("LLAMA_ARG_CTX_SIZE"))
    fit_min = _int(given("fit_ctx"))
    train = facts.context_train if facts else None
    context, note = estimate_context(user_ctx, train, fit=fit, fit_min=fit_min)
    notes += [note] if note else []
    tool = fit_params_binary(binary) if binary else None
    if tool is not None:
        query = _FitQuery(
            tool, os.path.abspath(model), os.stat(model).st_mtime_ns, memory_args(passthrough),
            context, device, tuple(sorted(parent_env.items())),
        )  # fmt: skip
        measured, problem = _run_fit_params(query)
        if measured is not None:
            return measured, tuple(notes)
        notes.append(f"{problem}; estimating from the GGUF header instead")
    if facts is None:
        return None, tuple(notes)
    estimate = estimate_from_gguf(
        facts, context or facts.context_train or 4096,
        cache_type_k=given("cache_type_k") or "f16", cache_type_v=given("cache_type_v") or "f16",
        ubatch=_int(given("ubatch_size")) or DEFAULT_UBATCH,
    )  # fmt: skip
    return estimate, tuple(notes)


def _int(text: str | None) -> int | None:
    try:
        return int(text) if text is not None else None
    except ValueError:
        return None


def _facts(model: str) -> tuple[GgufFacts | None, str | None]:
    try:
        info = os.stat(model)
    except OSError as exc:
        return None, f"model {model}: cannot read it ({exc.strerror})"
    return _read_gguf(os.path.abspath(model), info.st_size, info.st_mtime_ns)


@functools.lru_cache(maxsize=64)
def _read_gguf(path: str, size: int, mtime_ns: int) -> tuple[GgufFacts | None, str | None]:
    try:
        import gguf
    except ImportError:
        return None, "the gguf package is not installed: the GGUF header cannot be read"
    try:
        reader = gguf.GGUFReader(path, "r")
        return _facts_of(reader), None
    except (ValueError, KeyError, IndexError, TypeError, OSError) as exc:
        return None, f"model {path}: cannot read its GGUF header ({exc})"


def _facts_of(reader: Any) -> GgufFacts:
    def value(key: str) -> object:
        field = reader.get_field(key)
        return None if field is None else field.contents()

    arch = value("general.architecture")

    def number(key: str) -> int | None:
        found = value(f"{arch}.{key}")
        if isinstance(found, list):  # per-layer values (some models vary the KV heads)
            found = max(found) if found else None
        return int(found) if isinstance(found, int | float) else None

    tokens = reader.get_field("tokenizer.ggml.tokens")
    return GgufFacts(
        tensor_bytes=sum(int(t.n_bytes) for t in reader.tensors),
        layers=number("block_count"), context_train=number("context_length"),
        embedding=number("embedding_length"), heads=number("attention.head_count"),
        kv_heads=number("attention.head_count_kv"), key_length=number("attention.key_length"),
        value_length=number("attention.value_length"),
        vocab=len(tokens.data) if tokens is not None else None,
    )  # fmt: skip


@dataclass(frozen=True, slots=True)
class _FitQuery:
    """One ``llama-fit-params`` question; also the key its answer is kept under."""

    tool: str
    model: str
    mtime_ns: int
    picked: tuple[str, ...]
    context: int | None
    device: str | None
    env: tuple[tuple[str, str], ...]

    @property
    def argv(self) -> list[str]:
        argv = [self.tool, "-m", self.model, *self.picked]
        if self.context and "-c" not in self.picked and "--ctx-size" not in self.picked:
            argv += ["-c", str(self.context)]
        return [*argv, "--fit-print", "on", *(["--device", self.device] if self.device else [])]


@functools.lru_cache(maxsize=64)
def _run_fit_params(query: _FitQuery) -> tuple[Estimate | None, str]:
    try:
        done = subprocess.run(
            query.argv, capture_output=True, text=True, errors="replace",
            timeout=LIST_TIMEOUT_S, stdin=subprocess.DEVNULL, env=dict(query.env), check=False,
        )  # fmt: skip
    except subprocess.TimeoutExpired:
        return None, f"llama-fit-params did not answer within {LIST_TIMEOUT_S:g} s"
    except OSError as exc:
        return None, f"llama-fit-params: cannot run it ({exc.strerror or exc})"
    if done.returncode != 0:
        lines = done.stderr.strip().splitlines() or ["no output"]
        why = next((line for line in reversed(lines) if "error" in line.lower()), lines[-1])
        return None, f"llama-fit-params failed with exit code {done.returncode}: {why.strip()}"
    try:
        rows = parse_fit_print(done.stdout)
    except ValueError as exc:
        return None, f"llama-fit-params: {exc}"
    return estimate_from_fit(rows, query.context), ""
