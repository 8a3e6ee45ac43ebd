"""The keys of ``models.toml`` beyond llama-server's (a model's own engine, its environment,
preload and concurrency) and the router-wide ``[serve]`` table. Pure, as
:mod:`~xpulaunch.llamacpp.router.config` is.

::

    [serve]
    api_keys = ["sk-..."]            # Bearer keys (also --api-key, $XPULAUNCH_API_KEY)
    cors = ["https://app.example"]   # origins a browser may call from ("*": any)

    [models.qwen-vllm]
    cmd = ["vllm", "serve", "Qwen/Qwen3-8B", "--port", "${PORT}"]
    memory = "20GiB"                 # its share of a GPU (else whole devices)
    check = "/health"                # ready once this answers 200
    env = { VLLM_LOGGING_LEVEL = "WARNING" }
    preload = true                   # loaded when the router starts
    max_concurrency = 4              # at most 4 requests at once...
    max_queue = 16                   # ...16 more wait; beyond, 429 with Retry-After

API keys are secrets: no message of this module shows one.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from xpulaunch.core.units import parse_size
from xpulaunch.errors import UsageError, refuse_unknown_keys
from xpulaunch.llamacpp.engine import check_path, split_cmd

SERVE_KEYS = ("api_keys", "cors", "yield_to_jobs", "ready_timeout", "start_port")
MAX_CONCURRENCY = 4096
API_KEY_VAR = "XPULAUNCH_API_KEY"


@dataclass(frozen=True, slots=True)
class ServeConfig:
    """The ``[serve]`` table: what every request of the router is checked against."""

    api_keys: tuple[str, ...] = ()
    cors: tuple[str, ...] = ()
    # Unload idle models from the GPUs a waiting launch wants (False: never; the router's
    # --no-yield-to-jobs says the same).
    yield_to_jobs: bool = True
    # How long a model may take to become ready (None: --ready-timeout's).
    ready_timeout_s: float | None = None
    # The first port tried for a server (None: any free port), as llama-swap's startPort.
    start_port: int | None = None

    def __repr__(self) -> str:  # never a key, even in a traceback's locals
        return f"ServeConfig(api_keys=<{len(self.api_keys)} hidden>, cors={self.cors!r})"

    def with_keys(self, keys: tuple[str, ...]) -> ServeConfig:
        return replace(self, api_keys=tuple(dict.fromkeys((*self.api_keys, *keys))))


def parse_serve(table: object, source: str) -> ServeConfig:
    where = f"{source}: [serve]"
    if not isinstance(table, Mapping):
        raise UsageError(f"{where}: expected a table of {', '.join(SERVE_KEYS)}")
    refuse_unknown_keys(table, SERVE_KEYS, where)
    keys = _list(table.get("api_keys", []), f"{where} api_keys")
    origins = _list(table.get("cors", []), f"{where} cors")
    yielding = table.get("yield_to_jobs", True)
    if not isinstance(yielding, bool):
        raise UsageError(f"{where} yield_to_jobs: expected true or false, got {yielding!r}")
    return ServeConfig(
        tuple(check_key(k, f"{where} api_keys") for k in keys),
        tuple(_origin(o, f"{where} cors") for o in origins),
        yielding,
        _seconds(table.get("ready_timeout"), f"{where} ready_timeout"),
        _port(table.get("start_port"), f"{where} start_port"),
    )


def _seconds(value: object, where: str) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value < 10**7:
        raise UsageError(f"{where}: expected seconds above 0, got {value!r}")
    return float(value)


def _port(value: object, where: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 65535:
        raise UsageError(f"{where}: expected a port from 1 to 65535, got {value!r}")
    return value


def check_key(value: object, where: str) -> str:
    """An API key: printable text without spaces (the message never shows it)."""
    if not isinstance(value, str) or not value or any(c.isspace() for c in value):
        raise UsageError(f"{where}: a key must be non-empty printable text without spaces")
    if not value.isprintable():
        raise UsageError(f"{where}: a key must be non-empty printable text without spaces")
    return value


def _list(value: object, where: str) -> list[Any]:
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list):
        raise UsageError(f"{where}: expected a list of strings")
    return value


def _origin(value: object, where: str) -> str:
    plain = isinstance(value, str) and value.isprintable() and " " not in value
    if plain and isinstance(value, str) and (value == "*" or "://" in value):
        return value
    raise UsageError(f'{where}: expected origins such as "https://app.example" or "*"')


def engine_fields(table: Mapping[str, Any], where: str) -> dict[str, Any]:
    """The new keys of one ``[models.ID]`` table, as :class:`ModelConfig` fields."""
    fields: dict[str, Any] = {}
    if "cmd" in table:
        fields["cmd"] = split_cmd(table["cmd"], f"{where} cmd")
        for key in ("model", "args"):
            if key in table:
                raise UsageError(
                    f"{where} {key}: goes with llama-server; a cmd engine takes its own "
                    "command line (${MODEL} in it is the model's id)"
                )
    elif "check" in table:
        raise UsageError(f"{where} check: goes with cmd (llama-server answers /health)")
    if "check" in table:
        fields["check"] = check_path(table["check"], f"{where} check")
    if "memory" in table:
        fields["memory_bytes"] = _memory(table["memory"], f"{where} memory")
    if "env" in table:
        fields["env"] = _env(table["env"], f"{where} env")
    if "preload" in table:
        if not isinstance(table["preload"], bool):
            raise UsageError(f"{where} preload: expected true or false, got {table['preload']!r}")
        fields["preload"] = table["preload"]
    fields.update(_concurrency(table, where))
    return fields


def _memory(value: object, where: str) -> int:
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value
    if not isinstance(value, str):
        raise UsageError(f'{where}: expected a size such as "6GiB", got {value!r}')
    try:
        size = parse_size(value)
    except UsageError as exc:
        raise UsageError(f"{where}: {exc.detail}") from None
    if size < 1:
        raise UsageError(f'{where}: expected a size above 0, such as "6GiB"')
    return size


def _env(value: object, where: str) -> dict[str, str]:
    if not isinstance(value, Mapping):
        raise UsageError(f'{where}: expected a table such as {{ GGML_CUDA_DISABLE_GRAPHS = "1" }}')
    env: dict[str, str] = {}
    for name, text in value.items():
        if not name or "=" in name or "\0" in name:
            raise UsageError(f"{where}: {name!r} cannot name an environment variable")
        if isinstance(text, bool) or not isinstance(text, str | int | float):
            raise UsageError(f"{where} {name}: expected text or a number, got {text!r}")
        if "\0" in str(text):
            raise UsageError(f"{where} {name}: the value holds a NUL character")
        env[str(name)] = str(text)
    return env


def _concurrency(table: Mapping[str, Any], where: str) -> dict[str, Any]:
    fields: dict[str, Any] = {}
    for key, low in (("max_concurrency", 1), ("max_queue", 0)):
        if key not in table:
            continue
        value = table[key]
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= 10**6:
            raise UsageError(f"{where} {key}: expected a whole number >= {low}, got {value!r}")
        fields[key] = value
    if "max_queue" in fields and "max_concurrency" not in fields:
        raise UsageError(f"{where} max_queue: goes with max_concurrency (the requests at once)")
    return fields
