"""A gloo worker of an elastic job: reports its ranks, then all-reduces every ``--every``
seconds (0.2 by default).

``--fail-fast``: a failed all-reduce ends the process at once (``os._exit(1)``, as a framework
that exits on a collective's error does), not after the interpreter's teardown.

``--until-world N``: exit 0 after the first all-reduce in a world of N ranks; smaller worlds
keep going until the agent restarts them into a larger one. Without it, run until killed
(or until a peer dies and the all-reduce fails).
"""

import argparse
import os
import sys
import time

import torch
import torch.distributed as dist

parser = argparse.ArgumentParser()
parser.add_argument("--until-world", type=int, default=None)
parser.add_argument("--every", type=float, default=0.2)
parser.add_argument("--fail-fast", action="store_true")
parser.add_argument("--tag", help="a marker in the command line, for finding leftovers")
args = parser.parse_args()
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
print(f"ELASTIC rank {rank} world {world} group {os.environ['GROUP_RANK']}", flush=True)
while True:
    total = torch.ones(1)
    try:
        dist.all_reduce(total)
    except RuntimeError as error:
        if not args.fail_fast:
            raise
        print(f"ELASTIC rank {rank}: all-reduce failed: {error}", file=sys.stderr, flush=True)
        os._exit(1)
    if world == args.until_world:
        print(f"ELASTIC rank {rank} done in a world of {int(total.item())}", flush=True)
        break
    time.sleep(args.every)
dist.destroy_process_group()
