"""Problems found by sweeps: in-place views counted as moving data, the gate's advice under autocast, and a module
wrapped by an adapter between the steps of one block."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from layerprof import LayerProf
from layerprof.cli import main
from layerprof.metrics.bytes import op_bytes

pytestmark = pytest.mark.filterwarnings("ignore:only one step was profiled:RuntimeWarning")
aten = torch.ops.aten


class Call(nn.Module):
    """A module around a function, so that functional code has a record."""

    def __init__(self, function) -> None:
        super().__init__()
        self.function = function

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.function(x)


def _forward_bytes(function, x: torch.Tensor) -> int:
    model = Call(function)
    with LayerProf(model, metrics=("flops",)) as prof:
        model(x)
    return prof.records[""].bytes_forward


# -- 1. in-place views move no data -------------------------------------------------------------------------------
@pytest.mark.parametrize("inplace_view", [
    lambda y: y.unsqueeze_(0),
    lambda y: y.view(32, 32).t_(),
    lambda y: y.view(32, 32).transpose_(0, 1),
    lambda y: y.view(32, 32).swapdims_(0, 1),
    lambda y: y.view(1, 1024).squeeze_(0),
    lambda y: y.as_strided_((32, 32), (32, 1)),
], ids=["unsqueeze_", "t_", "transpose_", "swapdims_", "squeeze_", "as_strided_"])
def test_an_inplace_view_moves_no_bytes(inplace_view) -> None:
    x = torch.randn(1024)
    # x * 2 reads 1024 float32 (4,096 bytes) and writes as many (4,096): 8,192; the view after it changes sizes
    # and strides only (it counted as reading and writing its 4,096 bytes: 16,384)
    assert _forward_bytes(lambda x: inplace_view(x * 2), x) == 4096 + 4096
    assert _forward_bytes(lambda x: (x * 2).unsqueeze(0), x) == 4096 + 4096  # the out-of-place view: the same


def test_inplace_views_are_free_and_inplace_ops_on_data_are_not() -> None:
    y = torch.randn(4, 8)  # 32 float32: 128 bytes
    for op, args in ((aten.unsqueeze_.default, (0,)), (aten.squeeze_.dim, (0,)), (aten.t_.default, ()),
                     (aten.transpose_.default, (0, 1)), (aten.as_strided_.default, ((8, 4), (4, 1)))):
        assert op_bytes(op, (y, *args), {}, y) == 0, op
    assert op_bytes(aten.relu_.default, (y,), {}, y) == 128 + 128  # reads and writes its 128 bytes
    assert op_bytes(aten.mul_.Scalar, (y, 2.0), {}, y) == 128 + 128


def test_an_untagged_inplace_form_of_a_view_op_is_free_too() -> None:
    # A library's op pair without torch's inplace_view tag: the in-place form of a view writes only its self's
    # metadata; an in-place op on data (its out-of-place form returns a new tensor) reads and writes 128 + 128
    library = torch.library.Library("layerprof_s31", "FRAGMENT")
    library.define("fold(Tensor(a) self) -> Tensor(a)")
    library.define("fold_(Tensor(a!) self) -> Tensor(a!)")
    library.define("scale(Tensor self) -> Tensor")
    library.define("scale_(Tensor(a!) self) -> Tensor(a!)")
    ops, y = torch.ops.layerprof_s31, torch.randn(4, 8)
    assert torch.Tag.inplace_view not in ops.fold_.default.tags
    assert op_bytes(ops.fold_.default, (y,), {}, y) == 0
    assert op_bytes(ops.scale_.default, (y,), {}, y) == 128 + 128


def test_a_channels_last_resnet18_moves_the_bytes_of_the_contiguous_one() -> None:
    torchvision = pytest.importorskip("torchvision")

    def moved(channels_last: bool) -> dict[str, tuple[int, int]]:
        torch.manual_seed(0)
        model, x = torchvision.models.resnet18(weights=None), torch.randn(2, 3, 64, 64)
        if channels_last:
            model, x = model.to(memory_format=torch.channels_last), x.to(memory_format=torch.channels_last)
        with LayerProf(model, metrics=("flops",)) as prof:
            model(x).sum().backward()
        return {name: (record.bytes_forward, record.bytes_backward) for name, record in prof.records.items()}

    contiguous, channels_last = moved(False), moved(True)
    assert list(channels_last) == list(contiguous)
    # avgpool's mean reads [2, 512, 2, 2] (16,384 bytes) and writes [2, 512] (4,096); under channels_last an
    # as_strided_ that sets the result's strides read and wrote 4,096 more each (28,672)
    assert contiguous["avgpool"][0] == channels_last["avgpool"][0] == 16384 + 4096
    assert {name: value[0] for name, value in channels_last.items()} == \
        {name: value[0] for name, value in contiguous.items()}
    # Backward: autograd undoes that as_strided_ for real (as_strided's backward): new_zeros writes [2, 512] (4,096)
    # and copy_ reads and writes it (8,192) into avgpool's gradient: 12,288 more there, and nowhere else
    backward = {name: value[1] - contiguous[name][1] for name, value in channels_last.items()}
    assert backward == {name: 12288 if name in ("", "avgpool") else 0 for name in contiguous}


# -- 2. the gate's advice names --autocast where the runs' autocast differs ---------------------------------------
MODELS = """
import torch
from torch import nn


