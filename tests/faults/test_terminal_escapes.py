"""Device names reach tables with their escape sequences shown, not acted on; worker output
is passed on as written (it is the user's own program talking to their terminal)."""

from __future__ import annotations

import json
from pathlib import Path

from fault_cli import Launch, finish

EVIL = "NVIDIA H100\x1b]0;owned\x07\x1b[2J\x9b31m"


def inventory(tmp_path: Path) -> str:
    path = tmp_path / "inventory.json"
    device = {"vendor": "nvidia", "index": 0, "name": EVIL, "pci_bus_id": "0000:01:00.0"}
    path.write_text(json.dumps({"schema": "xpulaunch.inventory/1", "devices": [device]}))
    return str(path)


def test_device_tables_and_plans_show_escapes_instead_of_sending_them(
    launch: Launch, tmp_path: Path
) -> None:
    for args in (
        ["devices", "--inventory", inventory(tmp_path)],
        ["run", "--dry-run", "--inventory", inventory(tmp_path), "true"],
    ):
        code, out, err = finish(launch(*args))
        assert code == 0, err
        assert "NVIDIA H100" in out
        assert "\x1b" not in out and "\x07" not in out and "\x9b" not in out
        assert "\\x1b]0;owned" in out


def test_worker_output_stays_raw(launch: Launch) -> None:
    code, out, err = finish(launch("run", "printf", "\\033[1mbold\\033[0m\\n"))
    assert code == 0, err
    assert "\x1b[1mbold\x1b[0m" in out
