"""layerprof: where the time of a PyTorch training step goes, module by module, forward and backward."""
from __future__ import annotations

from .benchmark import BenchmarkResult, benchmark
from .distributed import GatheredProfile, gather_profile, register_timed_comm_hook
from .io import load, loads, save
from .profile import Profile
from .profiler import LayerProf
from .metrics.formulas import register_flop_formula
from .metrics.module_formulas import register_module_flops
from .metrics.memory import MemoryMeter
from .metrics.params import ParamsMeter
from .metrics.shapes import ShapesMeter
from .records import CallTiming, ModuleRecord
from .render.compare import Comparison, compare
from .render.plot import plot_icicle, plot_sunburst, plot_top
from .render.table import Table
from .schedule import schedule

__version__ = "0.1.0"

__all__ = [
    "LayerProf", "Profile", "ModuleRecord", "CallTiming", "schedule", "benchmark", "BenchmarkResult",
    "Table", "Comparison", "compare", "load", "loads", "save", "register_flop_formula", "register_module_flops",
    "GatheredProfile", "gather_profile", "register_timed_comm_hook", "plot_sunburst", "plot_icicle", "plot_top",
    "ParamsMeter", "ShapesMeter", "MemoryMeter", "__version__",
]
