"""Found by running models the zoos do not hold through the zoo checks (tests/zoo_checks.py): one test per bug."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from layerprof import LayerProf

pytestmark = pytest.mark.filterwarnings("ignore:only one step was profiled:RuntimeWarning")


class _Factories(nn.Module):
    """What SigLIP's loss (``torch.eye`` for its labels) and DETR's (``torch.diag`` of a box-IoU matrix) run: ops
    without a multiply-accumulate, which count 0 by the convention."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.proj(x)
        scores = y @ y.T
        return ((torch.diag(scores) * torch.eye(4).sum(0)).sum() + torch.logspace(0, 1, 4).sum()
                + torch.nansum(scores))


def test_factories_and_diagonal_copies_are_not_unknown_ops() -> None:
    # SigLIP's training step listed aten.eye among the ops with no formula, DETR's aten.diagonal_copy and
    # aten.diagonal_backward, and the summary said the FLOPs left them out: they have no multiply-accumulate (0 by
    # the convention, as FlopCounterMode counts them), like arange, zeros or a view's copy.
    model, x = _Factories(), torch.randn(4, 4)
    with LayerProf(model, metrics=("flops",)) as prof:
        model(x).backward()
    assert prof.unknown_ops() == {}
    assert prof.tree.flops_forward == 2 * 4 * 4 * 4 + 2 * 4 * 4 * 4  # the Linear and y @ y.T
    assert "no formula" not in prof.layerwise_summary(columns=("flops",))
