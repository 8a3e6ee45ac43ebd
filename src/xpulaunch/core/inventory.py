"""The inventory document ``xpulaunch.inventory/1`` (docs/CONTRACT.md, section 3): load, validate,
dump.

Pure: text or dicts in, :class:`~xpulaunch.model.Inventory` out. Every validation error names
the bad key as a path (``devices[1].memory_total_bytes``) and what would be valid.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Mapping  # also at run time: isinstance checks
from typing import TYPE_CHECKING

from xpulaunch.core.device_ids import normalize_bus_id
from xpulaunch.errors import InventoryError
from xpulaunch.model import Device, Inventory, MigDevice, Problem, Vendor

if TYPE_CHECKING:
    from typing import Any

SCHEMA = "xpulaunch.inventory/1"

# A device's keys are the model's fields (Device is the document's device); anything else a
# document holds for a device is kept in ``extra``.
_DEVICE_KEYS = tuple(f.name for f in dataclasses.fields(Device) if f.name != "extra")


# Bounds on what a document may hold: far above any machine, far below what would make
# parsing it a problem (an inventory of a node with 8 GPUs is a few kB).
MAX_DOCUMENT_CHARS = 4 * 1024 * 1024
MAX_TILES = 64
MAX_INDEX = 65535
# Identifiers end up in comma-separated visibility masks (CUDA_VISIBLE_DEVICES=GPU-..,GPU-..):
# a comma, a space or an "=" inside one would split it or change its meaning.
_IDENTIFIER = re.compile(r"[A-Za-z0-9_.:-]{1,128}")


def loads(text: str, *, source: str = "inventory") -> Inventory:
    """Parse an inventory document from JSON text."""
    if len(text) > MAX_DOCUMENT_CHARS:
        raise InventoryError(f"{source}: larger than {MAX_DOCUMENT_CHARS // 2**20} MiB")
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InventoryError(f"{source}: not JSON ({exc.msg} at line {exc.lineno})") from exc
    except RecursionError as exc:
        raise InventoryError(f"{source}: JSON nested too deeply") from exc
    except ValueError as exc:  # an integer of more than 4300 digits (int_max_str_digits)
        raise InventoryError(f"{source}: not valid JSON ({str(exc)[:80]})") from exc
    return from_dict(doc, source=source)


def from_dict(doc: object, *, source: str = "inventory") -> Inventory:
    """Validate a decoded document and build the inventory."""
    if not isinstance(doc, Mapping):
        raise InventoryError(f"{source}: the document must be a JSON object")
    schema = doc.get("schema")
    if schema != SCHEMA:
        raise InventoryError(f"{source}: 'schema' is {schema!r}; expected {SCHEMA!r}")
    raw_devices = doc.get("devices")
    if not isinstance(raw_devices, list):
        raise InventoryError(f"{source}: 'devices' must be a list")
    devices = tuple(_device(d, f"{source}: devices[{i}]") for i, d in enumerate(raw_devices))
    _check_unique(devices, source)
    problems = tuple(
        _problem(p, f"{source}: problems[{i}]")
        for i, p in enumerate(_list(doc.get("problems", []), f"{source}: problems"))
    )
    extra = {k: v for k, v in doc.items() if k not in ("schema", "devices", "problems")}
    return Inventory(devices=devices, problems=problems, extra=extra)


def to_dict(inventory: Inventory) -> dict[str, Any]:
    """The inventory as the contract's JSON document."""
    doc: dict[str, Any] = {"schema": SCHEMA, "devices": [_device_doc(d) for d in inventory.devices]}
    if inventory.problems:
        doc["problems"] = [
            {"source": p.source, "message": p.message, "device": p.device}
            for p in inventory.problems
        ]
    doc.update({k: v for k, v in inventory.extra.items() if k not in doc})
    return doc


def dumps(inventory: Inventory) -> str:
    return json.dumps(to_dict(inventory), indent=2)


def _device_doc(d: Device) -> dict[str, Any]:
    doc: dict[str, Any] = {key: getattr(d, key) for key in _DEVICE_KEYS}
    doc["vendor"] = d.vendor.value
    doc["mig_devices"] = [dataclasses.asdict(m) for m in d.mig_devices]
    doc.update({k: v for k, v in d.extra.items() if k not in doc})
    return doc


