"""What every mask module shares: the variables' names and C's idea of white space.

Kept apart from the parsers so that naming a variable (``core.visibility`` does, for every
vendor) does not load any vendor's parser.
"""

from __future__ import annotations

CUDA_VAR = "CUDA_VISIBLE_DEVICES"
ZE_MASK_VAR = "ZE_AFFINITY_MASK"
ZE_HIERARCHY_VAR = "ZE_FLAT_DEVICE_HIERARCHY"
ODS_VAR = "ONEAPI_DEVICE_SELECTOR"
ROCR_VAR = "ROCR_VISIBLE_DEVICES"
HIP_VAR = "HIP_VISIBLE_DEVICES"

C_SPACE = " \t\n\v\f\r"  # C isspace(): what strtoul/stoul skip and ROCr's trim() strips
