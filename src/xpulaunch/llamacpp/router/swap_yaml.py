"""A llama-swap ``config.yaml``, read as it is: translated into the ``models.toml`` document
:func:`~xpulaunch.llamacpp.router.config.parse_config` checks, plus one warning line per key
the router does not take. Pure: the parsed YAML, the environment (for ``${env.VAR}``) and the
working folder come in.

The format is llama-swap's ``config.example.yaml``:

- ``models.<id>``: ``cmd`` (a string or a list; lines starting with ``#`` are comments),
  ``proxy``, ``ttl``, ``aliases``, ``env`` (``["NAME=value"]``), ``checkEndpoint`` (``none``:
  no check), ``unlisted``, ``concurrencyLimit`` (more at once get 429, as in llama-swap),
  ``macros``;
- ``macros`` (``${name}``, ``${env.VAR}``; ``${MODEL_ID}``; ``${PORT}`` is the server's port),
  ``groups`` (``swap``, ``exclusive``, ``persistent``, ``members``),
  ``hooks.on_startup.preload``, ``apiKeys``, ``healthCheckTimeout``, ``startPort``.

A ``cmd`` that runs llama-server becomes a llama-server model (its ``-m`` the model, the rest
its args; ``--port`` and ``--host`` are the router's): it gets the router's estimate of its
memory, and is packed beside other models, where llama-swap could only swap it. Any other
``cmd`` is an engine (:mod:`~xpulaunch.llamacpp.engine`). xpulaunch's own model keys
(``memory``, ``gpus``, ``replicas``, ``pinned``, ``topology``, ``max_queue``) may be added to a
model; llama-swap does not read them.
"""

from __future__ import annotations

import os
import re
import shlex
from collections.abc import Mapping, Sequence
from typing import Any

from xpulaunch.errors import UsageError, nearest, not_one_of

# xpulaunch's own keys, taken as models.toml takes them.
OWN_KEYS = ("memory", "gpus", "replicas", "pinned", "topology", "max_queue")
MODEL_KEYS = (
    "cmd",
    "proxy",
    "ttl",
    "aliases",
    "env",
    "checkEndpoint",
    "unlisted",
    "concurrencyLimit",
    "macros",
    *OWN_KEYS,
)
TOP_KEYS = (
    "models",
    "groups",
    "macros",
    "hooks",
    "apiKeys",
    "healthCheckTimeout",
    "startPort",
)
# llama-swap's keys the router does not take, and why (each is one warning line).
_LOGS = "the router logs to stderr; --events writes every event as JSON"
_LOADING = "streamed requests get SSE comment lines while a model loads"
TOP_NOT_TAKEN = {
    "logLevel": _LOGS,
    "logTimeFormat": _LOGS,
    "logToStdout": "each server's output goes to --log-dir",
    "metricsMaxInMemory": "GET /metrics is Prometheus text",
    "captureBuffer": "requests are not captured",
    "sendLoadingState": _LOADING,
    "includeAliasesInList": "GET /v1/models lists ids, with each model's aliases",
    "peers": "only models this router starts are served",
    "matrix": "use groups (swap = false) for models that run together",
}
MODEL_NOT_TAKEN = {
    "name": "GET /v1/models shows the id",
    "description": "GET /v1/models shows the id",
    "metadata": "GET /v1/models shows the id and aliases",
    "useModelName": "requests reach the server with the model the client named",
    "filters": "request bodies are passed on as they are",
    "cmdStop": "a server is stopped with SIGTERM, then SIGKILL after --grace",
    "sendLoadingState": _LOADING,
}
_MACRO = re.compile(r"\$\{([^}]*)\}")
_MACRO_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,63}$")
_RESERVED = ("PORT", "MODEL_ID", "PID")
_LOCAL_HOSTS = ("localhost", "127.0.0.1", "[::1]")
MIN_HEALTH_TIMEOUT_S = 15  # llama-swap raises a smaller healthCheckTimeout to this


