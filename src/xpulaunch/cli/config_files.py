"""Where config files are, how they are read, and how their values reach click.

The project file is the nearest ``xpulaunch.toml``, or ``pyproject.toml`` with a
``[tool.xpulaunch]`` table, in the working directory or a parent (the nearest directory that
has either wins; ``xpulaunch.toml`` first, as ruff does with ``ruff.toml``). The user file is
``$XDG_CONFIG_HOME/xpulaunch/config.toml`` (``~/.config/...``). Their merged values become
click's ``default_map``, which click ranks below the command line and the environment.
"""

from __future__ import annotations

import os
import stat
import sys
from typing import TYPE_CHECKING, Any

import click

from xpulaunch.cli.commands import load_command
from xpulaunch.errors import UsageError

if TYPE_CHECKING:
    from collections.abc import Mapping

    from xpulaunch.cli.config_schema import Layer, Setting

PROJECT_FILE = "xpulaunch.toml"
PYPROJECT = "pyproject.toml"
# Commands whose options config files may set ("config" itself has none worth keeping).
CONFIGURED_COMMANDS = ("run", "llama", "devices")
# Options that say what to do this time, not how: never taken from a file.
NOT_CONFIGURABLE = frozenset({"help", "dry-run", "json"})


# Paths are plain strings (os.path): ``pathlib`` would be imported for this lookup alone on
# every command.
def user_config_path(env: Mapping[str, str]) -> str:
    base = env.get("XDG_CONFIG_HOME") or os.path.join(env.get("HOME", "~"), ".config")
    return os.path.join(os.path.expanduser(base), "xpulaunch", "config.toml")


def find_project_file(start: str) -> str | None:
    """The nearest ``xpulaunch.toml``, or ``pyproject.toml`` with a ``[tool.xpulaunch]`` table,
    in ``start`` or a folder above it."""
    directory, parent = start, None
    while directory != parent:
        candidate = os.path.join(directory, PROJECT_FILE)
        if _is_file(candidate):
            return candidate
        pyproject = os.path.join(directory, PYPROJECT)
        if _is_file(pyproject) and _has_tool_table(pyproject):
            return pyproject
        directory, parent = os.path.dirname(directory), directory
    return None


def load_layers(cwd: str, env: Mapping[str, str]) -> list[Layer]:
    """The user layer, then the project layer: the files that exist, lowest first."""
    found: list[tuple[str, dict[str, Any]]] = []  # (source, table)
    user = user_config_path(env)
    if _is_file(user):
        found.append((user, read_toml(user)))
    project = find_project_file(cwd)
    if project is not None:
        table = read_toml(project)
        if os.path.basename(project) == PYPROJECT:
            found.append((f"{project} [tool.xpulaunch]", table["tool"]["xpulaunch"]))
        else:
            found.append((project, table))
    if not found:
        return []
    from xpulaunch.cli.config_schema import Layer  # here: most commands run where no file exists

    return [Layer(source, table) for source, table in found]


def _is_file(path: str) -> bool:
    """Whether a config file is there. A folder above it that is closed to us (another user's
    HOME, kept by ``setpriv`` or ``su`` without ``-l``), or a path the system cannot look up
    (a name too long), hides it: said, and gone on without, as git does with a config file it
    cannot reach. A file we see but cannot read is an error (``read_toml``): ours to fix."""
    try:
        return stat.S_ISREG(os.stat(path).st_mode)
    except (FileNotFoundError, NotADirectoryError):
        return False
    except OSError as exc:
        click.echo(
            f"xpulaunch: warning: cannot look for {path} ({exc.strerror}); going on without it",
            err=True,
        )
        return False


