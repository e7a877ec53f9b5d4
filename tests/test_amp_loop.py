"""A real mixed-precision training loop, profiled as a script writes it: ``torch.autocast("cpu", bfloat16)`` around the
forward, ``torch.amp.GradScaler`` (scale, backward, unscale_, clip_grad_norm_, step, update, a step skipped on an
inf gradient), foreach and fused optimizers, ``zero_grad(set_to_none=False)``, channels_last, and the command
line's ``--autocast``. Outputs, gradients, the optimizer's state and the scaler's must be bitwise those of the same
loop without the profiler, and the model left as found."""
from __future__ import annotations

import json
import textwrap
import time
from pathlib import Path

import pytest
import torch
from torch import nn

from layerprof import LayerProf
from layerprof.cli import main

from .conftest import hook_state
from .invariants import check_truth

torchvision = pytest.importorskip("torchvision")

X = torch.randn(2, 3, 64, 64, generator=torch.Generator().manual_seed(1))
Y = torch.tensor([3, 7])


def _resnet(channels_last: bool = False) -> nn.Module:
    torch.manual_seed(0)
    model = torchvision.models.resnet18(weights=None, num_classes=10)
    return model.to(memory_format=torch.channels_last) if channels_last else model


def _amp_loop(optimizer: str, profiled: bool) -> dict:
    """Three GradScaler steps of ResNet-18 under bf16 autocast after one warm-up step; the second step's first
    gradient is made inf after backward, so the scaler skips that step and halves its scale."""
    model = _resnet()
    options = {"foreach": {"foreach": True}, "fused": {"fused": True}, "for-loop": {"foreach": False}}[optimizer]
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, **options)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 8)
    outputs, found_inf, backward_ms = [], [], [0.0]

    def step(poison: bool = False) -> None:
        opt.zero_grad(set_to_none=False)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = model(X)
            loss = nn.functional.cross_entropy(out, Y)
        start = time.perf_counter()
        scaler.scale(loss).backward()
        backward_ms[0] += (time.perf_counter() - start) * 1e3
        if poison:
            grad = model.conv1.weight.grad
            grad[(0,) * grad.dim()] = float("inf")
        scaler.unscale_(opt)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        found_inf.append(sum(v.item() for v in scaler._found_inf_per_device(opt).values()))
        scaler.step(opt)
        scaler.update()
        outputs.append((out, loss))

    step()
    before, opt_attributes = hook_state(model), set(vars(opt))
    state_keys = list(model.state_dict())
    backward_ms[0] = 0.0
    prof = None
    if profiled:
        with LayerProf(model, metrics=("params", "flops", "shapes", "memory")) as prof:
            for index in range(3):
                step(poison=index == 1)
                prof.step()
    else:
        for index in range(3):
            step(poison=index == 1)
    assert hook_state(model) == before and set(vars(opt)) == opt_attributes
    assert list(model.state_dict()) == state_keys and list(opt.state_dict()) == ["state", "param_groups"]
    return {"model": model, "opt": opt, "scaler": scaler.state_dict(), "outputs": outputs, "found_inf": found_inf,
            "prof": prof, "backward_ms": backward_ms[0]}


