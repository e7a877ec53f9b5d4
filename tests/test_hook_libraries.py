"""Models that other libraries (or the user) have already hooked or rewritten, profiled: your own hooks of every
kind, full backward hooks as Opacus puts them, Captum's attribution runs, einops layers, torch.fx GraphModules,
torch.export's unflattened modules, and hook-based summary tools on the same model. Each keeps its outputs and
gradients bitwise, its own hooks working, and gets every module with its times."""
from __future__ import annotations

import time

import pytest
import torch
from torch import nn

from layerprof import LayerProf

from .conftest import hook_state

# torch's note on a full backward hook of a module whose inputs need no gradient: what these tests set up.
# And one step profiled under a meter, which slows it: these tests read FLOPs and bytes, and time sleeps.
pytestmark = [pytest.mark.filterwarnings("ignore:Full backward hook is firing"),
              pytest.mark.filterwarnings("ignore:only one step was profiled")]

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


@pytest.mark.parametrize("where", ["", "0"])
def test_the_flops_of_a_full_backward_hook_count_in_its_module_as_its_time_does(where: str) -> None:
    # Opacus computes per-sample gradients in full backward hooks; the first layer's (its input needs no gradient)
    # runs in the node torch wraps its outputs in. Its FLOPs went to the parent's own (the root's hook's to none).
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))
    model.get_submodule(where).register_full_backward_hook(lambda m, gi, go: [go[0].t() @ go[0]] and None)
    with LayerProf(model, metrics=("flops",)) as prof:
        model(torch.randn(4, 8)).sum().backward()
    records = prof.records
    # The step without the hook: '0' grad of W only (x needs none) 2*4*8*16 = 1024; '2' grad of W and of its input,
    # 2*4*16*2 = 256 each.
    assert records["0"].flops_forward == 1024 and records["2"].flops_backward == 512
    if where == "0":
        # go[0] is 4x16: (16x4) @ (4x16) = 2*16*4*16 = 2048 FLOPs, '0''s own, in its backward.
        assert records["0"].flops_backward == 1024 + 2048 and records["0"].self_flops == 1024 + 1024 + 2048
        assert records[""].flops_backward == 1024 + 2048 + 512 and records[""].self_flops == 0
    else:
        # go[0] is 4x2: (2x4) @ (4x2) = 2*2*4*2 = 32 FLOPs, the root's own.
        assert records["0"].flops_backward == 1024
        assert records[""].flops_backward == 1024 + 512 + 32 and records[""].self_flops == 32


def test_opacus_per_sample_gradients_of_the_first_layer_count_in_it() -> None:
    # Opacus's GradSampleModule computes each layer's per-sample gradients in its full backward hook; the first
    # layer's runs in the node torch wraps its outputs in (its input needs no gradient). Its time and FLOPs went to
    # the wrapped Sequential's own, which runs no op of its own.
    opacus = pytest.importorskip("opacus")
    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 6 * 6, 3))
    model = opacus.GradSampleModule(net)
    x, target = torch.randn(2, 3, 6, 6), torch.tensor([0, 2])

    def step() -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        model.zero_grad(set_to_none=True)
        for p in model.parameters():
            p.grad_sample = None
        nn.functional.cross_entropy(model(x), target).backward()
        return ([p.grad.clone() for p in model.parameters()], [p.grad_sample.clone() for p in model.parameters()])

    plain = step()
    before = hook_state(model)
    with LayerProf(model, metrics=("flops",)) as prof:
        profiled = step()
    assert all(torch.equal(a, b) for a, b in zip(plain[0] + plain[1], profiled[0] + profiled[1]))
    assert hook_state(model) == before  # Opacus's hooks still there, none of ours
    conv, wrapped = prof.records["_module.0"], prof.records["_module"]
    # The convolution's forward 2*2*4*36*27 = 15552; its weight's gradient (x needs none) the same contraction,
    # and Opacus's per-sample gradient on top of it (an einsum of the unfolded input, 2*2*4*27*36 in Opacus 1.x).
    assert conv.flops_forward == 15552 and conv.flops_backward > 15552
    if opacus.__version__.startswith("1."):
        assert conv.flops_backward == 15552 + 15552
    assert wrapped.self_flops == 0 and prof.records[""].self_flops == 0
    assert conv.backward_ms is not None and conv.backward_ms > 0


@pytest.mark.parametrize("metrics", [("memory",), ("live_memory",), ("flops", "memory", "shapes")])
def test_per_sample_gradients_with_expanded_weights_run_under_the_memory_meters(metrics: tuple[str, ...]) -> None:
    # torch's call_for_per_sample_grads (Opacus's grad_sample_mode="ew") puts an ExpandedWeight in place of each
    # parameter for the forward, which raises on any attribute read. The memory meter read the first parameter's
    # dtype at the first saved tensor: the user's forward raised "Expanded Weights encountered but cannot handle
    # function __get__".
    from torch.nn.utils._per_sample_grad import call_for_per_sample_grads

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))
    x = torch.randn(4, 8)

    def step() -> list[torch.Tensor]:
        model.zero_grad(set_to_none=True)
        for p in model.parameters():
            p.grad_sample = None
        call_for_per_sample_grads(model)(x).sum().backward()
        return [p.grad_sample.clone() for p in model.parameters()]

    plain = step()
    before = hook_state(model)
    with LayerProf(model, metrics=metrics) as prof:
        profiled = step()
    assert all(torch.equal(a, b) for a, b in zip(plain, profiled))
    assert hook_state(model) == before
    assert all(record.calls == 1 and record.backward_ms is not None for record in prof.records.values())
    # ReLU saves its output for backward: 4 x 16 float32 = 256 bytes. (Expanded Weights keep a Linear's input on
    # their Function's ctx, out of sight of saved-tensor hooks: not counted.)
    assert prof.records["1"].saved_bytes == 256 and prof.records[""].saved_bytes == 256
