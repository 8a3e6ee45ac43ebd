"""The queue box fixture (tests/queue_kit.py) for every test of this folder."""

from __future__ import annotations

from queue_kit import box

__all__ = ["box"]