@pytest.mark.parametrize("optimizer", ["foreach", "fused", "for-loop"])
def test_grad_scaler_loop_is_bitwise_unchanged_and_fully_timed(optimizer: str) -> None:
    plain, profiled = _amp_loop(optimizer, False), _amp_loop(optimizer, True)
    # The skipped step: found_inf 1 in the second step only, the scale halved once (256 -> 128), on both runs.
    assert plain["found_inf"] == profiled["found_inf"] == [0.0, 0.0, 1.0, 0.0]
    assert plain["scaler"] == profiled["scaler"] and profiled["scaler"]["scale"] == 128.0
    for (out_a, loss_a), (out_b, loss_b) in zip(plain["outputs"], profiled["outputs"]):
        assert out_b.dtype == torch.bfloat16 and torch.equal(out_a, out_b) and torch.equal(loss_a, loss_b)
    for a, b in zip(plain["model"].parameters(), profiled["model"].parameters()):
        assert torch.equal(a, b) and torch.equal(a.grad, b.grad)
    state_a, state_b = plain["opt"].state_dict()["state"], profiled["opt"].state_dict()["state"]
    assert list(state_a) == list(state_b)
    for index, fields in state_a.items():
        assert all(torch.equal(value, state_b[index][key]) for key, value in fields.items())
    prof, model = profiled["prof"], profiled["model"]
    check_truth(prof, model, backward_wall_ms=profiled["backward_ms"])
    records = prof.records
    # Every module ran in every step; a BasicBlock calls its one ReLU twice.
    assert {name: record.calls for name, record in records.items() if record.calls != 1} == {
        f"layer{i}.{j}.relu": 2 for i in range(1, 5) for j in range(2)}
    # The meters count in the first step, which the times leave out: 2 timed steps, every module in both.
    assert all(record.steps == record.steps_run == 2 for record in records.values())
    # conv1 under bf16 autocast: 2x64x32x32 outputs, each 3*7*7 multiply-adds: 2*64*1024*147*2 = 38,535,168 FLOPs
    # forward, the same for the weight's gradient (the input needs none). It saves its input and weight cast to
    # bf16: 2*3*64*64*2 + 64*3*7*7*2 = 49,152 + 18,816 bytes.
    conv1 = records["conv1"]
    assert (conv1.flops_forward, conv1.flops_backward, conv1.saved_bytes) == (38_535_168, 38_535_168, 67_968)
    assert conv1.input_dtypes == ["float32"] and conv1.output_dtypes == ["bfloat16"]
    assert conv1.param_bytes == 64 * 3 * 7 * 7 * 4  # the parameters stay float32
    # fc: 2 rows x 512 x 10, 2*2*512*10 = 20,480 FLOPs forward, twice that backward (input and weight gradients).
    assert (records["fc"].flops_forward, records["fc"].flops_backward) == (20_480, 40_960)
    assert "ResNet" in prof.layerwise_summary() and len(prof.to_dataframe()) == len(records)
    assert "<html" in prof.to_report().lower()


@pytest.mark.filterwarnings("ignore:only one step was profiled")
def test_channels_last_counts_what_the_contiguous_model_counts() -> None:
    """Under bf16 autocast, the same arithmetic in channels_last: FLOPs, saved bytes, shapes and dtypes alike for every
    module (the bytes meter's figures are left out: see the report on ``as_strided_``)."""
    fields = ("flops_forward", "flops_backward", "saved_bytes", "activation_bytes", "input_shapes",
              "output_shapes", "output_dtypes", "param_bytes")
    profiles = []
    for channels_last in (False, True):
        model = _resnet(channels_last)
        x = X.to(memory_format=torch.channels_last) if channels_last else X

        def step() -> None:
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = nn.functional.cross_entropy(model(x), Y)
            loss.backward()

        with LayerProf(model, metrics=("params", "flops", "shapes", "memory")) as prof:
            step()
        profiles.append(prof.to_dict())
    contiguous, channels_last = profiles
    assert list(contiguous) == list(channels_last)
    for name, row in contiguous.items():
        assert {f: row[f] for f in fields} == {f: channels_last[name][f] for f in fields}, name
    # layer1.0.conv1: 2x64x16x16 outputs of 64*3*3 multiply-adds = 2*64*256*576*2 = 37,748,736 FLOPs forward.
    assert contiguous["layer1.0.conv1"]["flops_forward"] == 37_748_736


