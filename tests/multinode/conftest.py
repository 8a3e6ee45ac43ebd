"""The ``nodes`` fixture: xpulaunch processes that never outlive a test."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from node_helpers import Nodes


@pytest.fixture
def nodes(tmp_path: Path) -> Iterator[Nodes]:
    started = Nodes(tmp_path)
    yield started
    started.stop_all()
