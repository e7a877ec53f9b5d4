"""layerprof: where the time of a PyTorch training step goes, module by module, forward and backward."""
from __future__ import annotations

from .benchmark import BenchmarkResult, benchmark
from .profile import Profile
from .profiler import LayerProf
from .records import CallTiming, ModuleRecord
from .schedule import schedule

__version__ = "0.1.0"

__all__ = ["LayerProf", "Profile", "schedule", "benchmark", "BenchmarkResult", "ModuleRecord", "CallTiming", "__version__"]