def read_toml(path: str) -> dict[str, Any]:
    # Imported here: most commands run where no config file exists, and never need a parser.
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover - the backport, on 3.10
        import tomli as tomllib
    try:
        with open(path, "rb") as stream:
            table: dict[str, Any] = tomllib.load(stream)
            return table
    except OSError as exc:
        raise UsageError(f"{path}: cannot read it ({exc.strerror})") from exc
    except UnicodeDecodeError as exc:
        raise UsageError(f"{path}: not UTF-8 text ({exc.reason}), so not TOML") from exc
    except tomllib.TOMLDecodeError as exc:
        raise UsageError(f"{path}: {exc}") from exc
    except RecursionError as exc:  # arrays nested thousands deep
        raise UsageError(f"{path}: nested too deeply to be a config file") from exc


def _has_tool_table(path: str) -> bool:
    """Cheap first look (the text names the table), then a real parse, whose errors are the
    user's to see: a project that means to configure us must not be ignored silently."""
    try:
        with open(path, encoding="utf-8", errors="replace") as stream:
            if "xpulaunch" not in stream.read():
                return False
    except OSError:
        return False
    tool = read_toml(path).get("tool")
    return isinstance(tool, dict) and isinstance(tool.get("xpulaunch"), dict)


def command_options(name: str) -> dict[str, click.Option]:
    """A command's configurable options by key (long option without dashes)."""
    from xpulaunch.cli.config_schema import normalise_key

    options = [p for p in load_command(name).params if isinstance(p, click.Option)]
    keys = {normalise_key(opt): p for p in options for opt in p.opts if opt.startswith("--")}
    return {key: option for key, option in keys.items() if key not in NOT_CONFIGURABLE}


def effective_settings(profile: str | None, cwd: str, env: Mapping[str, str]) -> dict[str, Setting]:
    """Every key the files set, with its source; ``{}`` when there are no files."""
    layers = load_layers(cwd, env)
    if not layers and profile is None:
        return {}
    from xpulaunch.cli.config_schema import merge

    valid = {key for name in CONFIGURED_COMMANDS for key in command_options(name)}
    return merge(layers, valid, profile)


def default_map(settings: Mapping[str, Setting]) -> dict[str, dict[str, Any]]:
    """click's ``default_map``: for each configured command, its parameters' values, each
    checked by the option's own type so that a bad value names its file and key."""
    defaults: dict[str, dict[str, Any]] = {}
    for name in CONFIGURED_COMMANDS:
        options = command_options(name)
        mine = {key: s for key, s in settings.items() if key in options}
        defaults[name] = {options[k].name or k: _checked(options[k], k, s) for k, s in mine.items()}
    return defaults


def _checked(option: click.Option, key: str, setting: Setting) -> Any:
    """A TOML value as the option takes it: a flag is ``true``/``false``, never a number; a
    count is never a boolean or a fraction (``max-restarts = 2.9`` is refused, not taken as 2);
    text is never empty (an empty value would be taken as unset)."""
    value = setting.value
    if option.is_flag and not isinstance(value, bool):
        raise UsageError(f"{setting.source}: {key}: expected true or false, not {value!r}")
    if not option.is_flag and (isinstance(value, bool) or value == ""):
        raise UsageError(f"{setting.source}: {key}: expected a value, not {value!r}")
    if isinstance(option.type, click.Path | click.Choice) and not isinstance(value, str):
        raise UsageError(f"{setting.source}: {key}: expected a string, not {value!r}")
    if isinstance(value, str) and "\0" in value:  # TOML's \u0000: no argv or variable has one
        raise UsageError(f"{setting.source}: {key}: {value!r} holds a NUL character")
    if isinstance(option.type, click.types.StringParamType):  # gpus = 2, nnodes = 2 read well
        if not isinstance(value, str | int):
            raise UsageError(f"{setting.source}: {key}: expected a string, not {value!r}")
        value = str(value)
    try:
        option.type.convert(value, option, None)
    except click.BadParameter as exc:
        raise UsageError(f"{setting.source}: {key}: {exc.message}") from exc
    return value


def apply_config_files(ctx: click.Context, profile: str | None) -> None:
    """Give the group's context the files' values as ``default_map`` (no files: nothing)."""
    settings = effective_settings(profile, os.getcwd(), os.environ)
    if settings:
        ctx.default_map = default_map(settings)
