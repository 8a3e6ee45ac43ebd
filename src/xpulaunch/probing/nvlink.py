"""NVIDIA GPU links without a CUDA context: NVML's NVLink state and remote PCI info per link,
and its PCIe common ancestor per pair of GPUs; ``nvidia-smi topo -m`` where NVML is not usable.

The facts are the inventory's ``links`` and ``pcie`` keys (:mod:`xpulaunch.core.topology`).
A GPU without NVLink answers ``Not Supported`` for link 0, and one past its last link
``Invalid Argument``: either ends its walk. On NVSwitch systems a link's remote device is the
switch (``nvmlDeviceGetNvLinkRemoteDeviceType``), not a GPU.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from xpulaunch.core.device_ids import normalize_bus_id
from xpulaunch.model import Problem
from xpulaunch.probing.parsers.topology import NvidiaTopology

if TYPE_CHECKING:
    from collections.abc import Sequence
    from typing import Any

    from xpulaunch.probing.observe import Observation

TOPO_ARGV = ("nvidia-smi", "topo", "-m")
# nvmlGpuTopologyLevel_t -> nvidia-smi's word (INTERNAL: GPUs of one board, closer than PIX).
_ANCESTOR = {0: "PIX", 10: "PIX", 20: "PXB", 30: "PHB", 40: "NODE", 50: "SYS"}
_SWITCH_TYPE = 2  # NVML_NVLINK_DEVICE_TYPE_SWITCH


def with_nvml_topology(
    nvml: Any, found: Sequence[Observation], handles: Sequence[Any], problems: list[Problem]
) -> list[Observation]:
    """``found`` (their NVML ``handles``, in order) with each GPU's NVLinks and its PCIe
    relation to every other GPU (asked once a pair)."""
    buses = {obs.pci_bus_id for obs in found}
    pcie = _pcie(nvml, handles, found)
    result = []
    for handle, obs in zip(handles, found, strict=True):
        facts: dict[str, object] = {}
        links = _links(nvml, handle, buses, obs.key, problems)
        if links:
            facts["links"] = links
        if pcie.get(obs.key):
            facts["pcie"] = pcie[obs.key]
        result.append(replace(obs, extra={**obs.extra, **facts}) if facts else obs)
    return result


def _links(
    nvml: Any, handle: Any, gpus: set[str | None], where: str, problems: list[Problem]
) -> list[dict[str, object]]:
    peers: dict[str, dict[str, object]] = {}
    for link in range(int(getattr(nvml, "NVML_NVLINK_MAX_LINKS", 18))):
        try:
            if nvml.nvmlDeviceGetNvLinkState(handle, link) != nvml.NVML_FEATURE_ENABLED:
                continue
            remote = normalize_bus_id(
                _text(nvml.nvmlDeviceGetNvLinkRemotePciInfo(handle, link).busId)
            )
        except nvml.NVMLError as exc:
            if exc.value not in (nvml.NVML_ERROR_NOT_SUPPORTED, nvml.NVML_ERROR_INVALID_ARGUMENT):
                problems.append(Problem("nvml", f"NVLink {link}: {exc}", where))
            break
        if remote is None:
            continue
        entry = peers.setdefault(
            remote, {"kind": "nvlink", "peer": remote, "count": 0, "peer_type": "gpu"}
        )
        entry["count"] = int(str(entry["count"])) + 1
        if remote not in gpus and _is_switch(nvml, handle, link):
            entry["peer_type"] = "switch"
    return list(peers.values())


def _text(value: object) -> str:
    """nvidia-ml-py returns ``str``; very old pynvml returned ``bytes``."""
    return value.decode("ascii", "replace") if isinstance(value, bytes) else str(value)


def _is_switch(nvml: Any, handle: Any, link: int) -> bool:
    """Whether the link's far end is an NVSwitch; a remote address that is no GPU of this host
    counts as one where the driver cannot say."""
    try:
        return bool(nvml.nvmlDeviceGetNvLinkRemoteDeviceType(handle, link) == _SWITCH_TYPE)
    except (nvml.NVMLError, AttributeError):  # an older pynvml has no such function
        return True


def _pcie(
    nvml: Any, handles: Sequence[Any], found: Sequence[Observation]
) -> dict[str, dict[str, str]]:
    """Each GPU's PCIe relation to the others, keyed by PCI address."""
    pcie: dict[str, dict[str, str]] = {}
    for i, one in enumerate(found):
        for j in range(i + 1, len(found)):
            other = found[j]
            try:
                ancestor = nvml.nvmlDeviceGetTopologyCommonAncestor(handles[i], handles[j])
            except nvml.NVMLError:
                continue  # not supported (a VM without the PCI tree): the sysfs path decides
            word = _ANCESTOR.get(int(ancestor))
            if word is not None and one.pci_bus_id and other.pci_bus_id:
                pcie.setdefault(one.pci_bus_id, {})[other.pci_bus_id] = word
                pcie.setdefault(other.pci_bus_id, {})[one.pci_bus_id] = word
    return pcie


def with_topo_matrix(found: Sequence[Observation], topology: NvidiaTopology) -> list[Observation]:
    """``found`` (numbered by nvidia-smi's index) with the links and PCIe relations of
    ``nvidia-smi topo -m``."""
    bus_of = {obs.index: obs.pci_bus_id for obs in found}
    result = []
    for obs in found:
        links, pcie = [], {}
        for (row, col), cell in topology.cells.items():
            peer = bus_of.get(col)
            if row != obs.index or peer is None or col == row:
                continue
            if cell.startswith("NV"):
                links.append(
                    {"kind": "nvlink", "peer": peer, "count": int(cell[2:]), "peer_type": "gpu"}
                )
            else:
                pcie[peer] = cell
        facts: dict[str, object] = {"links": links} if links else {}
        if pcie:
            facts["pcie"] = pcie
        result.append(replace(obs, extra={**obs.extra, **facts}) if facts else obs)
    return result
