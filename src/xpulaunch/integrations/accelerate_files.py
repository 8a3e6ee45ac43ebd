"""Finding and reading the file ``accelerate config`` writes (YAML, or JSON for old files).

PyYAML is imported only here, and only when a YAML config is read: accelerate itself depends
on it, so whoever has accelerate configs has it too.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from xpulaunch.errors import UsageError
from xpulaunch.textfiles import read_regular_file

if TYPE_CHECKING:
    from collections.abc import Mapping


def default_config_path(env: Mapping[str, str]) -> Path:
    """accelerate's default location (commands/config/config_args.py): under ``HF_HOME``,
    else ``XDG_CACHE_HOME/huggingface``, else ``~/.cache/huggingface``; the YAML file unless
    only the old JSON one exists."""
    cache = env.get("XDG_CACHE_HOME") or os.path.join(env.get("HOME", "~"), ".cache")
    home = Path(os.path.expanduser(env.get("HF_HOME") or os.path.join(cache, "huggingface")))
    yaml_file = home / "accelerate" / "default_config.yaml"
    json_file = home / "accelerate" / "default_config.json"
    try:
        return json_file if json_file.is_file() and not yaml_file.is_file() else yaml_file
    except OSError as exc:  # a folder closed to us, a name too long...
        raise UsageError(
            f"--accelerate-config default: cannot look for {exc.filename} ({exc.strerror}); "
            "check HF_HOME, or give the file"
        ) from exc


def installed_release() -> tuple[int, int] | None:
    """The (major, minor) of the accelerate that this interpreter's workers import, read from
    its package metadata (accelerate itself is not imported: it imports torch); None when it
    is not installed or its version is not ``major.minor...``."""
    try:
        version = importlib.metadata.version("accelerate")
    except importlib.metadata.PackageNotFoundError:
        return None
    major, _, rest = version.partition(".")
    minor = rest.split(".")[0]
    if not (major.isdigit() and minor.isdigit()):
        return None
    return int(major), int(minor)


MAX_CONFIG_BYTES = 4 * 2**20  # accelerate writes a few hundred bytes


def read_config(path: Path) -> dict[str, Any]:
    """The file's mapping; a missing, unreadable or malformed file is a one-line UsageError,
    and so is what is not a regular file of a sane size (a FIFO would block, /dev/zero never
    ends)."""
    try:
        data_bytes = read_regular_file(path, MAX_CONFIG_BYTES)
        if len(data_bytes) > MAX_CONFIG_BYTES:
            raise UsageError(
                f"--accelerate-config {path}: larger than {MAX_CONFIG_BYTES // 2**20} MiB; "
                "give the file `accelerate config` wrote"
            )
        text = data_bytes.decode("utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        why = exc.strerror if isinstance(exc, OSError) else "not UTF-8 text"
        raise UsageError(
            f"--accelerate-config {path}: cannot read it ({why}); "
            "run `accelerate config` or give the file it wrote"
        ) from exc
    try:
        data = _parse_json(text, path) if path.suffix == ".json" else _parse_yaml(text, path)
    except RecursionError as exc:
        raise UsageError(f"--accelerate-config {path}: nested too deeply") from exc
    if not isinstance(data, dict):
        raise UsageError(f"--accelerate-config {path}: expected a mapping of keys to values")
    key = _key_with_nul(data)
    if key is not None:  # its value would reach a worker's environment, which cannot hold one
        raise UsageError(f"--accelerate-config {path}: {key}: the value holds a NUL character")
    return data


def _key_with_nul(table: Mapping[Any, Any], prefix: str = "") -> str | None:
    """The first key (``fsdp_config.fsdp_version``) whose text holds a NUL (YAML's ``"\\0"``)."""
    for key, value in table.items():
        values = value if isinstance(value, list) else [value]
        if any(isinstance(v, str) and "\0" in v for v in values):
            return f"{prefix}{key}"
        if isinstance(value, dict):
            found = _key_with_nul(value, f"{prefix}{key}.")
            if found is not None:
                return found
    return None


def _parse_json(text: str, path: Path) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise UsageError(f"--accelerate-config {path}: line {exc.lineno}: {exc.msg}") from exc


def _parse_yaml(text: str, path: Path) -> Any:
    try:
        import yaml
    except ImportError as exc:
        raise UsageError(
            f"--accelerate-config {path}: reading YAML needs PyYAML "
            "(pip install 'xpulaunch[accelerate]')"
        ) from exc
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}: " if mark is not None else ""
        problem = getattr(exc, "problem", None) or "not valid YAML"
        raise UsageError(f"--accelerate-config {path}: {where}{problem}") from exc
