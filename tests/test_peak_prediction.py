"""The step's peak memory with a checkpoint plan: predicted from the profiled step, measured with the plan applied.

On the CPU the live-bytes reader is exact and deterministic (a plain step reads what the profiled one did, to the
byte), so predicted against measured is the model's own error. What the model leaves out is the order of frees
inside one interval between two module boundaries and the recomputation's early stop (its last ops, which save
nothing, are not re-run): each is one tensor of the region at most, under 0.2 % of these steps' peaks (0.0 % on
all but the deep MLP, where 1 KiB of 1 MiB). The tests allow 1 %.
"""
from __future__ import annotations

import dataclasses
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
from layerprof.plan.peak import PeakPrediction, predict_peak, step_peak
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


def profiled_model(build: Callable[[], tuple[nn.Module, dict[str, Any]]]
                   ) -> tuple[nn.Module, Callable[[], None], Any, int]:
    """A model built from seed 0, its training step, the step's profile with ``live_memory`` and its peak."""
    torch.manual_seed(0)
    model, inputs = build()
    step = _trained(model, inputs)
    profile = _profiled(model, step)
    return model, step, profile, profile.meta["live_memory"]["step_peak_bytes"]


@pytest.mark.parametrize("name", sorted(MODELS))
def test_the_step_peak_with_a_plan_is_as_predicted(name: str) -> None:
    build, allow = MODELS[name]
    model, step, profile, profiled = profiled_model(build)
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
    assert "profiled:" not in verification_text(result)
    # On CUDA the peak counts every tensor alive: 3 MiB taken outside the step since the profile moves both peaks.
    moved = (before + 3 * 2**20, after + 3 * 2**20)
    on_cuda = dataclasses.replace(result, peak_bytes=moved, cuda_peak_bytes=moved)
    assert (f"today's peak measured {format_bytes(moved[0])} against {format_bytes(before)} profiled: "
            f"memory held outside the step changed since the profile") in verification_text(on_cuda)
    # On the CPU both count the step's own tensors: there the profiled step differed from a plain one.
    assert (f"today's peak measured {format_bytes(moved[0])} against {format_bytes(before)} profiled: the profiled "
            f"step's peak differs from a plain step's") in verification_text(dataclasses.replace(result, peak_bytes=moved))


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


def test_the_prediction_by_hand() -> None:
    """A step of numbers: the model ("") calls ``a`` (which calls ``a.x`` and ``a.y``) then ``b``; ``a`` is wrapped."""
    table = {
        "names": ["", "a", "a.x", "a.y", "b"], "parents": [-1, 0, 1, 1, 0],
        # [forward start, forward end, backward start, backward end] as boundary numbers; the step ends at 16.
        "bounds": [[1, 10, 11, 15], [2, 7, 13, 15], [3, 4, 14, 15], [5, 6, 13, 14], [8, 9, 11, 12]],
        "sizes": [100, 30, 20],
        "savers": [[2, 3], [4], []],  # 100 B saved by a.x and a.y (inside a), 30 by b, 20 by nothing...
        "inputs": [[], [], [1]],  # ...but taken by a: its checkpoint holds it
    }
    # Level at each boundary and the peak of the interval ending there (index 0 unused, interval 1 before the step).
    timeline = {"levels": [0, 0, 0, 0, 60, 60, 120, 120, 120, 150, 150, 154, 130, 130, 100, 40, 40],
                "peaks": [0, 0, 0, 0, 80, 60, 160, 120, 120, 160, 150, 154, 190, 130, 170, 120, 40]}
    assert step_peak(timeline) == 190  # b's backward (interval 12)
    assert predict_peak([table], timeline, set()) == PeakPrediction(190, "backward", "b")
    # With a wrapped: the 100 B are not held from a's forward end (boundary 7) to its backward start (13): intervals
    # 8-13 less 100; the 20 B input is held from 7 to a's backward end (15): intervals 8-15 plus 20. So b's backward
    # peaks at 190 - 100 + 20 = 110, a.y's at 170 + 20 = 190. a's recomputation, at boundary 13: the level there
    # (130), plus what the plan changes in the next interval (+20), less a's own 100 B not yet recomputed, plus a's
    # forward rise (the peak of intervals 3-7, 160, less the level at its start, 0): 210, the step's peak.
    assert predict_peak([table], timeline, {"a"}) == PeakPrediction(210, "recompute", "a")
    # b wrapped instead: its 30 B are not held over intervals 10-11 (150 - 30, 154 - 30); b's recomputation at 11:
    # 154 - 30 + (160 - 120) = 164; the peak stays b's backward, 190.
    assert predict_peak([table], timeline, {"b"}) == PeakPrediction(190, "backward", "b")
    without = {key: value for key, value in table.items() if key != "bounds"}
    assert predict_peak([without], timeline, {"a"}) is None  # a profile without a reader for its device


class _KeepsWhatItBuilds(nn.Linear):
    """Builds its weight in forward and keeps it on the module, as the older hook-based weight_norm does with
    ``module.weight``: a tensor the forward saves for backward that outlives backward (the module holds it)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.built = self.weight * 2
        return nn.functional.linear(x, self.built, self.bias)


def test_a_saved_tensor_a_module_keeps_is_not_freed_by_a_plan() -> None:
    # The planner took every saved tensor for autograd's alone: wrapping a region whose modules keep their built
    # weights frees none of them, and the step's peak was predicted 6-11 % low (154,632 against 166,920 measured at a
    # 75 % budget; 134,152 against 150,536 for a peak budget, which the plan then missed).
    torch.manual_seed(0)
    blocks = [nn.Sequential(_KeepsWhatItBuilds(32, 32), nn.GELU(), _KeepsWhatItBuilds(32, 32), nn.Tanh())
              for _ in range(3)]
    model = nn.Sequential(nn.Embedding(100, 32), *blocks, nn.Linear(32, 100))
    ids = torch.randint(0, 100, (4, 16))

    def step() -> None:
        model.zero_grad(set_to_none=True)
        nn.functional.cross_entropy(model(ids).flatten(0, 1), ids.flatten()).backward()

    profile = _profiled(model, step)
    for budget in (0.75, 0.5):
        plan = profile.checkpoint_plan(budget, wrap_cost=None)
        assert plan.modules
        with plan.applied(model):
            measured = _live_peak(step)
        assert abs(plan.predicted_peak_bytes - measured) <= TOLERANCE * measured, (plan.modules, measured)
