"""torch's own utilities that hook modules or change how a step runs, under layerprof: saved-tensor hooks,
parametrizations, pruning, torch.func. Each profiles a real training step and checks what the user sees."""
from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn
from torch.autograd.graph import save_on_cpu, saved_tensors_hooks

from layerprof import LayerProf

from .conftest import hook_state
from .invariants import check_profile, parameter_modules_have_backward


def _mlp() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 64), nn.Tanh(), nn.Linear(64, 1))


def _to_half() -> saved_tensors_hooks:
    """A user's compression of what autograd saves: kept in float16, given back in the saved dtype."""
    return saved_tensors_hooks(lambda t: (t.dtype, t.to(torch.float16)), lambda packed: packed[1].to(packed[0]))


# The step's saved bytes, x: [32, 16] and the Tanh's output [32, 64] in float32 (the second Linear saves that same
# output again, one storage): 32 * 16 * 4 + 32 * 64 * 4 = 2048 + 8192 = 10240.
SAVED = {"": 10240, "0": 2048, "1": 8192, "2": 0}


@pytest.mark.parametrize("user_hooks", [save_on_cpu, _to_half], ids=["save_on_cpu", "a user's float16 hooks"])
def test_saved_tensor_hooks_entered_inside_the_block_read_unknown_not_zero(user_hooks) -> None:
    # Autograd runs only the innermost saved-tensor hooks: a `with save_on_cpu():` inside the step hid every saved
    # tensor from the memory meter, whose figures read 0 and whose planner found a feasible plan wrapping nothing.
    model, x = _mlp(), torch.randn(32, 16)

    def step() -> list[torch.Tensor]:
        model.zero_grad(set_to_none=True)
        with user_hooks():
            loss = model(x).pow(2).mean()
        loss.backward()
        return [loss.detach(), *(p.grad.clone() for p in model.parameters())]

    plain, before = step(), hook_state(model)
    with pytest.warns(RuntimeWarning, match=r"what the model saved under yours is unknown"):
        with LayerProf(model, metrics=("memory",)) as prof:
            profiled = step()
    assert all(torch.equal(a, b) for a, b in zip(plain, profiled)) and hook_state(model) == before
    for name, record in prof.records.items():
        assert record.saved_bytes is None and record.self_saved_bytes is None, name
        assert record.activation_bytes is not None, name  # (outputs are read without the hooks)
    assert prof.meta["memory"]["under_other_saved_tensors_hooks"] == [""]
    with pytest.raises(ValueError, match=r"the model ran under saved-tensor hooks entered inside the block"):
        prof.checkpoint_plan(0.5)
    # Entered around the block, the meter hands each tensor on to them and counts it: exact figures, a real plan.
    with user_hooks():
        with warnings.catch_warnings():
            warnings.filterwarnings("error", "metrics=.* hooks entered inside the block")
            with LayerProf(model, metrics=("memory",)) as prof:
                model.zero_grad(set_to_none=True)
                loss = model(x).pow(2).mean()
                loss.backward()
        assert {name: record.saved_bytes for name, record in prof.records.items()} == SAVED
        again = [loss.detach(), *(p.grad for p in model.parameters())]
        assert all(torch.equal(a, b) for a, b in zip(plain, again))
    assert prof.checkpoint_plan(0.5).modules


def test_the_warning_of_hooks_entered_inside_the_block_names_the_users_line() -> None:
    # It is raised as the meter stops, under __exit__ or prof.stop() (two depths inside layerprof): it pointed at
    # layerprof/collect/profiler.py; the line to change is the user's with or stop().
    model, x = _mlp(), torch.randn(32, 16)
    with pytest.warns(RuntimeWarning, match="hooks entered inside the block") as caught:
        with LayerProf(model, metrics=("memory",)):
            with save_on_cpu():
                model(x).sum().backward()
    assert [warning.filename for warning in caught if "hooks entered" in str(warning.message)] == [__file__]
    prof = LayerProf(model, metrics=("memory",))
    prof.start()
    with save_on_cpu():
        model(x).sum().backward()
    with pytest.warns(RuntimeWarning, match="hooks entered inside the block") as caught:
        prof.stop()
    assert [warning.filename for warning in caught if "hooks entered" in str(warning.message)] == [__file__]


def test_a_checkpointed_region_is_not_taken_for_a_users_saved_tensor_hooks() -> None:
    # torch.utils.checkpoint's own hooks sit above the meter's inside its region, by design (it saves nothing).
    model, x = _mlp(), torch.randn(32, 16)
    inner = nn.Sequential(model[0], model[1])
    with warnings.catch_warnings():
        warnings.filterwarnings("error", "metrics=.* hooks entered inside the block")
        with LayerProf(model, metrics=("memory",)) as prof:
            hidden = torch.utils.checkpoint.checkpoint(inner, x, use_reentrant=False)
            model[2](hidden).pow(2).mean().backward()
    assert "under_other_saved_tensors_hooks" not in prof.meta["memory"]
    assert prof.records["0"].saved_bytes == 0 and prof.records["1"].saved_bytes == 0


