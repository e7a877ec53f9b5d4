"""Records: one ``ModuleRecord`` per module in an anytree tree that mirrors ``named_modules()``, numbers only,
and their saved form (``io``). Records know nothing of how they are collected or rendered."""
from __future__ import annotations

from .records import CallTiming, ModuleRecord, build_tree

__all__ = ["CallTiming", "ModuleRecord", "build_tree"]
