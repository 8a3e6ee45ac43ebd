"""Config files merged into one set of option defaults, each value with where it came from.

Keys are the long options without their dashes (``gpus``, ``nproc-per-node``; underscores are
accepted too), at the top of a file or in a ``[profiles.NAME]`` table that ``-p NAME`` selects.
Layers come lowest first (user file, then project file); within one file, the profile wins
over the top level. The command line and the environment win over all of them: click does
that, since these values reach it as ``default_map`` (pure: no files are read here).
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from xpulaunch.errors import UsageError

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping, Sequence

PROFILES = "profiles"
SCALARS = (str, int, float, bool)


@dataclass(frozen=True)
class Layer:
    """One config file's table: ``source`` names it in messages (``xpulaunch.toml``)."""

    source: str
    table: Mapping[str, Any]


@dataclass(frozen=True)
class Setting:
    value: object
    source: str  # "xpulaunch.toml", "xpulaunch.toml [profiles.big]"


def merge(
    layers: Sequence[Layer], valid_keys: Iterable[str], profile: str | None = None
) -> dict[str, Setting]:
    """The effective value of every key the layers set, later layers winning."""
    valid = frozenset(valid_keys)
    merged: dict[str, Setting] = {}
    for layer in layers:
        top = {k: v for k, v in layer.table.items() if k != PROFILES}
        merged.update(_settings(top, layer.source, valid))
        # Every profile is checked, so that a mistake surfaces before the day it is used.
        for name, section in _profiles(layer).items():
            settings = _settings(section, f"{layer.source} [{PROFILES}.{name}]", valid)
            if name == profile:
                merged.update(settings)
    if profile is not None and not any(profile in _profiles(lay) for lay in layers):
        raise UsageError(_unknown_profile(profile, layers))
    return merged


def profile_names(layers: Sequence[Layer]) -> list[str]:
    return sorted({name for layer in layers for name in _profiles(layer)})


def _settings(table: Mapping[str, Any], source: str, valid: frozenset[str]) -> dict[str, Setting]:
    found: dict[str, Setting] = {}
    for raw_key, value in table.items():
        key = normalise_key(raw_key)
        if key not in valid:
            raise UsageError(f"{source}: unknown key {raw_key!r}{_closest(key, valid)}")
        if not isinstance(value, SCALARS):
            raise UsageError(
                f"{source}: {raw_key}: expected a string, number or true/false, "
                f"not {type(value).__name__}"
            )
        if key in found:
            raise UsageError(f"{source}: {raw_key}: set twice (as - and _ spellings)")
        found[key] = Setting(value, source)
    return found


def normalise_key(key: str) -> str:
    """``nproc_per_node`` and ``--nproc-per-node`` -> ``nproc-per-node``."""
    return key.lstrip("-").replace("_", "-").lower()


def _profiles(layer: Layer) -> Mapping[str, Any]:
    profiles = layer.table.get(PROFILES, {})
    if not isinstance(profiles, dict) or not all(isinstance(p, dict) for p in profiles.values()):
        raise UsageError(f"{layer.source}: {PROFILES}: expected tables such as [profiles.big]")
    return profiles


def _unknown_profile(profile: str, layers: Sequence[Layer]) -> str:
    names = profile_names(layers)
    if not layers:
        return f"--profile {profile}: no config file found (xpulaunch.toml, pyproject.toml)"
    known = ", ".join(names) if names else "none"
    return f"--profile {profile}: no such profile{_closest(profile, names)} (defined: {known})"


def _closest(word: str, choices: Iterable[str]) -> str:
    close = difflib.get_close_matches(word, sorted(choices), n=1)
    return f"; did you mean {close[0]!r}?" if close else ""


@dataclass(frozen=True)
class OptionInfo:
    """What :func:`explain` needs of an option: its key, its variables, its default."""

    key: str
    envvars: tuple[str, ...] = ()
    default: object = None


@dataclass(frozen=True)
class Explained:
    key: str
    value: object
    source: str  # "default", "env XPULAUNCH_GRACE", or a file as in Setting.source


def explain(
    options: Sequence[OptionInfo], settings: Mapping[str, Setting], env: Mapping[str, str]
) -> list[Explained]:
    """Each option's value without a command line, and why: the environment over the files
    over the default, as click resolves them."""
    rows = []
    for option in options:
        envvar = next((name for name in option.envvars if name in env), None)
        if envvar is not None:
            rows.append(Explained(option.key, env[envvar], f"env {envvar}"))
        elif option.key in settings:
            setting = settings[option.key]
            rows.append(Explained(option.key, setting.value, setting.source))
        else:
            rows.append(Explained(option.key, option.default, "default"))
    return rows
