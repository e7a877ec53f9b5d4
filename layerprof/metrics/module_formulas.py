"""Per-module-type FLOP overrides: one registry keyed by module class, filled by ``register_module_flops``.

An override replaces the aten-level count of a module's calls (and so the share it adds to its ancestors) by a
number the user computes, e.g. for a module whose kernel is opaque. It is called after each forward call with
the module and the shapes of its arguments and output (tensors replaced by ``torch.Size``, nesting kept) and
returns the call's forward FLOPs, or a pair ``(forward, backward)``. With a backward value, the aten ops that the
call's backward runs are not counted and the value is credited when that backward runs; with a forward value
only, the backward is counted op by op. Submodules of an overridden module keep their own aten-level counts.

>>> import torch
>>> @register_module_flops(torch.nn.Bilinear)
... def bilinear_flops(module, args, kwargs, out_shape):
...     '''x1: [n, i1], x2: [n, i2], weight: [o, i1, i2] -> one MAC per weight element per sample.'''
...     return 2 * args[0][0] * module.weight.numel()
>>> module_flops_formula(torch.nn.Bilinear(2, 3, 4)) is bilinear_flops
True
"""
from __future__ import annotations

from typing import Any, Callable, Union

from torch import nn

__all__ = ["MODULE_FLOPS", "register_module_flops", "module_flops_formula", "ModuleFlopFormula"]

ModuleFlopFormula = Callable[[nn.Module, Any, Any, Any], Union[int, "tuple[int, int | None]", None]]

MODULE_FLOPS: dict[type, ModuleFlopFormula] = {}


def register_module_flops(*module_types: type) -> Callable[[ModuleFlopFormula], ModuleFlopFormula]:
    """Decorator: count the calls of modules of these types (and their subclasses) with the decorated function."""
    if not module_types:
        raise TypeError("register_module_flops needs at least one module class, e.g. @register_module_flops(MyBlock)")
    for module_type in module_types:
        if not (isinstance(module_type, type) and issubclass(module_type, nn.Module)):
            raise TypeError(f"register_module_flops expects nn.Module subclasses, got {module_type!r}")

    def register(formula: ModuleFlopFormula) -> ModuleFlopFormula:
        for module_type in module_types:
            MODULE_FLOPS[module_type] = formula
        return formula

    return register


def module_flops_formula(module: nn.Module) -> ModuleFlopFormula | None:
    """The override for a module: its class's, else the nearest base class's, else None."""
    if not MODULE_FLOPS:
        return None
    for cls in type(module).__mro__:
        formula = MODULE_FLOPS.get(cls)
        if formula is not None:
            return formula
    return None
