"""``--accelerate-config FILE|default``: run a job as ``accelerate launch`` would with that file.

The file's process count, devices and rendezvous fill ``run``'s own options unless the
command line or the environment set them (as ``accelerate launch`` lets its flags win over the
file); its other settings become variables of every worker. What xpulaunch does not honour is
named in one warning line.
"""

from __future__ import annotations

import os
from typing import Any

import click

from xpulaunch.cli.options import option_group
from xpulaunch.errors import UsageError

accelerate_options = option_group(
    click.option(
        "--accelerate-config",
        envvar="XPULAUNCH_ACCELERATE_CONFIG",
        metavar="FILE|default",
        help="Start the job as `accelerate launch` would with this config file (default: "
        "accelerate's own default file); our options given explicitly win.",
    ),
)

_SET_BY_USER = (click.core.ParameterSource.COMMANDLINE, click.core.ParameterSource.ENVIRONMENT)


def apply_accelerate_config(options: dict[str, Any]) -> dict[str, Any]:
    """Fill ``options`` from ``--accelerate-config``; return the plan's extra arguments (the
    workers' variables and a note)."""
    value = options.pop("accelerate_config", None)
    if value is None:
        return {}
    from xpulaunch.core.accelerate_config import translate
    from xpulaunch.integrations.accelerate_files import read_config, resolve_config_path

    path = resolve_config_path(value, os.environ)
    source = f"--accelerate-config {path}"
    launch = translate(read_config(path), os.environ, source=source, cwd=os.getcwd())
    _fill(options, launch.options, str(path))
    if launch.ignored:
        click.echo(
            f"xpulaunch: warning: {path}: not honoured: {', '.join(launch.ignored)}", err=True
        )
    for line in launch.warnings:
        click.echo(f"xpulaunch: warning: {path}: {line}", err=True)
    extra: dict[str, Any] = {"extra_env": launch.env}
    extra["notes"] = [f"accelerate config {path}: {launch.summary}"]
    gpus_source = click.get_current_context().get_parameter_source("gpus")
    if launch.gpu_ids is not None and gpus_source not in _SET_BY_USER:
        extra["gpu_ids"] = launch.gpu_ids  # a --gpus of the user's wins over the file
    return extra


def _fill(options: dict[str, Any], values: dict[str, object], source: str) -> None:
    ctx = click.get_current_context()
    lacking = [name for name in values if name not in options]
    if lacking:
        flags = ", ".join("--" + name.replace("_", "-") for name in lacking)
        raise UsageError(f"{source}: num_machines > 1 needs {flags}, which this command lacks")
    for name, value in values.items():
        if ctx.get_parameter_source(name) not in _SET_BY_USER:
            options[name] = value
