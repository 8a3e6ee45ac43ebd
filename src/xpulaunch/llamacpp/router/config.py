"""``models.toml`` of ``xpulaunch llama serve``: one ``[models.ID]`` table per model, named by
the id clients send. Pure: :func:`parse_config` takes the parsed TOML document.

::

    [models.qwen-7b]
    model = "/models/qwen-7b-q4.gguf"
    gpus = "auto"          # what --gpus takes
    topology = "prefer"    # what --topology takes: how a model's several GPUs are chosen
    replicas = 1
    ttl = 600              # seconds idle before it is unloaded; 0: never
    pinned = false         # never evicted
    aliases = ["qwen"]
    args = ["-c", "8192"]  # llama-server's own options, as after `--`
    memory = "6GiB"        # its share of a GPU (default: its estimate plus --fit-target)

The keys of another engine (``cmd``), a model's ``env``, ``preload`` and concurrency, and the
``[serve]`` table are :mod:`~xpulaunch.llamacpp.router.options`'.

Every error names the file, the table and the key, and says what would be valid.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from xpulaunch.core.selection import parse_gpus
from xpulaunch.errors import UsageError, nearest, refuse_unknown_keys
from xpulaunch.llamacpp import args as llama_args
from xpulaunch.llamacpp.router.groups import Group, parse_groups
from xpulaunch.llamacpp.router.options import ServeConfig, engine_fields, parse_serve

# The keys of options.py: a model's own engine, its environment, preload and concurrency.
ENGINE_KEYS = ("cmd", "check", "memory", "env", "preload", "max_concurrency", "max_queue")

KEYS = (
    "model",
    "gpus",
    "topology",
    "replicas",
    "ttl",
    "pinned",
    "aliases",
    "unlisted",
    "args",
    "binary",
    *ENGINE_KEYS,
)
TOP_KEYS = ("models", "groups", "serve")
# The router chooses where each server listens and what it serves: these would break routing.
_RESERVED = {"model": "the model key", "host": "the router", "port": "the router"}
MAX_REPLICAS = 64
MAX_CONFIG_BYTES = 4 * 2**20  # a table per model: a few kilobytes


@dataclass(frozen=True, slots=True)
class ModelConfig:
    """One ``[models.ID]`` table. ``model`` None: the args fetch it (``-hf``)."""

    id: str
    model: str | None
    gpus: str = "auto"
    replicas: int = 1
    ttl_s: float = 0.0
    pinned: bool = False
    aliases: tuple[str, ...] = ()
    args: tuple[str, ...] = ()
    topology: str = "prefer"
    cmd: tuple[str, ...] = ()  # a model's own server (options.py); () for llama-server
    check: str | None = None
    # Its share of each GPU it is packed on beside other models (None: its estimate).
    memory_bytes: int | None = None
    env: Mapping[str, str] = field(default_factory=dict)
    preload: bool = False
    max_concurrency: int | None = None
    max_queue: int = 0
    binary: str | None = None  # its own llama-server (None: the router's --binary)
    unlisted: bool = False  # served, but not in GET /v1/models

    def as_dict(self) -> dict[str, object]:
        return {
            "id": self.id,
            "model": self.model,
            "gpus": self.gpus,
            "replicas": self.replicas,
            "ttl": self.ttl_s,
            "pinned": self.pinned,
            "aliases": list(self.aliases),
            "args": list(self.args),
            "topology": self.topology,
            "cmd": list(self.cmd),
            "check": self.check,
            "memory_bytes": self.memory_bytes,
            "env": dict(self.env),
            "preload": self.preload,
            "max_concurrency": self.max_concurrency,
            "max_queue": self.max_queue,
            "binary": self.binary,
            "unlisted": self.unlisted,
        }

    @classmethod
    def from_dict(cls, fields: Mapping[str, Any]) -> ModelConfig:
        """The inverse of :meth:`as_dict`."""
        given = dict(fields)
        ttl_s = given.pop("ttl")
        tuples: dict[str, Any] = {k: tuple(given.pop(k)) for k in ("aliases", "args", "cmd")}
        return cls(**given, **tuples, ttl_s=ttl_s)


@dataclass(frozen=True, slots=True)
class RouterConfig:
    models: tuple[ModelConfig, ...]
    source: str = "models.toml"
    names: Mapping[str, str] = field(default_factory=dict)  # id or alias -> id
    serve: ServeConfig = field(default_factory=ServeConfig)  # the [serve] table
    groups: tuple[Group, ...] = ()  # the [groups.ID] tables
    # What the file says that the router does not take (a llama-swap config's), a line each.
    warnings: tuple[str, ...] = ()

    def resolve(self, name: str) -> ModelConfig | None:
        """The model a client names by id or alias (None: no such model)."""
        found = self.names.get(name)
        return None if found is None else self.by_id(found)

    def by_id(self, model_id: str) -> ModelConfig:
        return next(m for m in self.models if m.id == model_id)

    @property
    def ids(self) -> tuple[str, ...]:
        return tuple(m.id for m in self.models)


def parse_config(
    document: Mapping[str, Any], *, source: str = "models.toml", base_dir: str | None = None
) -> RouterConfig:
    """Check a parsed ``models.toml``; relative model paths are relative to ``base_dir``
    (the file's folder)."""
    unknown = sorted(set(document) - set(TOP_KEYS))
    if unknown:
        close = nearest(unknown[0], TOP_KEYS)
        hint = f"did you mean {close!r}? " if close else ""
        raise UsageError(
            f"{source}: unknown top-level key {unknown[0]!r}; {hint}expected [models.ID], "
            "[groups.ID] and [serve] tables"
        )
    tables = document.get("models")
    if not isinstance(tables, Mapping) or not tables:
        raise UsageError(
            f"{source}: no [models.ID] table; add one per model, e.g. "
            '[models.qwen] with model = "/models/qwen.gguf"'
        )
    models = tuple(_model(str(name), table, source, base_dir) for name, table in tables.items())
    serve = parse_serve(document.get("serve", {}), source)
    groups = parse_groups(document.get("groups", {}), (m.id for m in models), source)
    return RouterConfig(models, source, _names(models, source), serve, groups)


def _model(name: str, table: object, source: str, base_dir: str | None) -> ModelConfig:
    where = f"{source}: [models.{name}]"
    if not isinstance(table, Mapping):
        raise UsageError(f"{where}: expected a table of {', '.join(KEYS)}")
    check_id(name, where)
    refuse_unknown_keys(table, KEYS, where)
    engine = engine_fields(table, where)
    args = _strings(table.get("args", []), f"{where} args")
    model = None if "cmd" in engine else _model_path(table.get("model"), args, where, base_dir)
    binary = _binary(table, where)
    return ModelConfig(
        id=name,
        model=model,
        gpus=_gpus(table.get("gpus", "auto"), where),
        replicas=_replicas(table.get("replicas", 1), where),
        ttl_s=_ttl(table.get("ttl", 0), where),
        pinned=_bool(table.get("pinned", False), f"{where} pinned"),
        aliases=_strings(table.get("aliases", []), f"{where} aliases"),
        unlisted=_bool(table.get("unlisted", False), f"{where} unlisted"),
        binary=binary,
        args=args,
        topology=_topology(table.get("topology", "prefer"), where),
        **engine,
    )


def _binary(table: Mapping[str, Any], where: str) -> str | None:
    value = table.get("binary")
    if value is None:
        return None
    if "cmd" in table:
        raise UsageError(f"{where} binary: goes with llama-server; a cmd engine names its program")
    if not isinstance(value, str) or not value.strip() or "\0" in value:
        raise UsageError(f"{where} binary: expected the path of a llama-server, got {value!r}")
    return os.path.expanduser(value)


def _topology(value: object, where: str) -> str:
    from xpulaunch.core.topology import TopologyMode

    words = [m.value for m in TopologyMode]
    if value not in words:
        raise UsageError(f"{where} topology: {value!r}; expected one of {', '.join(words)}")
    return str(value)


def check_id(name: str, where: str) -> None:
    """Refuse an id that cannot name a model and its log folder (one line, ``where`` first)."""
    if not name.strip() or any(c.isspace() or not c.isprintable() for c in name):
        raise UsageError(f"{where}: a model id must be non-empty printable text without spaces")
    # The id names its servers' log folder under --log-dir: "org/name" (Hugging Face's
    # spelling) nests in it, but "..", "/abs" or ".hidden" would leave it or hide in it.
    if any(not part or part.startswith(".") for part in name.split("/")):
        raise UsageError(
            f"{where}: a model id must not start or end with '/', hold '//', or have a part "
            "starting with '.' ('..' would lead out of --log-dir); e.g. org/model-7b"
        )


def _model_path(value: object, args: Sequence[str], where: str, base_dir: str | None) -> str | None:
    given = llama_args.user_options(args, {})
    for key, owner in _RESERVED.items():
        if key in given:
            flags = "/".join(llama_args.OPTIONS[key].names)
            raise UsageError(f"{where} args: {flags} is set by {owner}; remove it from args")
    if value is None:
        if llama_args.has_remote_model(args):
            return None
        raise UsageError(f'{where}: no model; add model = "/path/to/model.gguf"')
    if not isinstance(value, str) or not value.strip() or "\0" in value:
        raise UsageError(f"{where} model: expected the path of a .gguf file, got {value!r}")
    path = os.path.expanduser(value)
    return path if os.path.isabs(path) or base_dir is None else os.path.join(base_dir, path)


def _gpus(value: object, where: str) -> str:
    if isinstance(value, int) and not isinstance(value, bool):
        value = str(value)
    if not isinstance(value, str):
        raise UsageError(f'{where} gpus: expected text such as "auto", "1" or "0,2"')
    try:
        parse_gpus(value)
    except UsageError as exc:
        raise UsageError(f"{where} gpus {value!r}: {exc.detail}") from None
    return value


def _replicas(value: object, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_REPLICAS:
        raise UsageError(
            f"{where} replicas: expected a whole number from 1 to {MAX_REPLICAS}, got {value!r}"
        )
    return value


def _ttl(value: object, where: str) -> float:
    ok = isinstance(value, int | float) and not isinstance(value, bool)
    if not ok or not math.isfinite(float(value)) or float(value) < 0:  # type: ignore[arg-type]
        raise UsageError(f"{where} ttl: expected seconds >= 0 (0: never unloaded), got {value!r}")
    return float(value)  # type: ignore[arg-type]


def _bool(value: object, where: str) -> bool:
    if not isinstance(value, bool):
        raise UsageError(f"{where}: expected true or false, got {value!r}")
    return value


def _strings(value: object, where: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise UsageError(f"{where}: expected a list of strings, got {value!r}")
    if any("\0" in v for v in value):  # no argument of a command line can hold one
        raise UsageError(f"{where}: a string holds a NUL character: {value!r}")
    return tuple(value)


def _names(models: Sequence[ModelConfig], source: str) -> dict[str, str]:
    """Ids and aliases -> id; a name used twice is an error."""
    names: dict[str, str] = {}
    for model in models:
        for name in (model.id, *model.aliases):
            other = names.get(name)
            if other is not None and not (other == model.id and name == model.id):
                raise UsageError(
                    f"{source}: {name!r} names both [models.{other}] and [models.{model.id}]; "
                    "ids and aliases must be unique"
                )
            names[name] = model.id
    return names


YAML_SUFFIXES = (".yaml", ".yml")  # llama-swap's config.yaml


def read_config(path: str | os.PathLike[str]) -> RouterConfig:
    """Read and check a ``models.toml`` file, or a llama-swap ``config.yaml``
    (:mod:`~xpulaunch.llamacpp.router.swap_yaml`): a one-line :class:`UsageError` on any
    problem."""
    shown = os.fspath(path)
    try:
        text = _read_text(path, shown)
        if shown.endswith(YAML_SUFFIXES):
            return _from_yaml(text, shown)
        document = _parse_toml(text, shown)
    except RecursionError as exc:  # arrays nested thousands deep
        raise UsageError("nested too deeply", option="config", value=shown) from exc
    base = os.path.dirname(os.path.abspath(shown))
    return parse_config(document, source=shown, base_dir=base)


def _read_text(path: str | os.PathLike[str], shown: str) -> str:
    from xpulaunch.textfiles import read_regular_file

    try:
        # A regular file of a sane size: a FIFO blocked the open for ever, /dev/zero never ended.
        data = read_regular_file(path, MAX_CONFIG_BYTES)
        if len(data) > MAX_CONFIG_BYTES:
            raise UsageError(
                f"larger than {MAX_CONFIG_BYTES // 2**20} MiB", option="config", value=shown
            )
        return data.decode("utf-8")
    except OSError as exc:
        raise UsageError(f"cannot read it ({exc.strerror})", option="config", value=shown) from exc
    except UnicodeDecodeError as exc:
        raise UsageError(f"not UTF-8 text ({exc.reason})", option="config", value=shown) from exc


def _parse_toml(text: str, shown: str) -> dict[str, Any]:
    import sys

    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover - Python 3.10
        import tomli as tomllib
    try:
        document: dict[str, Any] = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise UsageError(f"not valid TOML: {exc}", option="config", value=shown) from exc
    return document


def _from_yaml(text: str, shown: str) -> RouterConfig:
    """A llama-swap config: its models, and a warning per key not taken. Relative paths in
    its commands are the working folder's, as for llama-swap."""
    from xpulaunch.llamacpp.router.swap_yaml import translate

    try:
        import yaml
    except ImportError:
        raise UsageError(
            "reading llama-swap's YAML needs PyYAML: pip install 'xpulaunch[serve]'",
            option="config",
            value=shown,
        ) from None
    try:
        document = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f"line {mark.line + 1}: " if mark is not None else ""
        problem = getattr(exc, "problem", None) or "not valid YAML"
        raise UsageError(f"{at}{problem}", option="config", value=shown) from None
    translated, warnings = translate(document, os.environ, source=shown, cwd=os.getcwd())
    config = parse_config(translated, source=shown, base_dir=os.getcwd())
    return replace(config, warnings=tuple(warnings))