def translate(
    document: object, environ: Mapping[str, str], *, source: str, cwd: str
) -> tuple[dict[str, Any], list[str]]:
    """The ``models.toml`` document a llama-swap config says, and the warning lines."""
    if not isinstance(document, Mapping):
        raise UsageError(f"{source}: expected llama-swap's config (a mapping with models:)")
    warnings = _top_warnings(document, source)
    macros = _macros(document.get("macros", {}), {}, environ, f"{source}: macros")
    models = document.get("models")
    if not isinstance(models, Mapping) or not models:
        raise UsageError(f"{source}: no models; add models: with one entry per model id")
    tables: dict[str, Any] = {}
    for model_id, entry in models.items():
        where = f"{source}: models.{model_id}"
        table, said = _model(str(model_id), entry, macros, environ, where, cwd=cwd)
        tables[str(model_id)] = table
        warnings += said
    for model_id in _preload(document.get("hooks", {}), tables, source):
        tables[model_id]["preload"] = True
    translated: dict[str, Any] = {"models": tables, "serve": _serve(document, environ, source)}
    if document.get("groups"):
        translated["groups"] = document["groups"]
    return translated, warnings


def _top_warnings(document: Mapping[str, Any], source: str) -> list[str]:
    warnings = []
    for key in document:
        if key in TOP_KEYS:
            continue
        warnings.append(_not_taken(str(key), f"{source}: {key}", TOP_KEYS, TOP_NOT_TAKEN))
    return warnings


def _not_taken(key: str, where: str, taken: Sequence[str], reasons: Mapping[str, str]) -> str:
    if key in reasons:
        return f"{where}: not taken ({reasons[key]})"
    close = nearest(key, [*taken, *reasons])
    hint = f"; did you mean {close!r}?" if close else ""
    return f"{where}: unknown key, ignored{hint}"


def _macros(
    table: object, outer: Mapping[str, str], environ: Mapping[str, str], where: str
) -> dict[str, str]:
    """``outer`` with the macros of ``table`` over it (a model's override the global ones)."""
    if not isinstance(table, Mapping):
        raise UsageError(f"{where}: expected name: value pairs")
    macros = dict(outer)
    for name, value in table.items():
        if not isinstance(name, str) or not _MACRO_NAME.match(name) or name in _RESERVED:
            raise UsageError(
                f"{where}: {name!r} cannot name a macro (letters, digits, _ and -, under 64; "
                f"not {', '.join(_RESERVED)})"
            )
        if not isinstance(value, str | int | float):
            raise UsageError(f"{where} {name}: expected text, a number or true/false")
        text = str(value).lower() if isinstance(value, bool) else str(value)  # YAML's spelling
        macros[name] = _env_macros(text.strip(), environ, f"{where} {name}")
    return macros


def _env_macros(text: str, environ: Mapping[str, str], where: str) -> str:
    def value(match: re.Match[str]) -> str:
        name = match.group(1)
        if not name.startswith("env."):
            return match.group(0)
        if name[4:] not in environ:
            raise UsageError(
                f"{where}: ${{{name}}}: the environment variable {name[4:]} is not set"
            )
        return environ[name[4:]]

    return _MACRO.sub(value, text)


def expand(
    text: str,
    macros: Mapping[str, str],
    model_id: str,
    environ: Mapping[str, str],
    where: str,
    *,
    strict: bool = True,
) -> str:
    """``text`` with its macros replaced (``${PORT}`` stays: the router gives it); with
    ``strict``, a ``${name}`` that no macro defines is an error."""
    text = _env_macros(text, environ, where)
    for _ in range(16):  # macros within macros, a few deep; a cycle would never end
        replaced = _MACRO.sub(lambda m: macros.get(m.group(1), m.group(0)), text)
        if replaced == text:
            break
        text = replaced
    else:
        raise UsageError(f"{where}: its macros refer to each other without end")
    text = text.replace("${MODEL_ID}", model_id)
    unknown = [n for n in _MACRO.findall(text) if n != "PORT"]
    if strict and unknown:
        close = nearest(unknown[0], macros)
        hint = f"; did you mean ${{{close}}}?" if close else ""
        raise UsageError(f"{where}: ${{{unknown[0]}}} is not a macro{hint}")
    return text


