"""``--accelerate-config FILE|default``: run a job as ``accelerate launch`` would with that file.

The file's process count, devices and rendezvous fill ``run``'s own options unless the
command line or the environment set them (as ``accelerate launch`` lets its flags win over the
file), each checked by that option's own type; its other settings become variables of every
worker. What xpulaunch does not honour is named in one warning line.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import click

from xpulaunch.errors import SelectionError, UsageError

_SET_BY_USER = (click.core.ParameterSource.COMMANDLINE, click.core.ParameterSource.ENVIRONMENT)


def apply_accelerate_config(values: dict[str, Any], env: Mapping[str, str]) -> None:
    """Fill ``values`` (a command's converted keyword arguments) from ``accelerate_config``,
    and add the workers' variables (``extra_env``) and a note (``notes``)."""
    from xpulaunch.integrations.accelerate_config import translate
    from xpulaunch.integrations.accelerate_env import NEWEST
    from xpulaunch.integrations.accelerate_files import (
        default_config_path,
        installed_release,
        read_config,
    )

    value = values["accelerate_config"]
    path = default_config_path(env) if value == "default" else Path(value)
    source = f"--accelerate-config {path}"
    sources = click.get_current_context().get_parameter_source
    nproc = values["nproc_per_node"] if sources("nproc_per_node") in _SET_BY_USER else None
    launch = translate(
        read_config(path),
        env,
        source=source,
        cwd=os.getcwd(),
        nproc_per_node=nproc,
        accelerate=installed_release() or NEWEST,
    )
    _fill(values, launch.options, str(path))
    if launch.ignored:
        _warn(f"{path}: not honoured: {', '.join(launch.ignored)}")
    for line in launch.warnings:
        _warn(f"{path}: {line}")
    values["extra_env"] = tuple(sorted(launch.env.items()))
    if launch.gpu_ids is not None and sources("gpus") not in _SET_BY_USER:
        values["gpu_ids"] = launch.gpu_ids  # a --gpus of the user's wins over the file
    if sources("gpus") not in _SET_BY_USER:
        values["devices_from"] = f"{path} ({launch.devices_from})"
    values["notes"] = (*values.get("notes", ()), f"accelerate config {path}: {launch.summary}")


def _fill(values: dict[str, Any], options: Mapping[str, object], source: str) -> None:
    ctx = click.get_current_context()
    params = {p.name: p for p in ctx.command.params}
    lacking = [name for name in options if name not in params]
    if lacking:
        flags = ", ".join("--" + name.replace("_", "-") for name in lacking)
        raise UsageError(f"{source}: num_machines > 1 needs {flags}, which this command lacks")
    for name, value in options.items():
        if ctx.get_parameter_source(name) in _SET_BY_USER:
            continue
        try:
            values[name] = params[name].type_cast_value(ctx, value)
        except click.BadParameter as exc:
            flag = "--" + name.replace("_", "-")
            raise UsageError(f"{source}: its {flag} would be {value!r}: {exc.message}") from exc


def _warn(text: str) -> None:
    click.echo(f"xpulaunch: warning: {text}", err=True)


@contextlib.contextmanager
def devices_named_by_file(values: Mapping[str, Any]) -> Iterator[None]:
    """A device request that cannot be met names the config file and the keys that made it,
    not ``--gpus``, which the user never typed; on a host with no accelerator it says how to
    run the file's job on the CPU."""
    source = values.get("devices_from")
    try:
        yield
    except SelectionError as exc:
        if source is None or exc.option not in ("gpus", "gpu_ids"):
            raise
        hint = ""
        if exc.detail.startswith("no usable accelerator"):
            hint = (
                "; to run this job on the CPU, set use_cpu: true (or distributed_type: "
                "MULTI_CPU) in the file"
            )
        raise SelectionError(f"{source}: {exc.detail}{hint}") from exc
