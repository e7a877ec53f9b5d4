"""Modules that no step saw called, yet whose parameters hold gradients, in a process where torch.compile has
compiled something: a ``torch.compile``'d function inside a forward that calls submodules (compiling a region) ran
them. Its compiled graph calls no module hook, so those modules read "not run" and their time is in their caller's.
Read as a block ends, only where dynamo compiled a graph in this process and some module was not seen (``ran`` has
fewer names than the block has modules). A parameter tied to one of a module seen to run (T5's ``shared``
embedding is its encoder's ``embed_tokens``) is no evidence. Without a compiled graph a module's parameters are
read uncalled by eager code alone (``nn.MultiheadAttention`` reads its ``out_proj``'s weight, a ``ParameterList``
is never called), which says nothing wrong."""
from __future__ import annotations

from typing import Any, Collection, Iterable

from torch import nn

__all__ = ["ran_unseen", "unseen_message"]


def _callable(module: Any) -> bool:
    """Whether the module has a forward of its own (a ParameterList or ModuleList has none: never called), and is
    not one whose parameters torch reads without calling it (``nn.MultiheadAttention``'s ``out_proj``)."""
    kind = type(module)
    return (getattr(kind, "forward", None) is not getattr(nn.Module, "forward", None)
            and kind.__name__ != "NonDynamicallyQuantizableLinear")


def _has_gradient(module: Any, shared: Collection[int]) -> bool:
    """Whether a parameter of the module's own holds a gradient that is not all zeros (``zero_grad`` without
    ``set_to_none`` leaves zeros on modules that did not run), and is not one a module seen to run holds too (ids in
    ``shared``): a tied weight, such as T5's ``shared`` embedding, which its encoder's ``embed_tokens`` calls."""
    for parameter in module._parameters.values():
        grad = None if parameter is None or id(parameter) in shared else parameter.grad
        if grad is None or grad.is_meta:
            continue
        try:
            if grad.is_sparse or bool(grad.any()):
                return True
        except RuntimeError:  # a tensor subclass that cannot answer: not taken as evidence
            continue
    return False


def ran_unseen(entries: Iterable[tuple[str, Any]], ran: Collection[str]) -> list[str]:
    """Of the block's modules (``entries``, qualified name and module, parents first), the outermost ones not in
    ``ran`` (the names seen called in a recorded step) under which some module holds a gradient of its own."""
    entries = list(entries)
    shared = {id(parameter) for name, module in entries if name in ran for parameter in module._parameters.values()}
    found: list[str] = []
    for name, module in entries:
        if name in ran or not _callable(module) or not _has_gradient(module, shared):
            continue
        outermost = name  # up to the outermost ancestor not seen either (a Sequential whose layers hold weights)
        parts = name.split(".")
        for end in range(len(parts) - 1, 0, -1):
            prefix = ".".join(parts[:end])
            if prefix in ran:
                break
            outermost = prefix
        if outermost not in found:
            found.append(outermost)
    return found


def unseen_message(names: list[str]) -> str:
    shown = ", ".join(repr(name) for name in names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")
    return (f"{len(names)} module(s) were not seen to run, yet parameters in them hold gradients ({shown}), and "
            "torch.compile has compiled code in this process: a torch.compile'd function inside a forward that "
            "calls them runs them without module hooks (a compiled region). They read 'not run', and their time "
            "is in the module that called that function: profile with it eager and compile after profiling. "
            "(Gradients left from before the block, where they were not cleared, read the same.)")
