"""xpu-smi, both generations (1.x ``discovery -j``/``dump``, 2.x ``--query-gpu``).

2.x answers ``--query-gpu`` in one call; 1.x refuses that option, so it is the fallback:
``discovery -j`` for identity, then in parallel ``dump -m 0,5,18 -n 1`` (the first row arrives
after one 1 s interval) and ``discovery -d N -j`` for cards whose size or tile count is unknown.

xpu-smi 1.x enumerates through Level Zero *core*, so a ``ZE_AFFINITY_MASK`` in its environment
hides cards from it and renumbers the rest: every call runs with the Level Zero and SYCL
selection variables removed.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import replace
from functools import partial
from typing import TypeVar

from xpulaunch.core.visibility import VENDOR_VARS
from xpulaunch.model import Problem, Vendor
from xpulaunch.probing.context import (
    ProbeContext,
    failed,
    not_installed,
    parallel,
    parsed_run,
    run_tool,
)
from xpulaunch.probing.observe import Observation
from xpulaunch.probing.parsers.common import MIB, ParseError, percent
from xpulaunch.probing.parsers.intel import (
    DUMP_METRICS,
    QUERY_V2_FIELDS,
    XpuSmiCard,
    XpuSmiDetail,
    parse_discovery_detail_json,
    parse_discovery_json,
    parse_dump_csv,
    parse_list_gpus_v2,
    parse_query_gpu_v2,
)
from xpulaunch.probing.parsers.topology import XpuTopology, parse_xpu_smi_topology
from xpulaunch.probing.runner import RunResult

# The tools must see every Intel GPU and tile, whatever the parent hides from its children.
SELECTION_VARS = VENDOR_VARS[Vendor.INTEL]
QUERY_V2_ARGV = [
    "xpu-smi",
    f"--query-gpu={','.join(QUERY_V2_FIELDS)}",
    "--format=csv,noheader,nounits",
]
Dump = dict[int, dict[int, float | None]]  # device id -> metric id -> value
_Outcome = tuple[list[Observation] | None, list[Problem], list[Problem]]  # found, problems, notes
T = TypeVar("T")


def probe_xpu_smi(ctx: ProbeContext, needs_detail: Callable[[Observation], bool]) -> _Outcome:
    """Intel cards as xpu-smi sees them; ``needs_detail`` picks 1.x cards worth a per-card call."""
    v2 = _run(ctx, QUERY_V2_ARGV)
    if v2 is None:
        return None, [], [not_installed("xpu-smi")]
    if isinstance(v2, RunResult) and v2.returncode == 0:
        try:
            return _with_names(ctx, parse_query_gpu_v2(v2.stdout, QUERY_V2_FIELDS)), [], []
        except ParseError as exc:
            v2 = Problem("xpu-smi", f"--query-gpu: {exc}")
    # 1.x rejects --query-gpu: expected there, so only a note unless 1.x fails as well.
    v2_note = v2 if isinstance(v2, Problem) else failed(v2, "xpu-smi")
    found, problems = _probe_v1(ctx, needs_detail)
    if found is None:
        return None, [*problems, v2_note], []
    return found, problems, [v2_note]


def _run(ctx: ProbeContext, argv: list[str]) -> RunResult | Problem | None:
    return run_tool(ctx, argv, drop_env=SELECTION_VARS)


def _with_names(ctx: ProbeContext, found: list[Observation]) -> list[Observation]:
    """2.x ``--query-gpu`` has no name field we can rely on; ``--list-gpus`` has names."""
    run = _run(ctx, ["xpu-smi", "--list-gpus"])
    if not isinstance(run, RunResult) or run.returncode != 0:
        return found
    names = parse_list_gpus_v2(run.stdout)
    return [replace(o, name=names.get(o.uuid or "")) for o in found]


def _probe_v1(
    ctx: ProbeContext, needs_detail: Callable[[Observation], bool]
) -> tuple[list[Observation] | None, list[Problem]]:
    cards = _parsed(ctx, ["xpu-smi", "discovery", "-j"], parse_discovery_json)
    if isinstance(cards, Problem):
        return None, [cards]
    ids = [c.device_id for c in cards]
    detailed = [c.device_id for c in cards if needs_detail(c.observation)]
    calls: list[Callable[[], object]] = [partial(_dump, ctx, ids)]
    calls += [partial(_detail, ctx, device_id) for device_id in detailed]
    links = ctx.read_topology and len(cards) > 1
    calls += [partial(_topology, ctx)] if links else []
    outcomes = parallel(calls)
    problems = [o for o in outcomes if isinstance(o, Problem)]
    dump: Dump = outcomes[0] if isinstance(outcomes[0], dict) else {}
    details = {
        i: o
        for i, o in zip(detailed, outcomes[1 : 1 + len(detailed)], strict=True)
        if isinstance(o, XpuSmiDetail)
    }
    found = [_v1_card(c, dump.get(c.device_id, {}), details.get(c.device_id)) for c in cards]
    if links and isinstance(outcomes[-1], XpuTopology):
        found = _with_xe_links(cards, found, outcomes[-1])
    return found, problems


def _topology(ctx: ProbeContext) -> XpuTopology | Problem:
    """``xpu-smi topology -m``: the Xe Links between cards (Sysman fabric ports)."""
    argv = ["xpu-smi", "topology", "-m"]
    return _parsed(ctx, argv, parse_xpu_smi_topology, "xpu-smi topology -m")


def _with_xe_links(
    cards: list[XpuSmiCard], found: list[Observation], topology: XpuTopology
) -> list[Observation]:
    """Each card with its direct Xe Links, xpu-smi's device ids joined to PCI addresses."""
    bus = {c.device_id: o.pci_bus_id for c, o in zip(cards, found, strict=True)}
    links: dict[int, list[dict[str, object]]] = {}
    for (a, b), ports in topology.xe_link_ports().items():
        for one, other in ((a, b), (b, a)):
            if bus.get(other):
                link: dict[str, object] = {"kind": "xelink", "peer": bus[other], "count": ports}
                link["peer_type"] = "gpu"
                links.setdefault(one, []).append(link)
    return [
        replace(o, extra={**o.extra, "links": links[c.device_id]}) if c.device_id in links else o
        for c, o in zip(cards, found, strict=True)
    ]


