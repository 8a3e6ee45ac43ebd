"""A model's memory need, measured by the build's ``llama-fit-params`` or read from its GGUF
header (see :mod:`.fit`). ``llama-fit-params`` initialises the GPU runtime, so it only runs in
a child process; the GGUF header is read here, with the tensor type sizes of the ``gguf``
package when it is installed.

Both are asked once per model file, build and memory-relevant arguments.
"""

from __future__ import annotations

import functools
import math
import os
import struct
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, BinaryIO

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
    {
        "-c",
        "--ctx-size",
        "-b",
        "--batch-size",
        "-ub",
        "--ubatch-size",
        "-ctk",
        "--cache-type-k",
        "-ctv",
        "--cache-type-v",
        "-fa",
        "--flash-attn",
        "-np",
        "--parallel",
        "-ot",
        "--override-tensor",
        "-fitc",
        "--fit-ctx",
    }
)
_MEMORY_FLAGS = frozenset({"-kvu", "--kv-unified", "-nkvo", "--no-kv-offload", "--swa-full"})

# GGUF value types (ggml/include/gguf.h) as struct formats; 8 is a string, 9 an array.
_SCALARS = {
    0: "B",
    1: "b",
    2: "H",
    3: "h",
    4: "I",
    5: "i",
    6: "f",
    7: "?",
    10: "Q",
    11: "q",
    12: "d",
}
_STRING, _ARRAY = 8, 9
_MAX_DIMS = 4  # GGML_MAX_DIMS
_MAX_KEY_BYTES = 65535  # the GGUF spec's limit on a key's length
# Values kept for the estimate: a per-layer array is a few hundred numbers, a name is short.
_MAX_KEPT_VALUES = 4096
_MAX_KEPT_STRING = 4096


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
            tool,
            os.path.abspath(model),
            os.stat(model).st_mtime_ns,
            memory_args(passthrough),
            context,
            device,
            tuple(sorted(parent_env.items())),
        )
        measured, problem = _run_fit_params(query)
        if measured is not None:
            return measured, tuple(notes)
        notes.append(f"{problem}; estimating from the GGUF header instead")
    if facts is None:
        return None, tuple(notes)
    estimate = estimate_from_gguf(
        facts,
        context or facts.context_train or 4096,
        cache_type_k=given("cache_type_k") or "f16",
        cache_type_v=given("cache_type_v") or "f16",
        ubatch=_int(given("ubatch_size")) or DEFAULT_UBATCH,
    )
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
        from gguf import GGML_QUANT_SIZES
    except ImportError:
        return None, "the gguf package is not installed: the GGUF header cannot be read"
    try:
        with open(path, "rb") as file:
            return _Header(file, size).facts(GGML_QUANT_SIZES), None
    except (ValueError, OSError) as exc:
        return None, f"model {path}: cannot read its GGUF header ({exc})"


