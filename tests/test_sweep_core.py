"""Real training and inference code under the core collection and meters: the cases a sweep found wrong."""
from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

from layerprof import LayerProf

from .conftest import hook_state


def _dynamic_quantized(model: nn.Module, dtype: torch.dtype) -> nn.Module:
    if "none" in torch.backends.quantized.supported_engines and len(torch.backends.quantized.supported_engines) == 1:
        pytest.skip("this torch has no quantized engine")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch.ao.quantization is deprecated
        return torch.ao.quantization.quantize_dynamic(model.eval(), {nn.Linear}, dtype=dtype)


@pytest.mark.parametrize("dtype", [torch.qint8, torch.float16])
def test_dynamic_quantized_linear_is_counted(dtype: torch.dtype) -> None:
    # quantize_dynamic's Linear runs quantized::linear_dynamic (or its fp16 variant), which had no formula: the
    # whole model counted 0 FLOPs and the op was listed as unknown.
    model = _dynamic_quantized(nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4)), dtype)
    x = torch.randn(2, 3, 16)
    expected = model(x)
    before = hook_state(model)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "only one step was profiled")
        with torch.inference_mode(), LayerProf(model, metrics=("flops",)) as prof:
            output = model(x)
    assert torch.equal(output, expected) and hook_state(model) == before
    assert prof.unknown_ops() == {}
    assert prof.records["0"].flops_forward == 2 * 2 * 3 * 16 * 32  # x: [2, 3, 16] @ w: [16, 32] = 6144
    assert prof.records["2"].flops_forward == 2 * 2 * 3 * 32 * 4  # [2, 3, 32] @ [32, 4] = 1536
    assert prof.tree.flops_forward == 6144 + 1536 and prof.tree.flops_backward is None


def test_sparse_embedding_gradient_is_a_known_free_op() -> None:
    # nn.Embedding(sparse=True) builds its gradient with aten._sparse_coo_tensor_with_dims_and_tensors, a factory
    # that was listed as an op with no formula (and flagged under every FLOPs column).
    torch.manual_seed(0)
    model = nn.Sequential(nn.Embedding(100, 16, sparse=True), nn.Linear(16, 4))
    ids = torch.randint(0, 100, (4, 6))
    optimizer = torch.optim.SparseAdam(list(model[0].parameters()))
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "only one step was profiled")
        with LayerProf(model, metrics=("flops",)) as prof:
            model(ids).pow(2).mean().backward()
            optimizer.step()
    assert model[0].weight.grad.is_sparse
    assert prof.unknown_ops() == {} and prof.records["0"].unknown_ops == {}
    assert prof.records["0"].flops_backward == 0
    # the Linear's weight gradient and input gradient: 2 * 24 * 16 * 4 each
    assert prof.records["1"].flops_backward == 2 * (2 * 24 * 16 * 4)


@pytest.mark.filterwarnings("ignore::UserWarning")  # dynamo on layerprof's hooks, which the check refuses
def test_forward_compiled_inside_the_block_is_said_to_have_become_compiled() -> None:
    # The message said "the forward of module '1' ... is a torch.compile'd function while it was being profiled".
    model = nn.Sequential(nn.Linear(4, 8), nn.Sequential(nn.Linear(8, 8), nn.ReLU()), nn.Linear(8, 1))
    with pytest.raises(RuntimeError) as info:
        with LayerProf(model):
            model[1].forward = torch.compile(model[1].forward, backend="eager")
            model(torch.randn(2, 4)).sum().backward()
    assert str(info.value).startswith(
        "the profile is refused: the forward of module '1' (Sequential) became a torch.compile'd function while it "
        "was being profiled, and dynamo traces its calls")


def test_backward_after_vmap_over_the_model_is_timed() -> None:
    # vmap(model)(x) and a backward after it: inside vmap every module returns a batched wrapper whose grad_fn
    # is None (the graph is the wrapped value's), so no node was hooked and every module read "no backward".
    from torch.func import vmap

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 2))
    x = torch.randn(5, 4)
    vmap(model)(x).pow(2).sum().backward()
    expected = [p.grad.clone() for p in model.parameters()]
    model.zero_grad(set_to_none=True)
    before = hook_state(model)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "only one step was profiled")
        with LayerProf(model, metrics=("flops",)) as prof:
            vmap(model)(x).pow(2).sum().backward()
    assert all(torch.equal(p.grad, g) for p, g in zip(model.parameters(), expected))
    assert hook_state(model) == before
    records = prof.records
    assert all(records[name].backward_ms > 0 for name in ("", "0", "1", "2"))
    assert records["2"].backward_ms <= records[""].backward_ms and records["0"].backward_ms <= records[""].backward_ms
    # The FLOPs were counted already: 2 * 5 * 8 * 2 for the last Linear's weight and input gradients each,
    # 2 * 5 * 4 * 8 for the first one's weight gradient (x needs none).
    assert (records["2"].flops_backward, records["0"].flops_backward) == (320, 320)


def test_nested_vmap_over_a_module_is_timed() -> None:
    from torch.func import vmap

    model = nn.Linear(3, 2)
    with LayerProf(model) as prof:
        vmap(vmap(model))(torch.randn(4, 5, 3)).sum().backward()
    assert prof.records[""].calls == 1 and prof.records[""].backward_ms > 0


def test_a_self_backward_time_is_never_a_float_leftover() -> None:
    """A call's backward less its children's, where their intervals cover it, left round-off of the ms sums
    (2.2e-16 ms on BERT's root and encoder, shown "2.22e-13 µs"): below a nanosecond it is 0."""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.BertConfig(hidden_size=32, num_hidden_layers=4, num_attention_heads=2,
                                     intermediate_size=64, vocab_size=100)
    model, ids = transformers.BertModel(config), torch.randint(0, 100, (2, 16))
    values = []
    for _ in range(2):
        with LayerProf(model) as prof:
            for _ in range(3):
                model(input_ids=ids).last_hidden_state.sum().backward()
                prof.step()
        values += [record.self_backward_ms for record in prof.records.values()]
    assert not [value for value in values if value is not None and 0 < value < 1e-6]
    assert any(value == 0.0 for value in values) and any(value and value > 1e-3 for value in values)
