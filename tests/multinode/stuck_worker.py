"""A worker that stands in for NCCL: in its first run, node 1's worker fails once node 0's is
up, and node 0's worker keeps running (sleeping), as an NCCL rank keeps waiting in a
collective whose peer died. A later run prints a REPORT line and exits 0. ``--forever``: every
worker only sleeps (a node is killed from outside). ``--marks DIR``: where the workers say
they are up (``up-NODE-RANK``)."""

import argparse
import os
import sys
import time
from pathlib import Path

parser = argparse.ArgumentParser()
parser.add_argument("--marks", type=Path, required=True)
parser.add_argument("--forever", action="store_true")
args = parser.parse_args()
node, rank = os.environ["GROUP_RANK"], os.environ["RANK"]
attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
print(f"rank {rank} of node {node}: attempt {attempt}", flush=True)
(args.marks / f"up-{node}-{rank}-{attempt}").touch()
if args.forever or attempt == 0:
    if node == "1" and not args.forever:
        for _ in range(600):  # until node 0's worker runs: its collective now waits for us
            if list(args.marks.glob(f"up-0-*-{attempt}")):
                break
            time.sleep(0.1)
        print(f"rank {rank}: failing on purpose", file=sys.stderr, flush=True)
        sys.exit(1)
    time.sleep(3600)  # blind to its peer's death, as NCCL is
print(f"REPORT rank {rank} attempt {attempt}", flush=True)