def test_a_cast_between_two_blocks_halves_the_parameter_bytes() -> None:
    model = _resnet()
    sizes = []
    for cast in (None, torch.bfloat16, torch.float16, torch.float32):
        if cast is not None:
            model.to(cast)
        with LayerProf(model) as prof:
            model(X.to(next(model.parameters()).dtype)).float().sum().backward()
        root = prof.records[""]
        sizes.append((root.param_bytes, root.buffer_bytes, root.param_dtypes))
    params = 11_181_642
    # The BatchNorms' running mean and variance are cast with the parameters; num_batches_tracked stays int64
    # (20 BatchNorms: 9,600 floats and 20 int64).
    assert sizes == [(params * 4, 9_600 * 4 + 160, {"float32": params}),
                     (params * 2, 9_600 * 2 + 160, {"bfloat16": params}),
                     (params * 2, 9_600 * 2 + 160, {"float16": params}),
                     (params * 4, 9_600 * 4 + 160, {"float32": params})]


MODELS = textwrap.dedent('''
    from torch import nn


    def mlp():
        return nn.Sequential(nn.Linear(16, 64), nn.GELU(), nn.Linear(64, 64), nn.GELU(), nn.Linear(64, 4))
''')


@pytest.fixture
def models(tmp_path: Path) -> str:
    path = tmp_path / "amp_models.py"
    path.write_text(MODELS)
    return f"{path}:mlp"


def test_the_command_line_profiles_and_plans_a_step_under_autocast(models: str, tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    """Mixed precision is how such models train: ``--dtype bfloat16`` casts the whole model instead, whose step saves
    other bytes (no bf16 copies of the weights), so a plan made on it is another step's. ``--autocast bfloat16``
    runs each step's forward under ``torch.autocast``, the model left in float32, and plans and verifies on that."""
    path = tmp_path / "amp.json"
    status = main([models, "-i", "8,16", "--autocast", "bf16", "--warmup", "0", "--steps", "2", "--metrics",
                   "params,flops,shapes,memory", "--json", str(path), "--checkpoint-budget", "50%"])
    out, err = capsys.readouterr()
    assert status == 0, err
    assert out.splitlines()[0].endswith("| cpu, float32, autocast bfloat16 | input 8x16 | 0 warm-up + 1 step "
                                        "counting flops and memory + 2 steps, forward + backward")
    doc = json.loads(path.read_text())
    assert doc["meta"]["environment"]["autocast_dtype"] == "bfloat16"
    assert doc["meta"]["environment"]["dtype"] == "float32"
    rows = {row["name"]: row for row in doc["records"]}
    assert rows["0"]["output_dtypes"] == ["bfloat16"] and rows[""]["param_bytes"] == 5_508 * 4
    # Linear(64, 64) under autocast saves its input (8x64) and its weight (64x64) as bf16 copies:
    # (8*64 + 64*64) * 2 = 9,216 bytes; FLOPs 2*8*64*64 = 65,536 forward.
    assert rows["2"]["saved_bytes"] == 9_216 and rows["2"]["flops_forward"] == 65_536
    # The plan is verified on the same autocast step: measured as predicted, without a warning that the step
    # runs without autocast.
    assert "verified: saved" in out and "(+0.0%)" in out and "budget met" in out
    assert "autocast" not in err


@pytest.mark.parametrize("argv, message", [
    (["--autocast", "int8"], "--autocast int8: torch.autocast computes in bfloat16 or float16"),
    (["--autocast", "float32"], "--autocast float32: torch.autocast computes in bfloat16 or float16"),
    (["--autocast", "bf17"], "unknown --autocast 'bf17'"),
    (["--autocast", "bfloat16", "--dtype", "bfloat16"], "--autocast bfloat16 with --dtype bfloat16"),
    (["--autocast", "bfloat16", "--device", "meta"], "--autocast bfloat16: torch.autocast does not run on meta"),
])
def test_autocast_misuse_is_a_usage_error_before_the_model_is_built(models: str, argv: list[str], message: str,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    assert main([models, "-i", "8,16", *argv]) == 2
    out, err = capsys.readouterr()
    assert message in err and out == ""
