"""layerprof: where the time of a PyTorch training step goes, module by module, forward and backward."""
from __future__ import annotations

from .profile import Profile
from .profiler import LayerProf
from .metrics.memory import MemoryMeter
from .metrics.params import ParamsMeter
from .metrics.shapes import ShapesMeter
from .records import CallTiming, ModuleRecord

__version__ = "0.1.0"

__all__ = [
    "LayerProf", "Profile", "ModuleRecord", "CallTiming", "ParamsMeter", "ShapesMeter", "MemoryMeter", "__version__",
]
