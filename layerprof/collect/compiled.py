"""Modules compiled in place: ``module.compile()``, or a ``forward`` that is a ``torch.compile``'d function.

Unlike ``torch.compile(module)`` (an ``OptimizedModule`` wrapper, refused in ``profiler.py``), these leave the
module itself in the model, so nothing in its type says it is compiled. From its next call on, dynamo traces the
module's call, layerprof's hooks included: the hooks break the graph into pieces and recompile, the modules inside
get no backward time, and the times around them are partial. So such a module is refused, by name, before any
hook is placed, and a profile during which a module was compiled is refused when it stops.
"""
from __future__ import annotations

import itertools
from operator import itemgetter
from typing import Any

from torch import nn

from .._torch import compiled_in_place, compiled_module_type

_second = itemgetter(1)

__all__ = ["RefusedModel", "compiled_while_profiling", "refuse_compiled_in_place", "refuse_compiled_wrapper"]


class RefusedModel(TypeError):
    """A model, or a module of it, that LayerProf cannot profile (TorchScript, torch.compile'd, compiled in place,
    not an nn.Module): a TypeError, told apart from a TypeError of a bug (the command line reports it as the
    spec's, a bug as layerprof's)."""


_WHAT_TO_DO = {
    "compile": "Profile the eager model: before calling .compile(), or an eager copy (copy.deepcopy(model) leaves "
               "the .compile() out); compile after profiling.",
    "forward": "Profile the model with its eager forward, and compile after profiling.",
}


def _describe(name: str, module: nn.Module, how: str, meanwhile: bool = False) -> str:
    """What was found; ``meanwhile``: it happened during the block (said in the past, as a change)."""
    shown = f"module '{name}'" if name else "the model"
    if how == "compile":
        return f"{shown} ({type(module).__name__}) was compiled in place with .compile()"
    verb = "became" if meanwhile else "is"
    return f"the forward of {shown} ({type(module).__name__}) {verb} a torch.compile'd function"


_CONSEQUENCE = (
    "dynamo traces its calls, layerprof's hooks included, so its modules would get partial times (no backward, "
    "graphs broken and recompiled at every hook) instead of the eager model's."
)


def refuse_compiled_in_place(paths: list[tuple[str, nn.Module]], modules: list[nn.Module] | None = None,
                             owns: list[dict[str, Any]] | None = None) -> None:
    """Raise a TypeError naming the first module compiled in place, before anything is hooked. ``modules``: those
    of ``paths``, and ``owns`` their ``__dict__``, where the caller has them."""
    found = compiled_in_place(paths, modules, owns)
    if found is not None:
        raise RefusedModel(f"LayerProf cannot profile a module compiled in place: {_describe(*found)}: "
                           f"{_CONSEQUENCE} {_WHAT_TO_DO[found[2]]}")


def compiled_while_profiling(paths: list[tuple[str, nn.Module]], modules: list[nn.Module] | None = None,
                             owns: list[dict[str, Any]] | None = None) -> str | None:
    """The error message for a module compiled while it was being profiled (in place, or put in the model as a
    ``torch.compile`` wrapper); None when there is none. ``modules``: those of ``paths``, and ``owns`` their
    ``__dict__``, where the caller has them."""
    if modules is None:
        modules = list(map(_second, paths))
    wrapper = compiled_module_type()
    if wrapper is not None and any(map(issubclass, set(map(type, modules)), itertools.repeat(wrapper))):
        for name, module in paths:
            if isinstance(module, wrapper):
                return (f"the profile is refused: module '{name}' became a torch.compile'd module while it was being "
                        f"profiled, and {_CONSEQUENCE} Profile the eager module, and compile after profiling.")
    found = compiled_in_place(paths, modules, owns)
    if found is None:
        return None
    return (f"the profile is refused: {_describe(*found, meanwhile=True)} while it was being profiled, and "
            f"{_CONSEQUENCE} " + _WHAT_TO_DO[found[2]])


def refuse_compiled_wrapper(wrapper: nn.Module, name: str) -> None:
    """Raise where ``wrapper``, called while profiling, is a ``torch.compile(module)`` of the profiled module
    ``name``, held apart from the model (``compiled = torch.compile(model)``, then ``compiled(x)`` in the block):
    before dynamo traces that call, which the block's call wrapper sees first."""
    optimized = compiled_module_type()
    if optimized is None or not isinstance(wrapper, optimized):
        return
    shown = f"module '{name}'" if name else "the model"
    what = "module" if name else "model"
    raise RuntimeError(
        f"the profile is refused: {shown} was called through torch.compile({what}), a compiled wrapper of it held "
        f"apart from it, and {_CONSEQUENCE} Call the {what} itself inside the block, and the compiled wrapper "
        "outside it."
    )
