"""The step's peak memory with a checkpoint plan: predicted from the profiled step, measured with the plan applied.

On the CPU the live-bytes reader is exact and deterministic (a plain step reads what the profiled one did, to the
byte), so predicted against measured is the model's own error. What the model leaves out is the order of frees
inside one interval between two module boundaries and the recomputation's early stop (its last ops, which save
nothing, are not re-run): each is one tensor of the region at most, under 0.2 % of these steps' peaks (0.0 % on
all but the deep MLP, where 1 KiB of 1 MiB). The tests allow 1 %.
"""
from __future__ import annotations

import warnings
from typing import Any, Callable

import pytest
import torch
from torch import nn

from layerprof import LayerProf, verify_plan
from layerprof.metrics.live_bytes import LiveBytesReader, read_step
from layerprof.metrics.checkpoint_bytes import STORAGES_ATTRIBUTE
from layerprof.metrics.memory import TIMELINE_ATTRIBUTE, MemoryMeter, MemoryReader
from layerprof.plan import verify
from layerprof.plan.peak import predict_peak
from layerprof.render.checkpoint import verification_text
from layerprof.render.units import format_bytes

from .checkpoint_zoo import ZOO
from .models import scalar_loss

TOLERANCE = 0.01


def _live_peak(step: Callable[[], Any]) -> int:
    return read_step(step).peak


def _trained(model: nn.Module, inputs: dict[str, Any]) -> Callable[[], None]:
    """A training step as a GPU user runs it: gradients set to None, then forward and backward."""
    model.train()

    def step() -> None:
        model.zero_grad(set_to_none=True)
        torch.manual_seed(1)
        scalar_loss(model(inputs["x"]) if set(inputs) == {"x"} else model(**inputs)).backward()

    return step


def _profiled(model: nn.Module, step: Callable[[], None], metric: str = "live_memory") -> Any:
    step()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # one step under a distorting meter
        with LayerProf(model, metrics=(metric,)) as prof:
            step()
    return prof.profile


def _resnet18() -> tuple[nn.Module, dict[str, Any]]:
    torchvision = pytest.importorskip("torchvision")
    return torchvision.models.resnet18(weights=None), {"x": torch.randn(2, 3, 64, 64)}


def _zoo(name: str, scale: str = "bench") -> Callable[[], tuple[nn.Module, dict[str, Any]]]:
    def build() -> tuple[nn.Module, dict[str, Any]]:
        pytest.importorskip("transformers")
        return ZOO[name].build(scale)

    return build


# The transformers at the benchmark's scale (6 layers of 128, batch 2 of 128 tokens): at the tests' tiny one a
# whole step peaks at 190 KB, and one tensor of the early stop is 2 % of it.
MODELS = {"resnet18": (_resnet18, True), "bert": (_zoo("bert"), False), "gpt2": (_zoo("gpt2"), False)}


@pytest.mark.parametrize("name", sorted(MODELS))
def test_the_step_peak_with_a_plan_is_as_predicted(name: str) -> None:
    build, allow = MODELS[name]
    torch.manual_seed(0)
    model, inputs = build()
    step = _trained(model, inputs)
    profile = _profiled(model, step)
    profiled = profile.meta["live_memory"]["step_peak_bytes"]
    assert _live_peak(step) == profiled  # the profiler's hooks add no tensor
    lowered = 0
    for budget in (0.75, 0.5, 0.25):
        plan = profile.checkpoint_plan(budget, allow_side_effects=allow, wrap_cost=None)
        assert plan.feasible and plan.modules and plan.profiled_peak_bytes == profiled
        with plan.applied(model):
            measured = _live_peak(step)
        assert abs(plan.predicted_peak_bytes - measured) <= TOLERANCE * measured, (budget, plan.modules)
        lowered += measured < profiled
    assert lowered  # some plan lowers the peak: the test compares something the plans change
    empty = profile.checkpoint_plan(1.0, wrap_cost=None)
    assert not empty.modules and empty.predicted_peak_bytes == profiled


class _MaskedBlock(nn.Module):
    """A block whose forward builds a large temporary without grad (a mask): its recomputation builds it again in
    backward, on top of what backward holds there."""

    def __init__(self, width: int, mask: int) -> None:
        super().__init__()
        self.linear, self.mask = nn.Linear(width, width), mask

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            scale = torch.ones(x.shape[0], self.mask).mean(-1, keepdim=True)  # [batch, mask] floats, gone at once
        return torch.tanh(self.linear(x)) * scale


