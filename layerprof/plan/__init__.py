"""The checkpoint planner: which modules to recompute to fit a memory budget, applied and verified."""
from __future__ import annotations

__all__: list[str] = []
