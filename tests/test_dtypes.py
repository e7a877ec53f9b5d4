"""Models and steps in the dtypes users meet: float64, float16 and bfloat16 parameters, autocast on the CPU, complex
weights, float8 storage, integer and bool inputs, dynamically quantized Linears; their FLOPs, bytes, parameters and
comparisons."""
from __future__ import annotations

import warnings

import torch
from torch import nn

from layerprof import LayerProf, compare

torch.set_num_threads(1)


def _mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 8))


def _profile(model: nn.Module, x: torch.Tensor, autocast: torch.dtype | None = None, steps: int = 2,
             metrics: tuple[str, ...] = ("flops", "params")) -> LayerProf:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with LayerProf(model, metrics=metrics) as prof:
            for _ in range(steps):
                with torch.autocast("cpu", dtype=autocast or torch.bfloat16, enabled=autocast is not None):
                    out = model(x)
                out.float().sum().backward()
                prof.step()
    return prof


def test_a_comparison_says_when_one_step_ran_under_autocast() -> None:
    # A float32 model profiled plainly and under bf16 autocast: the parameters' dtype is float32 in both, so the
    # comparison said nothing of the step computing its matrix products in bfloat16, and a gate
    # (compare --fail-if-slower) judged the change in time as the code's.
    x = torch.randn(4, 16)
    plain, amp = _profile(_mlp(), x), _profile(_mlp(), x, autocast=torch.bfloat16)
    assert plain.tree.flops_forward == amp.tree.flops_forward == 2 * 4 * 16 * 32 + 2 * 4 * 32 * 8  # 6,144
    text = str(compare(plain, amp))
    assert ("Measured otherwise: a ran without torch.autocast and b under torch.autocast (bfloat16): the times "
            "compare that too.") in text
    assert "Measured otherwise" not in str(compare(plain, _profile(_mlp(), x)))
    half = str(compare(amp, _profile(_mlp(), x, autocast=torch.float16)))
    assert "a ran under torch.autocast (bfloat16) and b under torch.autocast (float16)" in half