def _device(raw: object, where: str) -> Device:
    if not isinstance(raw, Mapping):
        raise InventoryError(f"{where}: must be an object")
    vendor_text = raw.get("vendor")
    try:
        vendor = Vendor(vendor_text)
    except ValueError:
        valid = ", ".join(v.value for v in Vendor)
        raise InventoryError(f"{where}.vendor: {vendor_text!r} is not one of {valid}") from None
    bus = _opt_str(raw, "pci_bus_id", where)
    normalized = None if bus is None else normalize_bus_id(bus)
    if bus is not None and normalized is None:
        raise InventoryError(
            f"{where}.pci_bus_id: {bus!r} is not a PCI address like '0000:29:00.0'"
        )
    return Device(
        vendor=vendor,
        index=_int(raw, "index", where, minimum=0, maximum=MAX_INDEX, required=True) or 0,
        name=_opt_str(raw, "name", where),
        pci_bus_id=normalized,
        uuid=_identifier(raw, "uuid", where),
        integrated=_bool(raw, "integrated", where),
        tiles=_int(raw, "tiles", where, minimum=1, maximum=MAX_TILES) or 1,
        memory_total_bytes=_int(raw, "memory_total_bytes", where, minimum=0),
        memory_used_bytes=_int(raw, "memory_used_bytes", where, minimum=0),
        utilization_percent=_percent(raw, "utilization_percent", where),
        mig_devices=tuple(
            _mig(m, f"{where}.mig_devices[{i}]")
            for i, m in enumerate(_list(raw.get("mig_devices", []), f"{where}.mig_devices"))
        ),
        extra={k: v for k, v in raw.items() if k not in _DEVICE_KEYS},
    )


def _mig(raw: object, where: str) -> MigDevice:
    if not isinstance(raw, Mapping):
        raise InventoryError(f"{where}: must be an object")
    uuid = _identifier(raw, "uuid", where)
    if not uuid or not uuid.startswith("MIG-"):
        raise InventoryError(f"{where}.uuid: {uuid!r} is not a MIG UUID like 'MIG-...'")
    return MigDevice(
        uuid=uuid,
        memory_total_bytes=_int(raw, "memory_total_bytes", where, minimum=0),
        memory_used_bytes=_int(raw, "memory_used_bytes", where, minimum=0),
    )


def _problem(raw: object, where: str) -> Problem:
    if isinstance(raw, str):
        return Problem(source="inventory", message=raw)
    if not isinstance(raw, Mapping):
        raise InventoryError(f"{where}: must be a string or an object")
    return Problem(
        source=_opt_str(raw, "source", where) or "inventory",
        message=_opt_str(raw, "message", where) or "",
        device=_opt_str(raw, "device", where),
    )


def _check_unique(devices: tuple[Device, ...], source: str) -> None:
    seen: dict[tuple[str, object], int] = {}
    for i, d in enumerate(devices):
        for key in (("index", (d.vendor, d.index)), ("pci_bus_id", d.pci_bus_id), ("uuid", d.uuid)):
            name, value = key
            if value is None:
                continue
            if (name, value) in seen:
                raise InventoryError(
                    f"{source}: devices[{i}].{name} repeats devices[{seen[(name, value)]}]"
                )
            seen[(name, value)] = i


def _list(value: object, where: str) -> list[object]:
    if not isinstance(value, list):
        raise InventoryError(f"{where}: must be a list")
    return value


def _opt_str(raw: Mapping[str, object], key: str, where: str) -> str | None:
    value = raw.get(key)
    if value is None or isinstance(value, str):
        return value
    raise InventoryError(f"{where}.{key}: must be a string or null, not {value!r}")


def _identifier(raw: Mapping[str, object], key: str, where: str) -> str | None:
    value = _opt_str(raw, key, where)
    if value is not None and not _IDENTIFIER.fullmatch(value):
        shown = value if len(value) <= 60 else value[:60] + "..."
        raise InventoryError(
            f"{where}.{key}: {shown!r} is not an identifier (1 to 128 letters, digits, and "
            "'-_.:'; a comma would split a visibility mask)"
        )
    return value


def _bool(raw: Mapping[str, object], key: str, where: str) -> bool:
    value = raw.get(key, False)
    if isinstance(value, bool):
        return value
    raise InventoryError(f"{where}.{key}: must be true or false, not {value!r}")


def _int(
    raw: Mapping[str, object],
    key: str,
    where: str,
    *,
    minimum: int,
    maximum: int = 2**63 - 1,
    required: bool = False,
) -> int | None:
    value = raw.get(key)
    if value is None and not required:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not minimum <= value <= maximum:
        need = "an integer" + (f" >= {minimum}" if minimum else "")
        need += f" and <= {maximum}" if maximum < 2**63 - 1 else ""
        shown = repr(value) if len(repr(value)) <= 40 else repr(value)[:40] + "..."
        raise InventoryError(f"{where}.{key}: must be {need}, not {shown}")
    return value


def _percent(raw: Mapping[str, object], key: str, where: str) -> float | None:
    value = raw.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 100:
        raise InventoryError(f"{where}.{key}: must be a number from 0 to 100 or null")
    return float(value)
