"""A worker that prints its torchrun variables as JSON on one line and exits."""

import json
import os

NAMES = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK",
         "GROUP_WORLD_SIZE", "ROLE_RANK", "ROLE_WORLD_SIZE", "ROLE_NAME", "MASTER_ADDR",
         "MASTER_PORT", "TORCHELASTIC_RUN_ID", "TORCH_NCCL_ASYNC_ERROR_HANDLING")  # fmt: skip
print("REPORT " + json.dumps({name: os.environ.get(name) for name in NAMES}), flush=True)
