"""This machine as a profile's environment names it, and whether a profile's environment names another one.

Shared by the layers that ask: ``collect`` writes these facts into every profile; ``profile.py`` and
``record/roofs.py`` ask whether a saved profile came from another machine (its roofs, the checkpoint wrapper's
price). Both read host and CPU model here, once per process.
"""
from __future__ import annotations

import os
import platform
import socket
from functools import lru_cache
from typing import Any

import torch

__all__ = ["machine", "other_machine", "environment_in", "memory_in"]


@lru_cache(maxsize=1)
def machine() -> dict[str, Any]:
    """This machine as a profile's environment names it: host, OS, Python, CPU model, CPU count, torch (read once
    per process: ``platform.platform()`` and /proc/cpuinfo take milliseconds). Shared: do not change it."""
    return {
        "host": socket.gethostname(),
        "os": platform.platform(),
        "python": platform.python_version(),
        "cpu": _cpu_model(),
        "cpu_count": os.cpu_count(),
        "torch": torch.__version__,
    }


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def environment_in(meta: Any) -> dict[str, Any]:
    """The environment a profile's ``meta`` names: a dict, empty where it names none (or one written by hand that is
    not a dict)."""
    environment = meta.get("environment") if isinstance(meta, dict) else None
    return environment if isinstance(environment, dict) else {}


def memory_in(meta: Any) -> dict[str, Any]:
    """What the memory meter (``memory``, or ``live_memory``, which replaces it) kept in a profile's ``meta``: the
    step's facts (mode, dtype, autocast, peaks); empty where neither ran (or one written by hand is not a dict)."""
    memory = (meta.get("memory") or meta.get("live_memory")) if isinstance(meta, dict) else None
    return memory if isinstance(memory, dict) else {}


def other_machine(environment: Any) -> str | None:
    """Where a profile's environment names another machine than this one (another host, CPU model, or GPU for its
    device), that machine, in words; None where it is this one, or the profile does not say (no environment, or
    one written by hand that is not a dict)."""
    if not isinstance(environment, dict):
        return None
    here = machine()
    shown = []
    for key in ("host", "cpu"):
        theirs = environment.get(key)
        if theirs is not None and theirs != here.get(key):
            shown.append(f"{key} {theirs!r}")
    device, gpu = environment.get("device"), environment.get("gpu")
    if gpu is not None and isinstance(device, str) and device.startswith("cuda") and torch.cuda.is_available():
        try:
            mine = torch.cuda.get_device_name(torch.device(device))
        except (RuntimeError, AssertionError, ValueError):  # an index this machine does not have
            mine = None
        if gpu != mine:
            shown.append(f"gpu {gpu!r}")
    return ", ".join(shown) or None
