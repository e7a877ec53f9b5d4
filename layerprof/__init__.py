"""layerprof: where the time of a PyTorch training step goes, module by module, forward and backward."""
from __future__ import annotations

from .profile import Profile
from .profiler import LayerProf
from .records import CallTiming, ModuleRecord
from .render.plot import plot_icicle, plot_sunburst, plot_top

__version__ = "0.1.0"

__all__ = [
    "LayerProf", "Profile", "ModuleRecord", "CallTiming", "plot_sunburst", "plot_icicle", "plot_top", "__version__",
]
