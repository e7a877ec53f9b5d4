"""A second reading of the plan's autocast check, the shapes meter's attribute walk and the named FLOP formulas:
each test is a problem found there."""
from __future__ import annotations

import warnings
from typing import Any

import torch
from torch import nn

from .conftest import profile_quietly


def _caught(run: Any) -> list[str]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        run()
    return [str(w.message) for w in caught if str(w.message).startswith("checkpoint plan")]


class _Blocks(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.blocks = nn.Sequential(*[nn.Sequential(nn.Linear(16, 64), nn.Tanh(), nn.Linear(64, 16))
                                      for _ in range(3)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.blocks(x)


def test_autocast_entered_inside_the_models_forward_is_the_steps_autocast() -> None:
    # accelerate's prepare_model (what Trainer(bf16=True) runs) puts the autocast inside the model's forward:
    # model.forward = autocast(model.forward). The memory meter read the autocast at the root call's pre-hook, before
    # that forward entered it: the profile said "autocast": False of a bfloat16 step, and the plan made on it warned
    # at its first wrapped call, inside the forward, that the step ran under another autocast than the profiled one.
    model, x = _Blocks(), torch.randn(8, 16)
    model.forward = torch.autocast("cpu", dtype=torch.bfloat16)(model.forward)  # type: ignore[method-assign]

    def step() -> None:
        model(x).float().sum().backward()

    prof = profile_quietly(model, step, 1)
    assert prof.profile.meta["memory"]["autocast"] == "bfloat16"
    plan = prof.checkpoint_plan("50%")
    assert plan.profiled_as["autocast"] == "bfloat16"
    with plan.applied(model):
        assert _caught(step) == []
    # The same model trained without it is told.
    del model.forward
    with plan.applied(model):
        found = _caught(step)
    assert len(found) == 1 and "runs without torch.autocast, and the profiled step ran under" in found[0]


class _Node:
    """A plain object holding a tensor, its children, and a reference back to its parent (a tree of regions)."""

    def __init__(self, size: int, parent: _Node | None = None) -> None:
        self.features, self.parent, self.children = torch.zeros(size), parent, []
        if parent is not None:
            parent.children.append(self)


class _ReadsTree(nn.Module):
    def forward(self, root: _Node) -> torch.Tensor:
        return root.features.sum() + sum(child.features.sum() for child in root.children)


def test_an_object_referring_back_to_its_parent_shows_each_tensor_once() -> None:
    # The shapes meter's walk of a plain object's attributes followed child.parent back up to the root, and down
    # again, until its depth limit: 93 input tensors for 3 ('0.children.0.parent.children.0.parent.features', ...),
    # and a walk that grows with the branches at every level (three children: 484 for 4 tensors).
    from layerprof import LayerProf

    root = _Node(2)
    _Node(3, root), _Node(4, root)
    model = _ReadsTree()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with LayerProf(model, metrics=("shapes",)) as prof:
            model(root)
    record = prof.records[""]
    assert record.input_paths == ["0.features", "0.children.0.features", "0.children.1.features"]
    assert record.input_shapes == [[2], [3], [4]]
    # An object holding itself, beside a module (whose parameters are not read).
    holder = _Node(5)
    holder.parent, holder.module = holder, nn.Linear(2, 2)  # type: ignore[attr-defined]
    from layerprof._tensors import iter_tensor_paths

    assert [path for path, _ in iter_tensor_paths(holder)] == [("features",)]
    # The same tensor under two names, or the same object in two arguments, still shows at each place.
    shared = _Node(6)
    assert [path for path, _ in iter_tensor_paths((shared, shared))] == [(0, "features"), (1, "features")]
