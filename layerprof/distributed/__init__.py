"""Profiles of a torch.distributed job: each rank's profile gathered on one rank (``gather``), statistics across
ranks and stragglers (``crossrank``), their table (``table``), the ``ddp_comm`` meter timing DDP's gradient
communication (``comm``) and the ``fsdp_comm`` meter that takes FSDP2's collectives out of module times and puts
them on their unit (``fsdp``). Importing layerprof imports this package, so both meters are always available."""
from __future__ import annotations

from .comm import CommMeter, register_timed_comm_hook
from .fsdp import FsdpCommMeter
from .gather import GatheredProfile, gather_profile

__all__ = ["CommMeter", "FsdpCommMeter", "GatheredProfile", "gather_profile", "register_timed_comm_hook"]
