"""A real accelerate program: prints what its Accelerator() sees, as one JSON line per rank."""

import json
import os

from accelerate import Accelerator

accelerator = Accelerator()
state = {
    "num_processes": accelerator.num_processes,
    "process_index": accelerator.process_index,
    "local_process_index": accelerator.local_process_index,
    "mixed_precision": accelerator.mixed_precision,
    "distributed_type": str(accelerator.distributed_type),
    "device": str(accelerator.device),
    "env": {k: v for k, v in os.environ.items() if k.startswith("ACCELERATE_")},
}
accelerator.wait_for_everyone()  # a real collective: the ranks found each other
print("STATE " + json.dumps(state, sort_keys=True), flush=True)
