"""``xpulaunch torchrun [TORCHRUN_OPTIONS] SCRIPT [ARGS]...``: torchrun's command line, run by
xpulaunch (device selection, leases, supervision and cleanup on top).

The arguments, and torchrun's ``PET_*`` variables for the options not given, are translated
(:mod:`xpulaunch.cli.torchrun_args`) into an ``xpulaunch run`` command line, which then runs as
if typed. ``run``'s own options (``--gpus``, ``--isolate``, ``--dry-run``, leases ...) may be
mixed in before SCRIPT.
"""

from __future__ import annotations

import os
import sys

import click

from xpulaunch.cli.options import CONTEXT_SETTINGS
from xpulaunch.cli.program import option_arity
from xpulaunch.cli.torchrun_args import translate


@click.command(
    context_settings={
        **CONTEXT_SETTINGS,
        "ignore_unknown_options": True,
        "allow_interspersed_args": False,
    }
)
@click.argument("args", nargs=-1, required=True, type=click.UNPROCESSED)
@click.pass_context
def torchrun(ctx: click.Context, args: tuple[str, ...]) -> object:
    """torchrun's options (dash or underscore spellings), then SCRIPT and its arguments.

    \b
    Mapped:   --nnodes --node-rank --master-addr --master-port --rdzv-endpoint
              --nproc-per-node N|auto|gpu|xpu|cpu --standalone --max-restarts --log-dir
              --local-ranks-filter --shutdown-timeout (as --grace) -m/--module --no-python
              --run-path --rdzv-conf --rdzv-backend static|c10d --rdzv-id
    Accepted: --monitor-interval --start-method --tee --redirects
              --event-log-handler --role default --signals-to-handle (TERM, INT, HUP, QUIT)
    Refused:  --local-addr --logs-specs --numa-binding --virtual-local-rank
              --duplicate-stdout-filters --duplicate-stderr-filters --rdzv-backend etcd
    Also:     every option of xpulaunch run, such as --gpus, --isolate, --dry-run.

    As in torchrun, an option not given is read from PET_<NAME> (PET_NPROC_PER_NODE=2,
    PET_STANDALONE=1); the command line wins.

    --rdzv-conf: join_timeout (or timeout) is --join-timeout; torch's other c10d keys
    (last_call_timeout=S, close_timeout, heartbeat_timeout, keep_alive_interval,
    keep_alive_max_attempt, read_timeout, is_host) go to the agent of a multi-node c10d job.

    --log-dir DIR is laid out as torchrun's: DIR/RUNID_XXXXXXXX/attempt_N/LOCAL_RANK/ with
    stdout.log, stderr.log (the lines as written) and error.json; in a multi-node c10d job
    torch's agent writes it. xpulaunch's console always shows and its log files always keep
    both streams of every worker, so --tee and --redirects change nothing. --nproc-per-node
    auto is one worker per selected device (one on the CPU).
    """
    from xpulaunch.cli.run import run

    arity = option_arity(run)
    run_args = translate(list(args), arity, sys.executable, os.environ)
    with run.make_context(f"{ctx.command_path}", run_args, parent=ctx) as sub:
        return run.invoke(sub)
