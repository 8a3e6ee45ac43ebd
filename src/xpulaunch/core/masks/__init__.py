"""Parse and format each runtime's visibility variable, the way that runtime reads it.

Pure: a parser takes the variable's value (``None`` = unset) and the devices of the inventory,
and returns what the runtime would expose, in the runtime's order, with notes on anything
surprising. A value that would crash the runtime, or that the runtime refuses, raises
:class:`~xpulaunch.errors.MaskError` with one line naming the variable, the value and what
would be valid. Sources: compute-runtime (Level Zero), intel/llvm (SYCL), the CUDA
Programming Guide, ROCm's "GPU isolation techniques".

One module per runtime: :mod:`.cuda`, :mod:`.level_zero`, :mod:`.oneapi`, :mod:`.rocm`, each
imported by the code that reads or writes that runtime's variable (a plan for a CUDA host loads
no Intel or AMD parser, one for a CPU-only host none). Here: what they all share, the
variables' names, C's idea of white space and C++'s way of splitting a list, so that naming a
variable (``core.visibility`` does, for every vendor) loads no parser.
"""

from __future__ import annotations

CUDA_VAR = "CUDA_VISIBLE_DEVICES"
ZE_MASK_VAR = "ZE_AFFINITY_MASK"
ZE_HIERARCHY_VAR = "ZE_FLAT_DEVICE_HIERARCHY"
ODS_VAR = "ONEAPI_DEVICE_SELECTOR"
ROCR_VAR = "ROCR_VISIBLE_DEVICES"
HIP_VAR = "HIP_VISIBLE_DEVICES"

# An empty ZE_AFFINITY_MASK masks nothing, so hiding every Intel GPU takes an index no host
# has: the driver skips out-of-range entries and exposes zero devices (compute-runtime,
# inferred from the driver source).
ZE_HIDE_ALL = "999"

C_SPACE = " \t\n\v\f\r"  # C isspace(): what strtoul/stoul skip and ROCr's trim() strips


def split_list(text: str, delimiter: str = ",") -> list[str]:
    """``text`` split at ``delimiter`` as the runtimes' C++ does (``std::getline`` in ROCr and
    ROCclr, compute-runtime's ``StringHelpers::split``): empty pieces are kept, except a
    trailing one, and ``""`` holds none."""
    pieces = text.split(delimiter)
    return pieces[:-1] if pieces[-1] == "" else pieces
