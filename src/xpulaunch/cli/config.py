"""``xpulaunch config show``: each option's effective value and where it came from."""

from __future__ import annotations

import json
import os

import click

from xpulaunch.cli.commands import CONTEXT_SETTINGS
from xpulaunch.cli.config_files import (
    CONFIGURED_COMMANDS,
    command_options,
    default_map,
    effective_settings,
    load_layers,
)
from xpulaunch.cli.config_schema import Explained, OptionInfo, explain


@click.group(context_settings=CONTEXT_SETTINGS, invoke_without_command=True)
@click.pass_context
def config(ctx: click.Context) -> None:
    """Config files: xpulaunch.toml or [tool.xpulaunch] in pyproject.toml (the project's),
    ~/.config/xpulaunch/config.toml (yours). Keys are the long options; the command line and
    the environment win over them."""
    if ctx.invoked_subcommand is None:  # `xpulaunch config` alone: its help, not an error
        click.echo(ctx.get_help())


@config.command(context_settings=CONTEXT_SETTINGS)
@click.option(
    "--command",
    "command_name",
    type=click.Choice(CONFIGURED_COMMANDS),
    default="run",
    show_default=True,
    help="Whose options to show.",
)
@click.option("--json", "as_json", is_flag=True, help="One JSON object per option.")
@click.pass_context
def show(ctx: click.Context, command_name: str, as_json: bool) -> None:
    """Print each option's effective value and where it came from."""
    profile = ctx.find_root().params.get("profile")
    cwd = os.getcwd()
    settings = effective_settings(profile, cwd, os.environ)
    default_map(settings)  # a value its option would refuse is an error here too
    rows = explain(_option_infos(command_name), settings, os.environ)
    if as_json:
        for row in rows:
            click.echo(json.dumps({"key": row.key, "value": row.value, "source": row.source}))
        return
    files = [layer.source for layer in load_layers(cwd, os.environ)]
    click.echo(f"files: {', '.join(files) if files else 'none'}")
    if profile is not None:
        click.echo(f"profile: {profile}")
    _print_rows(rows)


def _option_infos(command_name: str) -> list[OptionInfo]:
    infos: list[OptionInfo] = []
    seen: set[str | None] = set()
    for key, option in command_options(command_name).items():
        if option.name in seen:
            continue  # a second spelling of one option (--ranks, --local-ranks-filter)
        seen.add(option.name)
        envvar = option.envvar
        envvars = [envvar] if isinstance(envvar, str) else list(envvar or [])
        infos.append(OptionInfo(key, tuple(envvars), _default(option)))
    return infos


def _default(option: click.Option) -> object:
    """The option's default as a plain value; None where it has none (click's own UNSET)."""
    default = option.get_default(click.Context(click.Command("show")), call=False)
    return default if isinstance(default, (str, int, float, bool)) else None


def _print_rows(rows: list[Explained]) -> None:
    width = max(len(r.key) for r in rows)
    values = [json.dumps(r.value) if r.value is not None else "(unset)" for r in rows]
    value_width = max(len(v) for v in values)
    for row, value in zip(rows, values, strict=True):
        click.echo(f"  {row.key:<{width}} = {value:<{value_width}}  {row.source}")
