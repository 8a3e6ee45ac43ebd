"""Test helpers shared by every test folder (importable as ``helpers``)."""

from __future__ import annotations

import json
from pathlib import Path

from xpulaunch.core import inventory as inventory_doc
from xpulaunch.model import Inventory

FIXTURES = Path(__file__).parent / "fixtures"
INVENTORIES = FIXTURES / "inventories"


def load_inventory(name: str) -> Inventory:
    return inventory_doc.loads((INVENTORIES / name).read_text(), source=name)


def inventory_path(name: str) -> Path:
    return INVENTORIES / name


def inventory_names() -> list[str]:
    return sorted(p.name for p in INVENTORIES.glob("*.json"))


def write_inventory(path: Path, devices: list[dict[str, object]]) -> Path:
    path.write_text(json.dumps({"schema": "xpulaunch.inventory/1", "devices": devices}))
    return path
