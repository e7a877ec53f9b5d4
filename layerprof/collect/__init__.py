"""Collection: the profiler (``LayerProf``), the hooks it puts on a model (``tracker``), the clocks that stamp
boundaries, the step schedule, and turning stamps into per-step times and statistics over steps.

Collection fills records (``layerprof.record``) and never renders them.
"""
from __future__ import annotations

from .profiler import LayerProf
from .schedule import Action, Schedule, schedule

__all__ = ["LayerProf", "Action", "Schedule", "schedule"]
