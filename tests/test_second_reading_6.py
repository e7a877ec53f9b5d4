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


def _profiled(model: nn.Module, metrics: tuple[str, ...]) -> layerprof.Profile:
    x = torch.randn(4, 16)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with LayerProf(model, metrics=metrics) as prof:
            for _ in range(2):
                model(x).float().sum().backward()
                prof.step()
    return prof.profile


@pytest.mark.parametrize("meter", ["memory", "live_memory"])
def test_a_comparison_says_when_the_forward_entered_autocast_itself(meter: str) -> None:
    # accelerate's prepare_model (Trainer(bf16=True)) wraps the forward in autocast: the environment, read at the
    # root call's start, has no autocast_dtype, and the memory meter read "bfloat16" inside the forward; compare()
    # and the gate read only the environment, so a bf16 Trainer run against a float32 one said nothing. (The gate
    # then read the memory meter's meta only, not live_memory's, which replaces it.)
    plain = _profiled(_mlp(), (meter,))
    model = _mlp()
    model.forward = torch.autocast("cpu", dtype=torch.bfloat16)(model.forward)  # type: ignore[method-assign]
    amp = _profiled(model, (meter,))
    assert amp.meta[meter]["autocast"] == "bfloat16" and "autocast_dtype" not in amp.meta["environment"]
    assert ("Measured otherwise: a ran without torch.autocast and b under torch.autocast (bfloat16): the times "
            "compare that too.") in str(layerprof.compare(plain, amp))
    assert layerprof.render.gate.different_settings(plain, amp) == (
        "A ran without torch.autocast and B under torch.autocast (bfloat16)")
    assert "Measured otherwise" not in str(layerprof.compare(plain, _profiled(_mlp(), (meter,))))


class _Quantized(nn.Module):
    def __init__(self, conv: nn.Module) -> None:
        super().__init__()
        self.quant, self.dequant = torch.ao.quantization.QuantStub(), torch.ao.quantization.DeQuantStub()
        self.conv = conv

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dequant(self.conv(self.quant(x)))


@pytest.mark.parametrize("conv, shape, flops", [
    # out [2, 8, 4, 4], each output element 4 / 2 * 3 * 3 = 18 MACs
    (lambda: nn.Conv2d(4, 8, 3, stride=2, groups=2), (2, 4, 9, 9), 2 * 2 * 8 * 4 * 4 * 18),
    # each of the 2 * 4 * 5 * 5 input elements meets 8 / 2 * 3 * 3 = 36 weights
    (lambda: nn.ConvTranspose2d(4, 8, 3, stride=2, groups=2, padding=1, output_padding=1), (2, 4, 5, 5),
     2 * 2 * 4 * 5 * 5 * 36),
])
def test_quantized_convolutions_and_linears_count_with_the_float_formulas(conv, shape, flops) -> None:
    # quantized_formulas.py wrote out again the dynamically quantized Linear's formula (formulas.py) and the
    # convolution's count (conv_forward_flops): two copies of each to keep in step. The numbers stay.
    from layerprof.metrics import formulas, quantized_formulas
    assert quantized_formulas.quantized_linear_flops is formulas.dynamic_quantized_linear_flops
    torch.manual_seed(0)
    model, x = _Quantized(conv()).eval(), torch.randn(*shape)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model.qconfig = torch.ao.quantization.default_qconfig
        prepared = torch.ao.quantization.prepare(model)
        prepared(x)
        quantized = torch.ao.quantization.convert(prepared)
        with LayerProf(quantized, metrics=("flops",)) as prof:
            quantized(x)
    assert prof.records["conv"].flops_forward == flops and prof.unknown_ops() == {}
