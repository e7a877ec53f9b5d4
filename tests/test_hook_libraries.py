"""Models that other libraries (or the user) have already hooked or rewritten, profiled: your own hooks of every
kind, full backward hooks as Opacus puts them, Captum's attribution runs, einops layers, torch.fx GraphModules,
torch.export's unflattened modules, and hook-based summary tools on the same model. Each keeps its outputs and
gradients bitwise, its own hooks working, and gets every module with its times."""
from __future__ import annotations

import time
import warnings

import pytest
import torch
from torch import nn

from layerprof import LayerProf

from .conftest import hook_state

# A user's hook that sleeps this long is far above a small Linear's backward, even on a loaded machine.
SLEEP_S = 0.03


def small_mlp() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Sequential(nn.Linear(16, 16), nn.Tanh()), nn.Linear(16, 2))


@pytest.mark.parametrize("where", ["", "0", "2", "2.0"])
def test_a_full_backward_hook_counts_in_its_module_where_no_input_needs_a_gradient(where: str) -> None:
    # With no input needing a gradient (the first layer, the root, a block after frozen layers), torch runs a full
    # backward hook in the node it wraps the module's outputs in, made after the call returned. Before, the hook's
    # time went to the parent's own backward, and for the root to no module (the root read 0.4 ms for a 30 ms
    # backward).
    model = small_mlp()
    x = torch.randn(4, 8)  # needs no gradient
    if where.startswith("2"):
        model[0].requires_grad_(False)  # frozen: nothing before '2' needs a gradient
    handle = model.get_submodule(where).register_full_backward_hook(lambda m, gi, go: time.sleep(SLEEP_S))
    handle = model.get_submodule(where).register_full_backward_hook(lambda m, gi, go: time.sleep(SLEEP_S))
    before = hook_state(model)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch's "full backward hook is firing ... since no inputs require gradients"
        with LayerProf(model) as prof:
            model(x).sum().backward()
    assert hook_state(model) == before
    handle.remove()
    ancestors = [name for name in prof.records if name == "" or where.startswith(name + ".") or name == where]
    for name, record in prof.records.items():
        if name in ancestors:
            assert record.backward_ms >= SLEEP_S * 1e3, name
        elif record.backward_ms is not None:
            assert record.backward_ms < SLEEP_S * 1e3, name


def test_a_roots_full_backward_pre_hook_counts_in_the_root() -> None:
    # A module's full backward pre-hook runs in the same node, which is its parent's code: the root has no parent,
    # and its pre-hook's time was in no module (the root read under 1 ms of a 30 ms backward).
    model = small_mlp()
    handle = model.register_full_backward_pre_hook(lambda m, go: time.sleep(SLEEP_S))
    with LayerProf(model) as prof:
        model(torch.randn(4, 8)).sum().backward()
    handle.remove()
    assert prof.records[""].self_backward_ms >= SLEEP_S * 1e3
    assert all(record.backward_ms < SLEEP_S * 1e3 for name, record in prof.records.items() if name)
