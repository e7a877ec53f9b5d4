"""A second reading of full backward hooks, interrupts, quantized models and the autocast in comparisons: each
test is a problem found there."""
from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

import layerprof
from layerprof import LayerProf


def _mlp() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 8))


def test_an_interrupt_during_a_schedules_warm_up_says_the_steps_it_had() -> None:
    # Interrupted in step 3 of schedule(wait=1, warmup=2, active=3): three steps had completed, none recorded. The
    # message said "with no step completed (prof.step())" and, of an interrupt the user chose, "Fix the error".
    model, x = _mlp(), torch.randn(4, 16)
    with pytest.raises(KeyboardInterrupt):
        with LayerProf(model, schedule=layerprof.schedule(wait=1, warmup=2, active=3, repeat=1)) as prof:
            for _ in range(3):
                model(x).sum().backward()
                prof.step()
            raise KeyboardInterrupt
    with pytest.raises(RuntimeError) as caught:
        prof.profile
    message = str(caught.value)
    assert message.startswith(
        "no profile: the block raised KeyboardInterrupt in step 3, with no step recorded: steps 0 to 2 were all "
        "before the schedule's first recorded step, step 3, so nothing was recorded.")
    assert "no step completed" not in message and "Fix the error" not in message
