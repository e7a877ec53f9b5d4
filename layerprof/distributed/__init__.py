"""Profiles of a torch.distributed job: each rank's profile gathered on one rank (``gather``), statistics across
ranks and stragglers (``crossrank``), their table (``table``), and the ``ddp_comm`` meter timing DDP's gradient
communication (``comm``). Importing layerprof imports this package, so ``metrics=("ddp_comm",)`` is always
available."""
from __future__ import annotations

from .comm import CommMeter, register_timed_comm_hook
from .gather import GatheredProfile, gather_profile

__all__ = ["CommMeter", "GatheredProfile", "gather_profile", "register_timed_comm_hook"]