def _parsed(
    ctx: ProbeContext, argv: list[str], parse: Callable[[str], T], failed_as: str = "xpu-smi"
) -> T | Problem:
    """:func:`parsed_run` of one xpu-smi call, every Intel GPU visible to it; a missing
    xpu-smi is a problem too (the 1.x fallback only runs where the tool was found)."""
    found = parsed_run(ctx, argv, parse, "xpu-smi", failed_as=failed_as, drop_env=SELECTION_VARS)
    return not_installed("xpu-smi") if found is None else found


def _dump(ctx: ProbeContext, ids: Collection[int]) -> Dump | Problem:
    metrics = ",".join(str(m) for m in DUMP_METRICS)
    argv = ["xpu-smi", "dump", "-d", ",".join(str(i) for i in ids), "-m", metrics, "-n", "1"]
    return _parsed(ctx, argv, parse_dump_csv, "xpu-smi dump")


def _detail(ctx: ProbeContext, device_id: int) -> XpuSmiDetail | Problem:
    argv = ["xpu-smi", "discovery", "-d", str(device_id), "-j"]
    return _parsed(ctx, argv, parse_discovery_detail_json, f"xpu-smi discovery -d {device_id}")


def _v1_card(
    card: XpuSmiCard, row: dict[int, float | None], detail: XpuSmiDetail | None
) -> Observation:
    """One 1.x card: identity from discovery, used/utilisation from dump, size from detail."""
    total = detail.memory_physical_bytes if detail else None
    used_mib = row.get(18)
    used = None if used_mib is None else round(used_mib * MIB)
    if used is None and detail and detail.memory_free_bytes is not None and total is not None:
        used = max(total - detail.memory_free_bytes, 0)
    extra = dict(card.observation.extra)
    memory_busy = percent(row.get(5))
    if memory_busy is not None:
        extra["memory_utilization_percent"] = memory_busy
    return replace(
        card.observation,
        memory_total_bytes=total,
        memory_used_bytes=used,
        utilization_percent=percent(row.get(0)),
        tiles=detail.tiles if detail else None,
        extra=extra,
    )
