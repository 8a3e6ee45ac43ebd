"""A rank stuck before an NCCL all-reduce, for ``multinode_check.sh``.

Every rank all-reduces a tensor ten times, printing a line after each. In the first attempt
(``TORCHELASTIC_RESTART_COUNT`` 0) the last rank stops printing before step 5 and sleeps;
the others block in that all-reduce, which NCCL never fails for a missing peer (only its
watchdog would, after many minutes). Only ``--hang-timeout`` gets the job out; the next
attempt runs through.
"""

import os
import time

import torch
import torch.distributed as dist

rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
local_rank = int(os.environ["LOCAL_RANK"])
attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
device = torch.device("cuda", local_rank % torch.cuda.device_count())
torch.cuda.set_device(device)
dist.init_process_group("nccl", device_id=device)
x = torch.ones(1, device=device)
for step in range(1, 11):
    if attempt == 0 and step == 5 and rank == world - 1:
        print(f"rank {rank}: stuck before the all-reduce of step {step}", flush=True)
        time.sleep(3600)
    dist.all_reduce(x)
    torch.cuda.synchronize()
    print(f"rank {rank} step {step} attempt {attempt} value {x.item():g}", flush=True)
    time.sleep(0.2)
print(f"rank {rank}: done in attempt {attempt}", flush=True)
dist.destroy_process_group()
os._exit(0)  # examples/train.py says why: a clean exit can abort in torch's threads
