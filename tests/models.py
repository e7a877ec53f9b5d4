"""Small models with the awkward features real models have."""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint


# The end of torch's LayerNorm extra_repr after "elementwise_affine=True": its bias in torch 2.14, nothing in
# torch 2.11 (whose norms do not show it). Torch's text: a test of layerprof's reads the rest.
LAYER_NORM_BIAS = ", bias=True" if "bias=" in nn.LayerNorm(1).extra_repr() else ""


class MLP(nn.Module):
    def __init__(self, width: int = 16) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(8, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU())
        self.head = nn.Linear(width, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(x))


class SharedLoop(nn.Module):
    """One Linear called three times (weight sharing / a loop), plus a module used from a sibling's forward."""

    def __init__(self) -> None:
        super().__init__()
        self.cell = nn.Linear(8, 8)
        self.act = nn.Tanh()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for _ in range(3):
            x = self.act(self.cell(x))
        return x


@dataclass
class Output:
    logits: torch.Tensor
    hidden: torch.Tensor


class KwargsDataclass(nn.Module):
    """Takes its tensor as a keyword argument and returns a dataclass."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(8, 8)
        self.out = nn.Linear(8, 2)

    def forward(self, *, features: torch.Tensor) -> Output:
        hidden = self.proj(features)
        return Output(logits=self.out(hidden), hidden=hidden)


class DictOut(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(8, 8)
        self.b = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"a": self.a(x), "b": self.b(x)}


class Residual(nn.Module):
    """In-place ops right after hooked modules, as in torchvision's BasicBlock."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.relu = nn.ReLU(inplace=True)
        self.fc2 = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x
        out = self.relu(self.fc(x))
        out = self.fc2(out)
        out += identity
        return self.relu(out)


class UnusedBranch(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.used = nn.Linear(8, 1)
        self.unused = nn.Linear(8, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.unused(x)
        return self.used(x)


class Boom(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.ok = nn.Linear(8, 8)
        self.bad = nn.Linear(3, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.bad(self.ok(x))  # shape mismatch raises inside 'bad'


class CheckpointedBody(nn.Module):
    """A body run under non-reentrant checkpoint (recomputed in backward), then a head."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 8))
        self.head = nn.Linear(8, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(checkpoint(self.body, x, use_reentrant=False))


def scalar_loss(output: Any) -> torch.Tensor:
    """A scalar to backpropagate from any model's output: a tensor, an output with ``loss``, or a tuple."""
    if isinstance(output, torch.Tensor):
        return output.float().pow(2).mean()
    if getattr(output, "loss", None) is not None:
        return output.loss
    return output[0].float().pow(2).mean()


class SleepsInBackward(torch.autograd.Function):
    """Identity whose backward sleeps ``seconds``: a pass that runs it, timed, shows at least the sleep."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, seconds: float) -> torch.Tensor:
        ctx.seconds = seconds
        return x.clone()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        time.sleep(ctx.seconds)
        return grad, None