def _model(
    model_id: str,
    entry: object,
    outer: Mapping[str, str],
    environ: Mapping[str, str],
    where: str,
    *,
    cwd: str,
) -> tuple[dict[str, Any], list[str]]:
    if not isinstance(entry, Mapping):
        raise UsageError(f"{where}: expected the model's settings (cmd: ...)")
    warnings = [
        _not_taken(str(k), f"{where}.{k}", MODEL_KEYS, MODEL_NOT_TAKEN)
        for k in entry
        if k not in MODEL_KEYS
    ]
    macros = _macros(entry.get("macros", {}), outer, environ, f"{where}.macros")

    def text(key: str) -> str | None:
        value = entry.get(key)
        if value is None:
            return None
        if not isinstance(value, str):
            raise UsageError(f"{where}.{key}: expected text, got {value!r}")
        return expand(value, macros, model_id, environ, f"{where}.{key}")

    if "cmd" not in entry:
        raise UsageError(f"{where}: no cmd; llama-swap's models each have one")
    words = _cmd_words(entry["cmd"], macros, model_id, environ, f"{where}.cmd")
    proxy = text("proxy")
    if _is_llama_server(words[0]):
        table, said = _llama_server(words, proxy, where, cwd)
        warnings += said
        if "checkEndpoint" in entry:
            warnings.append(f"{where}.checkEndpoint: not taken (llama-server answers /health)")
    else:
        table = {"cmd": _with_port(words, proxy, where)}
        check = text("checkEndpoint")
        if check is not None:
            table["check"] = check
    table.update(_plain_keys(entry, macros, model_id, environ, where))
    return table, warnings


def _cmd_words(
    value: object,
    macros: Mapping[str, str],
    model_id: str,
    environ: Mapping[str, str],
    where: str,
) -> list[str]:
    """The command line's words: a string loses its comment lines and is split as a shell
    would; each word of a list is one argument."""
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        words = [expand(v, macros, model_id, environ, where) for v in value]
    elif isinstance(value, str):
        lines = [ln for ln in value.splitlines() if not ln.strip().startswith("#")]
        expanded = expand("\n".join(lines), macros, model_id, environ, where)
        try:
            words = shlex.split(expanded)
        except ValueError as exc:  # an unclosed quote
            raise UsageError(f"{where}: cannot be split into words ({exc})") from None
    else:
        raise UsageError(f"{where}: expected the server's command line")
    if not words:
        raise UsageError(f"{where}: empty; expected the server's command line")
    return words


def _is_llama_server(program: str) -> bool:
    return os.path.basename(program).startswith("llama-server")


def _llama_server(
    words: list[str], proxy: str | None, where: str, cwd: str
) -> tuple[dict[str, Any], list[str]]:
    """A llama-server command line as a model's ``binary``, ``model`` and ``args``."""
    args, model, warnings = [], None, []
    rest = iter(words[1:])
    for word in rest:
        name, equals, value = word.partition("=")
        if name in ("--port", "--host", "-m", "--model"):
            given = value if equals else next(rest, None)
            if given is None:
                raise UsageError(f"{where}.cmd: {name} has no value")
            if name in ("-m", "--model"):
                model = given
            continue
        args.append(word)
    if proxy is not None and "${PORT}" not in proxy:
        warnings.append(
            f"{where}.proxy: not taken (the router gives llama-server its --port and "
            "sends requests there)"
        )
    table: dict[str, Any] = {"binary": words[0], "args": args}
    if model is not None:
        table["model"] = os.path.join(cwd, os.path.expanduser(model))
    return table, warnings


