"""Prints the accelerate variables it was started with, as one JSON line."""

import json
import os

PREFIXES = ("ACCELERATE_", "FSDP_", "MEGATRON_LM_", "PARALLELISM_CONFIG_", "KMP_")
mine = {k: v for k, v in os.environ.items() if k.startswith(PREFIXES)}
print("ENV " + json.dumps(mine, sort_keys=True), flush=True)
