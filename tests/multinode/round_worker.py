"""A worker whose first run fails and whose second succeeds, logging when each run starts and
ends (``--log``, one line per event, appended by every worker of every node). On node 0 the
failing run takes ``--slow`` seconds, as a worker stuck in a collective for a while."""

import argparse
import os
import signal
import sys
import time

parser = argparse.ArgumentParser()
parser.add_argument("--log", required=True)
parser.add_argument("--slow", type=float, default=0.0)
args = parser.parse_args()
node, rank = os.environ["GROUP_RANK"], os.environ["RANK"]
attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])


def log(what: str) -> None:
    with open(args.log, "a") as out:
        out.write(f"{what} {attempt} {node} {rank} {time.time():.6f}\n")


def stopped(signum: int, frame: object) -> None:  # a gang stop: this run ends here too
    log("end")
    sys.exit(128 + signum)


signal.signal(signal.SIGTERM, stopped)


def all_started() -> bool:
    """Every worker of every node has started this attempt (and so handles SIGTERM): a gang
    stop, this node's or one another node's failure brings, can then not kill one before it
    logs its end."""
    with open(args.log) as lines:
        started = [line for line in lines if line.startswith(f"start {attempt} ")]
    return len(started) == int(os.environ["WORLD_SIZE"])


log("start")
if attempt == 0:
    while not all_started():
        time.sleep(0.01)
    time.sleep(args.slow if node == "0" else 0.0)
    log("end")
    print(f"rank {rank}: failing on purpose", file=sys.stderr, flush=True)
    sys.exit(3)
print(f"REPORT rank {rank} attempt {attempt}", flush=True)
log("end")