class _Header:
    """The keys and tensor sizes of a GGUF header (ggml/src/gguf.cpp's layout), read the way
    llama.cpp reads it: every count checked against the bytes left, no array of arrays. The
    file may be anything a user names, so nothing is allocated or looped over for a count
    the file cannot hold (``gguf.GGUFReader`` makes a numpy array per array element and
    loops on past the end of the file, for ever with a count of 2**63)."""

    def __init__(self, file: BinaryIO, size: int) -> None:
        self._file, self._size, self._order = file, size, "<"

    def facts(self, type_sizes: Mapping[Any, tuple[int, int]]) -> GgufFacts:
        if self._read(4) != b"GGUF":
            raise ValueError("not a GGUF file: it does not start with 'GGUF'")
        (version,) = self._unpack("I")
        if version & 0xFFFF == 0:  # written on a machine of the other byte order
            self._order, version = ">", int.from_bytes(version.to_bytes(4, "little"), "big")
        if version not in (2, 3):
            raise ValueError(f"GGUF version {version}; expected 2 or 3")
        tensor_count, kv_count = self._unpack("QQ")
        self._check_count(kv_count, 13, "keys")  # a key: its length, 1 byte, type, 1 byte
        values = dict(self._key_value() for _ in range(kv_count))
        self._check_count(tensor_count, 24, "tensors")  # name length, dims, type, offset
        tensors = [self._tensor(type_sizes) for _ in range(tensor_count)]
        self._check_data(tensors, values.get("general.alignment", 32))
        tensor_bytes = sum(size for _, size in tensors)
        arch = values.get("general.architecture")

        def number(key: str) -> int | None:
            found = values.get(f"{arch}.{key}")
            if isinstance(found, list):  # per-layer values (some models vary the KV heads)
                found = max(found, default=None)
            if isinstance(found, bool) or not isinstance(found, int | float):
                return None
            return int(found) if 0 <= found < math.inf else None  # not NaN, not negative

        tokens = values.get("tokenizer.ggml.tokens")
        return GgufFacts(
            tensor_bytes=tensor_bytes,
            layers=number("block_count"),
            context_train=number("context_length"),
            embedding=number("embedding_length"),
            heads=number("attention.head_count"),
            kv_heads=number("attention.head_count_kv"),
            key_length=number("attention.key_length"),
            value_length=number("attention.value_length"),
            vocab=len(tokens) if isinstance(tokens, range) else None,
        )

    def _key_value(self) -> tuple[str, object]:
        key = self._string(_MAX_KEY_BYTES)
        (kind,) = self._unpack("I")
        if kind != _ARRAY:
            return key, self._value(kind, key)
        item, count = self._unpack("IQ")
        if item == _ARRAY:
            raise ValueError(f"key {key!r} is an array of arrays, which llama.cpp does not read")
        if item == _STRING:  # each length is read to find the next string; kept: the count
            self._check_count(count, 8, f"strings in {key!r}")
            for _ in range(count):
                self._string(None)
            return key, range(count)
        fmt = self._scalar_format(item, key)
        self._check_count(count, struct.calcsize(fmt), f"values in {key!r}")
        if count > _MAX_KEPT_VALUES:  # not a value the estimate reads: skipped
            self._file.seek(count * struct.calcsize(fmt), os.SEEK_CUR)
            return key, None
        return key, list(self._unpack(fmt * count))

    def _value(self, kind: int, key: str) -> object:
        if kind == _STRING:
            return self._string(_MAX_KEPT_STRING)
        (value,) = self._unpack(self._scalar_format(kind, key))
        return value

    def _tensor(self, type_sizes: Mapping[Any, tuple[int, int]]) -> tuple[int, int]:
        """Where a tensor's data starts (after the header) and its bytes."""
        self._string(None)
        (dims,) = self._unpack("I")
        if dims > _MAX_DIMS:
            raise ValueError(f"a tensor of {dims} dimensions; llama.cpp reads up to {_MAX_DIMS}")
        *shape, kind, offset = self._unpack("Q" * dims + "IQ")
        if kind not in type_sizes:
            raise ValueError(f"a tensor of unknown type {kind}")
        block, block_bytes = type_sizes[kind]
        return offset, math.prod(shape) * block_bytes // block

    def _check_data(self, tensors: list[tuple[int, int]], alignment: object) -> None:
        """Every tensor's data lies in the file (the data starts at the next multiple of
        ``general.alignment`` after the header)."""
        if not isinstance(alignment, int) or alignment < 1 or alignment & (alignment - 1):
            raise ValueError(f"general.alignment is {alignment!r}; expected a power of two")
        start = -(-self._file.tell() // alignment) * alignment
        end = start + max((offset + size for offset, size in tensors), default=0)
        if tensors and end > self._size:
            raise ValueError(
                f"the file ends early: its tensors need {end} bytes, it has {self._size}"
            )

    def _string(self, keep_bytes: int | None) -> str:
        """A string (skipped, as '', when ``keep_bytes`` is None or it is longer)."""
        (length,) = self._unpack("Q")
        self._check_count(length, 1, "bytes in a string")
        if keep_bytes is None or length > keep_bytes:
            self._file.seek(length, os.SEEK_CUR)
            return ""
        return self._read(length).decode("utf-8", errors="replace")

    def _scalar_format(self, kind: int, key: str) -> str:
        if kind not in _SCALARS:
            raise ValueError(f"key {key!r} has unknown GGUF type {kind}")
        return _SCALARS[kind]

    def _check_count(self, count: int, least_bytes: int, what: str) -> None:
        left = self._size - self._file.tell()
        if count * least_bytes > left:
            raise ValueError(f"{what}: {count}, more than the {left} bytes left in the file hold")

    def _unpack(self, fmt: str) -> tuple[Any, ...]:
        fmt = self._order + fmt
        return struct.unpack(fmt, self._read(struct.calcsize(fmt)))

    def _read(self, count: int) -> bytes:
        data = self._file.read(count)
        if len(data) < count:
            raise ValueError(f"the file ends early, at byte {self._file.tell()}")
        return data


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
            query.argv,
            capture_output=True,
            text=True,
            errors="replace",
            timeout=LIST_TIMEOUT_S,
            stdin=subprocess.DEVNULL,
            env=dict(query.env),
            check=False,
        )
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