def test_a_recomputation_can_hold_the_peak() -> None:
    model, step = _masked()
    profile = _profiled(model, step)
    plan = profile.checkpoint_plan(0.75, wrap_cost=None, runs=False)
    assert plan.modules == ["1"]
    # Today the mask (32 * 8192 * 4 = 1 MiB) is made in forward, when little else is held; with the plan it is
    # made again in backward, where the gradients of the last Linear are held beside it.
    assert (plan.predicted_peak_phase, plan.predicted_peak_at) == ("recompute", "1")
    with plan.applied(model):
        measured = _live_peak(step)
    assert measured > plan.profiled_peak_bytes > 32 * 8192 * 4
    assert abs(plan.predicted_peak_bytes - measured) <= TOLERANCE * measured
    assert "when 1 is recomputed" in str(plan)


def _masked() -> tuple[nn.Module, Callable[[], None]]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 64), _MaskedBlock(64, 8192), nn.Linear(64, 1))
    return model, _trained(model, {"x": torch.randn(32, 64)})


def test_verify_plan_sets_the_measured_peak_beside_the_predicted() -> None:
    model, step = _masked()
    plan = _profiled(model, step).checkpoint_plan(0.75, wrap_cost=None, runs=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        result = verify_plan(plan, model, step, repeats=1)
    assert result.cuda_peak_bytes is None and result.peak_bytes is not None
    before, after = result.peak_bytes
    assert (before, result.profiled_peak_bytes) == (plan.profiled_peak_bytes,) * 2
    assert result.predicted_peak_bytes == plan.predicted_peak_bytes
    assert after == plan.predicted_peak_bytes > before  # the recomputed mask: this plan raises the peak
    assert (f"step peak (live tensor bytes): {format_bytes(before)} -> {format_bytes(after)} measured; "
            f"{format_bytes(after)} predicted (+0.0% off), a change of +{format_bytes(after - before)} measured "
            f"against +{format_bytes(after - before)} predicted") in verification_text(result)


class _AllocatorOnCpu(MemoryReader):
    """Stands in for the CUDA allocator on CPU calls: the plain ``memory`` meter reads the step through it, as it
    reads CUDA's ``memory_allocated`` (a level and a peak, reset at every boundary)."""

    def __init__(self) -> None:
        self.live = LiveBytesReader()

    def covers(self, device: str) -> bool:
        return device == "cpu"

    def read(self, device: str) -> tuple[int, int]:
        return self.live.read(device)

    def reset_peak(self, device: str) -> None:
        self.live.reset_peak(device)

    def open(self) -> None:
        self.live.open()

    def close(self) -> None:
        self.live.close()


def test_the_cuda_path_predicts_from_the_allocator_and_verifies_with_its_peak(monkeypatch: pytest.MonkeyPatch) -> None:
    """The ``memory`` meter with an allocator reader (CUDA's, faked here) gives the same prediction as
    ``live_memory``; ``verify_plan`` on CUDA reads ``max_memory_allocated`` (faked: the live peak of a step)."""
    torch.manual_seed(0)
    model, inputs = _zoo("bert", "tiny")()
    step = _trained(model, inputs)
    live = _profiled(model, step).tree
    monkeypatch.setattr(MemoryMeter, "reader_factory", _AllocatorOnCpu)
    allocator = _profiled(model, step, metric="memory").tree
    wrapped = {"encoder.layer.0", "encoder.layer.1.intermediate"}
    predicted = [predict_peak(root.__dict__[STORAGES_ATTRIBUTE], root.__dict__[TIMELINE_ATTRIBUTE], wrapped)
                 for root in (live, allocator)]
    assert predicted[0] == predicted[1] and predicted[0] is not None
    model, step = _masked()
    plan = _profiled(model, step, metric="memory").checkpoint_plan(0.75, wrap_cost=None, runs=False)
    monkeypatch.setattr(verify, "_on_cuda", lambda model: True)
    monkeypatch.setattr(verify, "_cuda_peak", _live_peak)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *args: None)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        result = verify_plan(plan, model, step, repeats=1)
    assert result.cuda_peak_bytes == result.peak_bytes and result.peak_bytes is not None
    assert abs(result.peak_bytes[1] - plan.predicted_peak_bytes) <= TOLERANCE * result.peak_bytes[1]
    assert "CUDA max_memory_allocated:" in verification_text(result)
