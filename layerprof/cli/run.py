"""The profiled loop: warm-up and measured steps of forward (and backward) on the model, with a progress bar."""
from __future__ import annotations

import contextlib
import sys
from typing import Any, Iterable, Iterator

import torch
from torch import nn

from .._tensors import iter_tensors
from ..profile import Profile
from ..collect.profiler import LayerProf
from .errors import RunError, one_line

__all__ = ["loss_of", "run_profile", "progress"]


def loss_of(output: Any) -> torch.Tensor:
    """What backward starts from: ``output.loss`` where the model computed one (Hugging Face models given
    labels), else the sum of every floating output tensor that requires grad, however the output nests them."""
    loss = getattr(output, "loss", None)
    if isinstance(loss, torch.Tensor) and loss.requires_grad:
        return loss
    parts = [t.sum().float() for t in iter_tensors(output) if t.is_floating_point() and t.requires_grad]
    if not parts:
        raise RunError(
            "the model's output holds no floating tensor that requires grad, so there is nothing to "
            "backpropagate: profile the forward pass only with --no-backward or --eval"
        )
    return torch.stack(parts).sum() if len(parts) > 1 else parts[0]


def _on_terminal() -> bool:
    return sys.stdout.isatty() and sys.stderr.isatty()


def progress(steps: Iterable[int], total: int, enabled: bool | None = None) -> Iterator[int]:
    """``steps`` under a tqdm bar on stderr when both stdout and stderr are terminals and tqdm is installed."""
    if enabled is None:
        enabled = _on_terminal()
    if enabled:
        try:
            from tqdm.auto import tqdm
        except ImportError:  # the bar is a nicety: pip install tqdm
            enabled = False
        else:
            return iter(tqdm(steps, total=total, desc="layerprof", unit="step", leave=False, file=sys.stderr))
    return iter(steps)


def run_profile(model: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], *, steps: int, warmup: int,
                backward: bool, inference: bool, metrics: list[str] | None, sync: bool = False,
                show_progress: bool | None = None) -> Profile:
    """Run ``warmup + steps`` steps under LayerProf, calling ``prof.step()`` between them; returns the Profile.

    ``inference``: ``model.eval()`` and ``torch.inference_mode()``, forward only. Otherwise the model trains:
    forward, and with ``backward`` the backward of ``loss_of(output)``, gradients cleared after each step.
    """
    model.train(not inference)
    total = warmup + steps
    grad_mode = torch.inference_mode() if inference else contextlib.nullcontext()
    prof = LayerProf(model, warmup=warmup, metrics=metrics, sync=sync)
    try:
        with grad_mode, prof:
            for step in progress(range(total), total, show_progress):
                output = model(*args, **kwargs)
                if backward and not inference:
                    loss_of(output).backward()
                    model.zero_grad(set_to_none=True)
                del output
                if step < total - 1:  # the `with` exit ends the last step
                    prof.step()
    except RunError:
        raise
    except Exception as exc:
        raise RunError(f"the model raised {one_line(exc)}") from exc
    return prof.profile
