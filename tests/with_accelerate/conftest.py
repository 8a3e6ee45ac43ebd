"""Makes accelerate_configs next to this file importable (pytest's pythonpath is tests/)."""

from __future__ import annotations

import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)
