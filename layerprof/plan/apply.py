"""Wrapping chosen modules in non-reentrant ``torch.utils.checkpoint`` and taking the wrapping off again.

A wrapped module gets one instance attribute, ``forward``, that runs the class's forward (or the instance's own
``forward`` if it had one) under ``checkpoint(..., use_reentrant=False)`` with the RNG state preserved, so a
Dropout inside draws the same mask when recomputed. The module's hooks, parameters, buffers and ``__call__`` are
untouched; ``unwrap`` deletes the attribute (or puts back the instance's own one), leaving the module as it was.
Tensor keyword arguments are passed to checkpoint positionally, so that it holds them as saved inputs (what the
planner counts as kept) rather than in a closure.
"""
from __future__ import annotations

import functools
from typing import Any, Callable

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

__all__ = ["wrap", "unwrap", "is_wrapped"]

_MARK = "_layerprof_checkpointed"
_MISSING = object()


def _checkpointed(forward: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(forward)
    def run(*args: Any, **kwargs: Any) -> Any:
        if not torch.is_grad_enabled():
            return forward(*args, **kwargs)
        names = [key for key, value in kwargs.items() if isinstance(value, torch.Tensor)]
        rest = {key: value for key, value in kwargs.items() if key not in names}
        count = len(args)

        def body(*flat: Any) -> Any:
            return forward(*flat[:count], **rest, **dict(zip(names, flat[count:])))

        return checkpoint(body, *args, *(kwargs[key] for key in names), use_reentrant=False,
                          preserve_rng_state=True)

    setattr(run, _MARK, True)
    return run


def is_wrapped(module: nn.Module) -> bool:
    """Whether ``module.forward`` is a checkpoint wrapper put there by ``wrap``."""
    return getattr(module.__dict__.get("forward"), _MARK, False)


def wrap(module: nn.Module) -> Any:
    """Wrap ``module``'s forward; returns what ``unwrap`` needs to restore it (the instance's own forward or a
    marker that it had none)."""
    own = module.__dict__.get("forward", _MISSING)
    module.forward = _checkpointed(module.forward)  # type: ignore[method-assign]
    return own


def unwrap(module: nn.Module, own: Any) -> None:
    """Undo ``wrap``: delete the wrapper, or put back the instance's own forward that it replaced."""
    if own is _MISSING:
        module.__dict__.pop("forward", None)
    else:
        module.forward = own  # type: ignore[method-assign]