def test_a_students_block_inside_its_teachers_is_not_taken_for_a_users_saved_tensor_hooks() -> None:
    # Distillation with both models profiled: the student's meter is on top inside its block and hands each tensor
    # on to the teacher's, so the teacher's figures are exact, not unknown.
    torch.manual_seed(0)
    teacher = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    student = nn.Sequential(nn.Linear(8, 4), nn.Tanh())
    x = torch.randn(32, 8)
    with warnings.catch_warnings():
        warnings.filterwarnings("error", "metrics=.* hooks entered inside the block")
        with LayerProf(teacher, metrics=("memory",)) as outer:
            with LayerProf(student, metrics=("memory",)) as inner:
                (teacher(x) - student(x)).pow(2).sum().backward()
    # teacher: Linear(8, 16) keeps x, 32·8·4 = 1024 B; ReLU its output, 32·16·4 = 2048 B, which is also what the
    # last Linear keeps (one storage, counted once): 3072 B. student: x again, 1024 B; Tanh its output, 512 B.
    assert {name: r.saved_bytes for name, r in outer.records.items()} == {"": 3072, "0": 1024, "1": 2048, "2": 0}
    assert {name: r.saved_bytes for name, r in inner.records.items()} == {"": 1536, "0": 1024, "1": 512}
    assert "under_other_saved_tensors_hooks" not in outer.meta["memory"]


def test_hessian_of_a_model_counts_every_op_forward_mode_runs() -> None:
    # torch.func.hessian is jacfwd(jacrev(f)): forward mode runs its tangents' sums as prims.add, which carries no
    # pointwise tag and was listed as unknown (with prims.mul: GELU, LayerNorm). Free by the convention, as aten.add.
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 1))
    wider = nn.Sequential(nn.Linear(3, 4), nn.GELU(), nn.LayerNorm(4), nn.Linear(4, 1))
    v = torch.randn(3)
    plain = torch.func.hessian(lambda x: model(x).sum())(v)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (one step under a distorting meter; functorch's deprecated jit.script)
        with LayerProf(model, metrics=("flops",)) as prof:
            hessian = torch.func.hessian(lambda x: model(x).sum())(v)
        with LayerProf(wider, metrics=("flops",)) as wider_prof:
            torch.func.hessian(lambda x: wider(x).sum())(v)
    assert torch.equal(hessian, plain)
    assert prof.unknown_ops() == {} and wider_prof.unknown_ops() == {}
    # The mms the dispatch sees, 3 tangents batched: Linear(3, 4) forward [1, 3] @ [3, 4] twice (2 * 12 each) and
    # the tangents' [3, 3] @ [3, 4] (2 * 36): 24 + 24 + 72 = 120; its backward [1, 4] @ [4, 3] twice and
    # [3, 4] @ [4, 3]: 120. Linear(4, 1) forward [1, 4] @ [4, 1] twice and [3, 4] @ [4, 1]: 8 + 8 + 24 = 40; its
    # backward, the input's gradient only, [1, 1] @ [1, 4]: 8.
    flops = {name: (record.flops_forward, record.flops_backward) for name, record in prof.records.items()}
    assert flops == {"": (160, 128), "0": (120, 120), "1": (0, 0), "2": (40, 8)}


class _Quantized(nn.Module):
    """Eager-mode quantization-aware training's layout: stubs around a conv-bn-relu and a Linear."""

    def __init__(self) -> None:
        super().__init__()
        self.quant, self.dequant = torch.ao.quantization.QuantStub(), torch.ao.quantization.DeQuantStub()
        self.conv, self.bn, self.relu = nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.ReLU()
        self.fc = nn.Linear(8 * 6 * 6, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dequant(self.fc(self.relu(self.bn(self.conv(self.quant(x)))).flatten(1)))


@pytest.mark.parametrize("qconfig", ["fused observer", "FakeQuantize", "per-channel weights"])
def test_quantization_aware_training_counts_its_fake_quantization(qconfig: str) -> None:
    # FakeQuantize's ops (its fused observer, per-tensor and per-channel cachemask kernels) carry no pointwise tag
    # and have no decomposition: they were listed as unknown ops. They round and clamp: free by the convention.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (torch.ao.quantization's deprecation, its observers' reduce_range)
        quantization = torch.ao.quantization
        torch.manual_seed(0)
        model = _Quantized().train()
        model.qconfig = {"fused observer": quantization.get_default_qat_qconfig("fbgemm"),
                         "FakeQuantize": quantization.default_qat_qconfig,
                         "per-channel weights": quantization.get_default_qat_qconfig("x86", version=0)}[qconfig]
        quantization.fuse_modules_qat(model, [["conv", "bn", "relu"]], inplace=True)
        quantization.prepare_qat(model, inplace=True)
    x = torch.randn(2, 3, 8, 8)
    state = {key: value.clone() for key, value in model.state_dict().items()}

    def step() -> list[torch.Tensor]:
        model.load_state_dict(state)  # (the observers move at every step: each step starts from the same ones)
        model.zero_grad(set_to_none=True)
        loss = model(x).pow(2).mean()
        loss.backward()
        return [loss.detach(), *(p.grad.clone() for p in model.parameters())]

    plain, before = step(), hook_state(model)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (one step under a distorting meter)
        with LayerProf(model, metrics=("flops", "memory")) as prof:
            profiled = step()
    assert all(torch.equal(a, b) for a, b in zip(plain, profiled)) and hook_state(model) == before
    check_profile(prof, model)
    parameter_modules_have_backward(prof, model)
    assert prof.unknown_ops() == {}
    # The fused ConvBnReLU2d convolves once: 2 * (3 * 3 * 3) * 8 channels * 6 * 6 positions * 2 images = 31104,
    # backward the weight's gradient only (x needs none); fc: 2 * 288 * 4 * 2 = 4608, backward twice that.
    flops = {name: (record.flops_forward, record.flops_backward) for name, record in prof.records.items()
             if record.flops_forward}
    assert flops == {"": (35712, 40320), "conv": (31104, 31104), "fc": (4608, 9216)}
