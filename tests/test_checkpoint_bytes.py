"""The memory meter's figures for the checkpoint planner: what wrapping a module frees and keeps."""
from __future__ import annotations

import warnings

import torch
from torch import nn

from layerprof import LayerProf
from layerprof.plan.apply import unwrap, wrap


def _profile(model: nn.Module, x: torch.Tensor) -> LayerProf:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with LayerProf(model, metrics=("memory",)) as prof:
            model(x).sum().backward()
    return prof


def _net() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(64, 256), nn.Sequential(nn.Linear(256, 256), nn.Tanh(), nn.Linear(256, 256),
                                                           nn.Tanh()), nn.Linear(256, 1))


def test_freed_and_kept_bytes_exact() -> None:
    net, x = _net(), torch.randn(32, 64)
    prof = _profile(net, x)
    got = {name: (r.saved_bytes, r.checkpoint_freed_bytes, r.checkpoint_kept_bytes) for name, r in prof.records.items()}
    act = 32 * 256 * 4  # one [32, 256] float32 activation: 32768 bytes
    assert got == {
        "": (8192 + 3 * act, 3 * act, 0),  # x (saved by linear 0, the model's input) is not freed
        "0": (8192, 0, 0),
        "1": (3 * act, act, 0),  # its input (linear 0's output) is saved inside it by linear 1.0: kept anyway
        "1.0": (act, 0, 0),  # saves its input, which is its input: nothing freed
        "1.1": (act, 0, act),  # tanh saves its output, which 1.2 also saves; its input nothing else keeps
        "1.2": (0, 0, 0),
        "1.3": (act, 0, act),  # its output is saved by linear 2 as well
        "2": (0, 0, 0),
    }
    # Wrapping "1" saves freed - kept: 106496 - 32768 + 0 = 73728, as measured on the wrapped model.
    own = wrap(net[1])
    try:
        wrapped = _profile(net, x)
    finally:
        unwrap(net[1], own)
    assert wrapped.tree.saved_bytes == 8192 + 3 * act - act == 73728
    assert "forward" not in net[1].__dict__


def test_safety_counts() -> None:
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(8, 8), nn.Sequential(nn.BatchNorm1d(8), nn.ReLU(inplace=True)), nn.Linear(8, 1))
    prof = _profile(net, torch.randn(4, 8))
    records = prof.records
    assert [records[n].checkpoint_side_effects for n in ("", "0", "1", "1.0", "1.1")] == [1, 0, 1, 1, 0]
    assert [records[n].checkpoint_inplace_inputs for n in ("", "1", "1.0", "1.1")] == [0, 0, 0, 1]
    assert records["1.1"].foreign_calls == 0


class _Borrower(nn.Module):
    def __init__(self, lender: nn.Module) -> None:
        super().__init__()
        self.lender = [lender]  # not a submodule: called from here, registered elsewhere

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lender[0](x)


def test_foreign_calls() -> None:
    shared = nn.Linear(8, 8)
    net = nn.Sequential(shared, _Borrower(shared))
    prof = _profile(net, torch.randn(4, 8))
    # "0" is called once by its parent (the Sequential) and once from "1"'s forward.
    assert prof.records["0"].calls == 2 and prof.records["0"].foreign_calls == 1


def test_saved_after_counts_a_shared_input_once() -> None:
    from layerprof.metrics.checkpoint_bytes import saved_after

    # root(0) -> a(1), b(2); storage x (100 bytes) is the input of a and b and saved by nobody; y (10) saved by a,
    # z (1) saved by b and by the root itself.
    table = {"names": ["", "a", "b"], "parents": [-1, 0, 0], "sizes": [100, 10, 1],
             "savers": [[], [1], [2, 0]], "inputs": [[1, 2], [], []]}
    assert saved_after([table], set()) == 11  # y + z
    assert saved_after([table], {"a"}) == 101  # x held by a's checkpoint, z by the root; y freed
    assert saved_after([table], {"a", "b"}) == 101  # x once, though both checkpoints hold it; z still the root's
    assert saved_after([table], {"", "a"}) == 0  # the root wrapped: a inside it, and the root has no inputs here


class _Residual(nn.Module):
    """LeViT's block layout: the input of ``mlp`` is a temporary with the transposed strides of the block's input,
    which nothing saves (the Linear saves a contiguous copy) and which dies when the block returns."""

    def __init__(self) -> None:
        super().__init__()
        self.mlp = nn.Sequential(nn.Linear(8, 8, bias=False), nn.Tanh())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + 1
        return x + self.mlp(x)


def test_an_input_that_dies_is_not_taken_for_a_later_storage() -> None:
    from layerprof.metrics.checkpoint_bytes import STORAGES_ATTRIBUTE, saved_after

    torch.manual_seed(0)
    net = nn.Sequential(*[_Residual() for _ in range(4)])
    x = torch.randn(2, 8, 16).transpose(1, 2)  # [2, 16, 8], not contiguous
    tables = _profile(net, x).tree.__dict__[STORAGES_ATTRIBUTE]
    for name in ("0.mlp", "1.mlp", "2.mlp", "0.mlp.0"):
        module = net.get_submodule(name)
        own = wrap(module)
        try:
            measured = _profile(net, x).tree.saved_bytes
        finally:
            unwrap(module, own)
        # The checkpoint holds the dead temporary (2 * 16 * 8 * 4 = 1024 bytes). Its storage's address was reused by a
        # later block's copy, and the two were one storage to the planner, which left the temporary out: 1024 short.
        assert saved_after(tables, {name}) == measured, name
