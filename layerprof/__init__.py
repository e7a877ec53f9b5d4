"""layerprof: where the time of a PyTorch training step goes, module by module, forward and backward.

The package is layered, dependencies pointing one way: ``collect`` (the profiler and its hooks) fills
``record`` (the record tree, numbers only), which ``render`` reads; ``metrics`` are meters that collection runs
and that declare their record fields; ``distributed`` and ``cli`` sit on top. ``profile.Profile`` joins records
to their renderers; ``_torch`` holds every private torch API.
"""
from __future__ import annotations

from ._version import __version__, check_torch
from ._interrupt import quiet_interrupt

# Importing torch and the package takes seconds: a Ctrl-C then ends the layerprof command quietly (exit 130).
with quiet_interrupt():
    import torch
    check_torch(getattr(torch, "__version__", ""))  # an older torch: ImportError before any private API is used
    from .benchmark import BenchmarkResult, benchmark
    from .collect import LayerProf, schedule
    from .distributed import CommMeter, GatheredProfile, gather_profile, register_timed_comm_hook
    from .metrics import Meter, register_meter
    from .metrics.bytes import register_bytes_formula
    from .metrics.formulas import register_flop_formula
    from .metrics.peaks import peaks
    from .metrics.module_formulas import register_module_flops
    from .metrics.flops import FlopMeter
    from .metrics.memory import MemoryMeter
    from .metrics.params import ParamsMeter
    from .metrics.shapes import ShapesMeter
    from .plan.plan import CheckpointPlan
    from .plan.verify import Verification, verify_plan
    from .profile import Profile, compare, gather_saved, load, loads, save
    from .record import CallTiming, ModuleRecord
    from .render.compare import Comparison
    from .render.plot import plot_icicle, plot_sunburst, plot_top
    from .render.plot_roofline import plot_roofline
    from .render.table import Table

__all__ = [
    "LayerProf", "Profile", "ModuleRecord", "CallTiming", "schedule", "benchmark", "BenchmarkResult",
    "Table", "Comparison", "compare", "load", "loads", "save", "CheckpointPlan", "verify_plan", "Verification",
    "Meter", "register_meter", "register_flop_formula", "register_bytes_formula", "register_module_flops", "peaks",
    "ParamsMeter", "ShapesMeter", "MemoryMeter", "FlopMeter", "CommMeter",
    "GatheredProfile", "gather_profile", "gather_saved", "register_timed_comm_hook", "plot_sunburst", "plot_icicle",
    "plot_top", "plot_roofline",
    "__version__",
]