def mlp():
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 8))
"""


def _cli_profile(tmp_path: Path, name: str, *options: str) -> str:
    spec = tmp_path / "gate_models.py"
    spec.write_text(MODELS)
    path = tmp_path / f"{name}.json"
    assert main([f"{spec}:mlp", "-i", "4,16", "--warmup", "0", "--steps", "2", "--json", str(path), *options]) == 0
    return str(path)


def test_the_gate_names_autocast_among_the_options_to_make_alike(tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    # Before: "profile both with the same --device, --dtype and --threads, under the same torch.autocast (or none)"
    # for two runs of `layerprof SPEC` that differ by --autocast, the option that made them differ unnamed.
    plain = _cli_profile(tmp_path, "plain", "--threads", "1")
    amp = _cli_profile(tmp_path, "amp", "--threads", "1", "--autocast", "bf16")
    capsys.readouterr()
    assert main(["compare", plain, amp, "--fail-if-slower", "10"]) == 4
    err = capsys.readouterr().err
    assert "(A ran without torch.autocast and B under torch.autocast (bfloat16))" in err
    assert ("a gate compares two runs made alike: profile both with the same --device, --dtype, --threads and "
            "--autocast (or none; in a script, the same torch.autocast), both with backward or both without") in err
    # Another difference alone (threads): the advice as it was, --autocast not named
    two = _cli_profile(tmp_path, "two", "--threads", "2")
    capsys.readouterr()
    assert main(["compare", plain, two, "--fail-if-slower", "10"]) == 4
    err = capsys.readouterr().err
    assert "(A ran with 1 thread and B with 2 threads)" in err
    assert ("profile both with the same --device, --dtype and --threads, under the same torch.autocast (or none), "
            "both with backward") in err
    assert "--autocast" not in err


# -- 3. a module wrapped by an adapter between the steps of one block ----------------------------------------------
class LoRA(nn.Module):
    """A low-rank adapter around a frozen Linear, which it holds as ``base``."""

    def __init__(self, base: nn.Linear, rank: int = 2) -> None:
        super().__init__()
        self.base = base.requires_grad_(False)
        self.down = nn.Parameter(torch.full((rank, base.in_features), 0.1))
        self.up = nn.Parameter(torch.full((base.out_features, rank), 0.01))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.base(x) + x @ self.down.t() @ self.up.t()


def _mlp() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))


def _two_steps(model: nn.Sequential, x: torch.Tensor, profiled: bool) -> tuple[list[torch.Tensor], LayerProf | None]:
    """Step 1, wrap '0' in a LoRA, steps 2 and 3: the outputs and gradients of each, and the profiler."""
    seen: list[torch.Tensor] = []
    prof = LayerProf(model, metrics=("params", "shapes")) if profiled else None
    with prof if prof is not None else torch.enable_grad():
        for step in range(3):
            if step == 1:
                model[0] = LoRA(model[0])
            out = model(x)
            out.sum().backward()
            seen += [out.detach(), *(p.grad.clone() for p in model.parameters() if p.grad is not None)]
            model.zero_grad(set_to_none=True)
            if prof is not None:
                prof.step()
    return seen, prof


def test_a_linear_wrapped_by_an_adapter_inside_a_block_is_profiled_under_its_new_name() -> None:
    from .conftest import hook_state

    x = torch.randn(2, 8)
    plain, _ = _two_steps(_mlp(), x, profiled=False)
    model = _mlp()
    before = hook_state(model, calls=False)
    seen, prof = _two_steps(model, x, profiled=True)
    assert all(torch.equal(a, b) for a, b in zip(seen, plain, strict=True))  # outputs and gradients bitwise
    records = prof.records
    assert list(records) == ["", "0", "0.base", "1", "2"] == [name for name, _ in model.named_modules()]
    # Step 1 ran the Linear as '0'; steps 2 and 3 the LoRA as '0' and the Linear inside it as '0.base' (before:
    # no '0.base', the Linear's calls counted under '0': 5 in 3 steps)
    assert (records["0"].type, records["0"].extra_repr, records["0"].calls) == ("LoRA", "", 1)
    assert (records["0.base"].type, records["0.base"].steps_run) == ("Linear", 2)
    assert records["0.base"].calls == pytest.approx(2 / 3)  # (calls a step over the block's 3 steps)
    assert records["0.base"].extra_repr == "in_features=8, out_features=16, bias=True"
    assert records["0.base"].output_shapes == [[2, 16]]
    # Linear(8, 16): 8*16 + 16 = 144, the adapter's down 2*8 = 16 and up 16*2 = 32: '0' holds 192 (32 trainable);
    # Linear(16, 4): 16*4 + 4 = 68; the root 192 + 68 = 260 (before: 116, under a child of 192)
    assert (records["0.base"].params, records["0.base"].trainable_params) == (144, 0)
    assert (records["0"].params, records["0"].own_params, records["0"].trainable_params) == (192, 48, 48)
    assert (prof.tree.params, prof.tree.trainable_params) == (192 + 68, 48 + 68)
    for record in records.values():
        assert sum(child.params for child in record.children) <= record.params, record.name
    # Nothing of layerprof left on the model: the moved Linear as it came in, the adapter as made
    after = hook_state(model, calls=False)
    assert after["0.base"] == before["0"] and after["1"] == before["1"] and after["2"] == before["2"]
    assert after["0"] == hook_state(LoRA(nn.Linear(8, 16)), calls=False)[""]


class OwnCall(nn.Linear):
    """A Linear whose calls skip ``Module._call_impl`` (as ``torch.compiler.disable`` on a class makes them):
    layerprof times it by hooks on it, not by its call wrapper."""

    def _call_impl(self, *args, **kwargs):
        return nn.Module._call_impl(self, *args, **kwargs)


def test_a_module_timed_by_hooks_moved_into_an_adapter_is_hooked_once_and_left_clean() -> None:
    from .conftest import hook_state

    torch.manual_seed(0)
    model = nn.Sequential(OwnCall(8, 16), nn.ReLU(), nn.Linear(16, 4))
    before = hook_state(model, calls=False)
    _, prof = _two_steps(model, torch.randn(2, 8), profiled=True)
    # One call a step in steps 2 and 3, not two (hooked twice), not under '0'
    assert (prof.records["0.base"].type, prof.records["0.base"].steps_run) == ("OwnCall", 2)
    assert prof.records["0.base"].calls == pytest.approx(2 / 3) and prof.records["0"].calls == 1
    assert prof.tree.params == 192 + 68  # as with a plain Linear
    assert hook_state(model, calls=False)["0.base"] == before["0"]


def test_a_head_replaced_twice_inside_a_block_counts_the_last_one_under_the_root() -> None:
    # The params meter read the block's first list of modules, which the profiler makes anew once a replaced head
    # has left: a head that joined after that was missing, the root read 144 and the head 85 (the first new one).
    torch.manual_seed(0)
    model, x = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4)), torch.randn(2, 8)
    with LayerProf(model, metrics=("params",)) as prof:
        for step in range(3):
            if step:
                model[2] = nn.Sequential(nn.Linear(16, 4 + step))
            model(x).sum().backward()
            prof.step()
    # Linear(8, 16): 144; the last head Linear(16, 6): 16*6 + 6 = 102; the root 144 + 102 = 246
    assert [prof.records[name].params for name in ("", "0", "2", "2.0")] == [246, 144, 102, 102]


def test_a_model_called_only_inside_a_compiled_function_is_told_apart_from_one_never_called() -> None:
    # torch.compile inlines the model's forwards into the compiled function, whose code calls no hook: the block
    # records no step. The warning said only "call the model inside the block", which the user had done; where
    # dynamo compiled a graph it now says why such a call is not seen and what to do.
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU())
    compiled = torch.compile(lambda x: model(x).sum(), backend="eager")
    with pytest.warns(RuntimeWarning, match="inside a torch.compile'd function.*profile the same step without "
                                            "torch.compile") as caught:
        with LayerProf(model) as prof:
            compiled(torch.randn(2, 4)).backward()
    assert len([w for w in caught if "recorded no step" in str(w.message)]) == 1
    assert prof.tree.calls == 0 and prof.records["0"].calls == 0  # nothing of the compiled call was timed
