"""The inventory document: validation names the bad key; dump/load round-trips."""

from __future__ import annotations

import contextlib
import json

import pytest
from hypothesis import given, strategies as st

from helpers import INVENTORIES, inventory_names, load_inventory
from xpulaunch.core import inventory as doc
from xpulaunch.errors import InventoryError, XpulaunchError
from xpulaunch.model import Vendor


@pytest.mark.parametrize("name", inventory_names())
def test_every_fixture_round_trips(name: str) -> None:
    inventory = load_inventory(name)
    again = doc.loads(doc.dumps(inventory))
    assert again == inventory
    assert json.loads(doc.dumps(inventory)) == json.loads((INVENTORIES / name).read_text())


def test_contract_example_loads() -> None:
    text = json.dumps(
        {
            "schema": "xpulaunch.inventory/1",
            "devices": [
                {
                    "vendor": "intel",
                    "index": 0,
                    "name": "Intel(R) Data Center GPU Max 1550",
                    "pci_bus_id": "0000:29:00.0",
                    "uuid": "00000000-0000-0029-0000-00000bd58086",
                    "integrated": False,
                    "tiles": 2,
                    "memory_total_bytes": 137438953472,
                    "memory_used_bytes": None,
                    "utilization_percent": None,
                    "mig_devices": [],
                    "driver_version": "1.3.29735",
                }
            ],
            "problems": ["xpu-smi not found"],
        }
    )
    inventory = doc.loads(text)
    (device,) = inventory.devices
    assert device.vendor is Vendor.INTEL and device.tiles == 2
    assert device.memory_used_bytes is None and device.memory_free_bytes is None
    assert device.extra == {"driver_version": "1.3.29735"}
    assert inventory.problems[0].message == "xpu-smi not found"
    assert doc.to_dict(inventory)["devices"][0]["driver_version"] == "1.3.29735"


def test_bus_ids_are_normalised() -> None:
    inventory = doc.from_dict(
        {
            "schema": "xpulaunch.inventory/1",
            "devices": [{"vendor": "nvidia", "index": 0, "pci_bus_id": "00000000:1A:00.0"}],
        }
    )
    assert inventory.devices[0].pci_bus_id == "0000:1a:00.0"


@pytest.mark.parametrize(
    ("document", "message"),
    [
        ([], "must be a JSON object"),
        ({"schema": "x", "devices": []}, "'schema' is 'x'"),
        ({"schema": doc.SCHEMA}, "'devices' must be a list"),
        ({"schema": doc.SCHEMA, "devices": [1]}, "devices[0]: must be an object"),
        (
            {"schema": doc.SCHEMA, "devices": [{"vendor": "matrox", "index": 0}]},
            "devices[0].vendor: 'matrox' is not one of nvidia, intel, amd",
        ),
        ({"schema": doc.SCHEMA, "devices": [{"vendor": "amd"}]}, "devices[0].index: must be"),
        ({"schema": doc.SCHEMA, "devices": [{"vendor": "amd", "index": -1}]}, "index"),
        (
            {"schema": doc.SCHEMA, "devices": [{"vendor": "amd", "index": 0, "tiles": 0}]},
            "devices[0].tiles: must be an integer >= 1",
        ),
        (
            {
                "schema": doc.SCHEMA,
                "devices": [{"vendor": "amd", "index": 0, "memory_total_bytes": "8G"}],
            },
            "devices[0].memory_total_bytes",
        ),
        (
            {
                "schema": doc.SCHEMA,
                "devices": [{"vendor": "amd", "index": 0, "utilization_percent": 120}],
            },
            "devices[0].utilization_percent",
        ),
        (
            {
                "schema": doc.SCHEMA,
                "devices": [{"vendor": "amd", "index": 0, "pci_bus_id": "slot 3"}],
            },
            "devices[0].pci_bus_id: 'slot 3' is not a PCI address",
        ),
        (
            {
                "schema": doc.SCHEMA,
                "devices": [{"vendor": "nvidia", "index": 0, "mig_devices": [{"uuid": "GPU-1"}]}],
            },
            "devices[0].mig_devices[0].uuid",
        ),
        (
            {
                "schema": doc.SCHEMA,
                "devices": [{"vendor": "nvidia", "index": 0}, {"vendor": "nvidia", "index": 0}],
            },
            "devices[1].index repeats devices[0]",
        ),
        (
            {
                "schema": doc.SCHEMA,
                "devices": [{"vendor": "nvidia", "index": 0, "integrated": "no"}],
            },
            "devices[0].integrated: must be true or false",
        ),
    ],
)
def test_invalid_documents_name_the_bad_key(document: object, message: str) -> None:
    with pytest.raises(InventoryError) as err:
        doc.from_dict(document, source="inv.json")
    assert message in str(err.value)
    assert str(err.value).startswith("inv.json")
    assert "\n" not in str(err.value)


def test_not_json() -> None:
    with pytest.raises(InventoryError, match="not JSON"):
        doc.loads("{", source="x.json")


_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=20,
)
_device = st.fixed_dictionaries(
    {"vendor": st.sampled_from(["nvidia", "intel", "amd", "x"]), "index": st.integers(-1, 3)},
    optional={
        "tiles": _json,
        "pci_bus_id": st.text(max_size=14) | st.none(),
        "memory_total_bytes": _json,
        "memory_used_bytes": _json,
        "utilization_percent": _json,
        "mig_devices": _json,
        "uuid": _json,
        "integrated": _json,
    },
)


@given(st.fixed_dictionaries({"schema": st.just(doc.SCHEMA), "devices": st.lists(_device)}))
def test_fuzzed_documents_fail_only_with_our_error(document: dict[str, object]) -> None:
    try:
        inventory = doc.from_dict(document)
    except XpulaunchError:
        return
    assert doc.from_dict(doc.to_dict(inventory)) == inventory


@given(st.text())
def test_fuzzed_text_fails_only_with_our_error(text: str) -> None:
    with contextlib.suppress(XpulaunchError):
        doc.loads(text)