def _with_port(words: list[str], proxy: str | None, where: str) -> list[str]:
    """An engine's words with ``${PORT}`` in place of the fixed port its ``proxy`` names."""
    if proxy is None:
        return words
    match = re.fullmatch(r"http://([^/:]+|\[[^\]]+\]):(\$\{PORT\}|\d+)/?", proxy)
    if match is None or match.group(1) not in _LOCAL_HOSTS:
        raise UsageError(
            f"{where}.proxy: {proxy}: expected http://127.0.0.1:PORT (the router starts the "
            "server here, and serves its /v1 paths)"
        )
    port = match.group(2)
    if port == "${PORT}":
        return words
    # The server was told to listen on that port: the router chooses a free one instead.
    # The port is a word of its own, follows "=" (--port=8999), or precedes ":" (docker's
    # -p 8999:8080).
    named = re.compile(rf"(^|=){port}(?=:|$)")
    moved = [named.sub(lambda m: m.group(1) + "${PORT}", w) for w in words]
    if moved == words:
        raise UsageError(
            f"{where}.proxy: port {port} is not in cmd; write ${{PORT}} where cmd names the "
            "port the server listens on"
        )
    return moved


def _plain_keys(
    entry: Mapping[str, Any],
    macros: Mapping[str, str],
    model_id: str,
    environ: Mapping[str, str],
    where: str,
) -> dict[str, Any]:
    """The keys that mean what models.toml's mean (checked there)."""
    table: dict[str, Any] = {k: entry[k] for k in OWN_KEYS if k in entry}
    for key in ("ttl", "aliases", "unlisted"):
        if key in entry:
            table[key] = entry[key]
    if "env" in entry:
        table["env"] = _env(entry["env"], macros, model_id, environ, f"{where}.env")
    limit = entry.get("concurrencyLimit", 0)
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 0:
        raise UsageError(f"{where}.concurrencyLimit: expected a whole number >= 0, got {limit!r}")
    if limit:
        table["max_concurrency"] = limit  # beyond it 429 at once, as llama-swap answers
    return table


def _env(
    value: object,
    macros: Mapping[str, str],
    model_id: str,
    environ: Mapping[str, str],
    where: str,
) -> dict[str, str]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise UsageError(f'{where}: expected a list of "NAME=value" strings')
    env = {}
    for item in value:
        name, equals, text = item.partition("=")
        if not equals or not name.strip():
            raise UsageError(f'{where}: {item!r}: expected "NAME=value"')
        env[name.strip()] = expand(text, macros, model_id, environ, f"{where} {name}", strict=False)
    return env


def _preload(hooks: object, tables: Mapping[str, Any], source: str) -> list[str]:
    where = f"{source}: hooks.on_startup.preload"
    if not isinstance(hooks, Mapping):
        raise UsageError(f"{source}: hooks: expected on_startup: with preload:")
    startup = hooks.get("on_startup", {}) or {}
    if not isinstance(startup, Mapping):
        raise UsageError(f"{source}: hooks.on_startup: expected preload:")
    names = startup.get("preload", []) or []
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise UsageError(f"{where}: expected a list of model ids")
    for name in names:
        if name not in tables:
            raise not_one_of(name, tables, "model", where)
    return names


def _serve(document: Mapping[str, Any], environ: Mapping[str, str], source: str) -> dict[str, Any]:
    serve: dict[str, Any] = {}
    keys = document.get("apiKeys", []) or []
    if not isinstance(keys, list) or not all(isinstance(k, str) for k in keys):
        raise UsageError(f"{source}: apiKeys: expected a list of keys")
    if keys:
        # The message names the entry, never a key.
        serve["api_keys"] = [
            _env_macros(k, environ, f"{source}: apiKeys[{i}]") for i, k in enumerate(keys)
        ]
    timeout = document.get("healthCheckTimeout")
    if timeout is not None:
        if isinstance(timeout, bool) or not isinstance(timeout, int | float) or timeout <= 0:
            raise UsageError(f"{source}: healthCheckTimeout: expected seconds, got {timeout!r}")
        serve["ready_timeout"] = max(timeout, MIN_HEALTH_TIMEOUT_S)
    if "startPort" in document:
        serve["start_port"] = document["startPort"]
    return serve
