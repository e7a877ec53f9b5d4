"""Models and steps in the dtypes users meet: float64, float16 and bfloat16 parameters, autocast on the CPU, complex
weights, float8 storage, integer and bool inputs, dynamically quantized Linears; their FLOPs, bytes, parameters and
comparisons."""
from __future__ import annotations

import warnings

import torch
from torch import nn

from layerprof import LayerProf, compare
from layerprof.cli import main

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


def _profile_forward(model: nn.Module, x: torch.Tensor) -> tuple[LayerProf, torch.Tensor]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (torch.ao.quantization's deprecation, the one-step note)
        with LayerProf(model, metrics=("flops", "params")) as prof:
            out = model(x)
    return prof, out


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


def test_the_gate_refuses_steps_under_another_autocast_and_says_what_to_make_alike(tmp_path, capsys) -> None:
    x = torch.randn(4, 16)
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    _profile(_mlp(), x).to_json(a)
    _profile(_mlp(), x, autocast=torch.bfloat16).to_json(b)
    assert main(["compare", str(a), str(b), "--fail-if-slower", "10"]) == 4
    err = capsys.readouterr().err
    assert "(A ran without torch.autocast and B under torch.autocast (bfloat16))" in err
    assert ("profile both with the same --device, --dtype, --threads and --autocast (or none; in a script, the same "
            "torch.autocast)") in err


def _quantized(dtype: torch.dtype) -> nn.Module:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (torch.ao.quantization warns that it is deprecated)
        return torch.ao.quantization.quantize_dynamic(_mlp(), {nn.Linear}, dtype=dtype)


def test_dynamically_quantized_linears_count_their_packed_weights_and_read_them() -> None:
    # quantize_dynamic packs each Linear's weight and bias into a torch.ScriptObject, no parameter or buffer: the
    # quantized model read "Params: 0 | Size: 0 B", and each Linear's bytes read only its input and output.
    model, x = _quantized(torch.qint8), torch.randn(4, 16)
    expected = model(x)
    prof, out = _profile_forward(model, x)
    assert torch.equal(out, expected)
    first, second, root = prof.records["0"], prof.records["2"], prof.tree
    assert first.params == 16 * 32 + 32 and second.params == 32 * 8 + 8 and root.params == 808
    assert root.trainable_params == 0  # (no optimizer sees them: not in parameters())
    assert root.param_dtypes == {"qint8": 16 * 32 + 32 * 8, "float32": 32 + 8}
    assert first.param_bytes == 16 * 32 * 1 + 32 * 4 and root.param_bytes == 768 + 40 * 4  # 928
    assert prof.records["0._packed_params"].own_params == 544
    assert root.flops_forward == 2 * 4 * 16 * 32 + 2 * 4 * 32 * 8  # 6,144
    # x [4, 16] float32 256 + int8 weight [16, 32] 512 + float32 bias 128 read, out [4, 32] float32 512 written
    assert first.bytes_forward == 256 + 512 + 128 + 512


def test_a_float16_dynamically_quantized_linear_counts_its_weights_in_float16() -> None:
    # dtype=torch.float16 stores the weights in float16 (they unpack to float32); biases stay float32.
    model, x = _quantized(torch.float16), torch.randn(4, 16)
    prof, _ = _profile_forward(model, x)
    assert prof.tree.param_dtypes == {"float16": 768, "float32": 40}
    assert prof.tree.param_bytes == 768 * 2 + 40 * 4  # 1,696
    # x 256 + float16 weight [16, 32] 1,024 + bias 128 read, out 512 written
    assert prof.records["0"].bytes_forward == 256 + 1024 + 128 + 512


class _Quantizable(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.quant, self.dequant = torch.ao.quantization.QuantStub(), torch.ao.quantization.DeQuantStub()
        self.conv, self.relu = nn.Conv2d(3, 8, 3), nn.ReLU()
        self.up = nn.ConvTranspose2d(8, 4, 2, stride=2)
        self.fc = nn.Linear(4 * 12 * 12, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.up(self.relu(self.conv(self.quant(x))))
        return self.dequant(self.fc(x.flatten(1)))


def test_a_statically_quantized_model_counts_the_flops_of_its_float_form() -> None:
    # quantized::conv2d, quantized::conv_transpose2d and quantized::linear (and aten.quantize_per_tensor,
    # aten.dequantize) had no formula: the int8 model counted 0 FLOPs, listing 5 unknown ops.
    torch.manual_seed(0)
    model, x = _Quantizable().eval(), torch.randn(2, 3, 8, 8)
    float_prof, _ = _profile_forward(model, x)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model.qconfig = torch.ao.quantization.get_default_qconfig("fbgemm")
        model.up.qconfig = torch.ao.quantization.default_qconfig  # (per-tensor weights: a transposed convolution's)
        prepared = torch.ao.quantization.prepare(model)
        prepared(x)
        quantized = torch.ao.quantization.convert(prepared)
    expected = quantized(x)
    prof, out = _profile_forward(quantized, x)
    assert torch.equal(out, expected) and prof.unknown_ops() == {}
    conv = 2 * (2 * 8 * 6 * 6) * (3 * 3 * 3)  # out [2, 8, 6, 6], 27 MACs each: 31,104
    up = 2 * (2 * 8 * 6 * 6) * (4 * 2 * 2)  # each input element meets c_out * 2 * 2 weights: 18,432
    fc = 2 * 2 * 576 * 4  # 9,216
    flops = {name: prof.records[name].flops_forward for name in ("conv", "up", "fc")}
    assert flops == {"conv": conv, "up": up, "fc": fc}
    assert prof.tree.flops_forward == float_prof.tree.flops_forward == conv + up + fc
    # qint8 weights and float32 biases, packed: conv 216 + 8, up 128 + 4, fc 2,304 + 4
    assert prof.tree.param_dtypes == {"qint8": 216 + 128 + 2304, "float32": 8 + 4 + 4}


def test_a_complex_convolution_counts_the_three_real_ones_torch_runs() -> None:
    # The convention (docs/flops.md): a complex product counts 4 real MACs per complex one; torch runs a complex
    # convolution as 3 real ones (Gauss's trick), counted as they ran, as FlopCounterMode counts them.
    torch.manual_seed(0)
    model = nn.Conv1d(2, 4, 3, bias=False, dtype=torch.cfloat)
    x = torch.randn(1, 2, 10, dtype=torch.cfloat)
    prof, _ = _profile_forward(model, x)
    assert prof.tree.flops_forward == 3 * 2 * (1 * 4 * 8) * (2 * 3)  # out [1, 4, 8], 6 MACs each, 3 times: 1,152
    assert prof.tree.param_bytes == 4 * 2 * 3 * 8  # complex64: 8 bytes an element
    assert prof.tree.param_dtypes == {"complex64": 24}
