"""A worker whose entry point is wrapped in torch's @record: local rank 1 raises, and torch
writes the exception to TORCHELASTIC_ERROR_FILE."""

import os
import sys

from torch.distributed.elastic.multiprocessing.errors import record


@record
def main() -> None:
    local_rank = os.environ["LOCAL_RANK"]
    print(f"local rank {local_rank} to stdout", flush=True)
    print(f"local rank {local_rank} to stderr", file=sys.stderr, flush=True)
    if local_rank == "1":
        raise ValueError("bad batch on local rank 1")


main()
