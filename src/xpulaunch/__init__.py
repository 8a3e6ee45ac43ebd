"""xpulaunch: launch and supervise multi-GPU jobs and llama.cpp servers."""

from __future__ import annotations

__version__ = "0.1.0"
