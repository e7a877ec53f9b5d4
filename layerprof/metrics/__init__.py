"""Metrics beside time: meters (parameters, shapes, memory, FLOPs) and the FLOP formulas they price ops with.

A meter declares the record fields it fills in the field catalogue (``record.fields``) and writes numbers onto
records; it never renders. ``meter.py`` holds the base class and the registry; importing this package
registers the built-in meters, in the order their fields appear in a row.
"""
from __future__ import annotations

from . import params, shapes, memory, live_bytes, flops, roofline  # noqa: F401  (register the built-in meters and fields)
from . import vision_formulas  # noqa: F401  (register the FLOP formulas of torchvision's ops)
from . import quantized_formulas  # noqa: F401  (and those of statically quantized layers)
from .meter import DEFAULT_METRICS, METERS, Meter, make_meters, measures, register_meter

__all__ = ["Meter", "METERS", "register_meter", "make_meters", "DEFAULT_METRICS", "measures"]
