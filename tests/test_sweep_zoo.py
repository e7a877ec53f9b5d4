"""Real models and the code paths they take under the FLOP meter: the cases a sweep of Hugging Face and timm
architectures found wrong, and the architectures it checked that no other zoo covers."""
from __future__ import annotations

import warnings
from typing import Any, Callable

import pytest
import torch
from torch import nn

from layerprof import LayerProf

from .conftest import hook_state
from .invariants import check_profile
from .zoo_checks import flop_counter, profiled_step_is_true, refuse_network, training_step

pytestmark = pytest.mark.filterwarnings("ignore:only one step was profiled:RuntimeWarning",
                                        "ignore::FutureWarning", "ignore::UserWarning")


@pytest.fixture(autouse=True)
def no_network(monkeypatch: pytest.MonkeyPatch) -> None:
    """Models from configs and pretrained=False download nothing."""
    refuse_network(monkeypatch, "zoo")


def _flex_attention() -> Callable[..., torch.Tensor]:
    flex = pytest.importorskip("torch.nn.attention.flex_attention")
    if not hasattr(torch.ops.higher_order, "flex_attention"):
        pytest.skip("this torch has no flex attention")
    return flex.flex_attention


class FlexAttention(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.flex = _flex_attention()

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return self.flex(q, k, v, enable_gqa=True)


def test_flex_attention_runs_and_is_counted_under_the_flop_meter() -> None:
    # flex_attention (transformers' attn_implementation="flex_attention") is a higher-order op that eager code
    # reaches through a torch.compile(fullgraph=True) of its own. Under the FLOP meter's dispatch mode dynamo
    # skipped that frame ("fullgraph=True found no compiled frames"), and the op itself was refused ("no rule
    # registered for HigherOrderOperator flex_attention"): the model raised.
    model = FlexAttention()
    torch.manual_seed(0)
    q, kv = torch.randn(2, 4, 8, 16), torch.randn(2, 2, 8, 16)  # grouped-query: 4 query heads, 2 key-value heads
    with torch.no_grad():  # flex attention has no backward on the CPU
        plain = model(q, kv, kv)
        before = hook_state(model)
        with LayerProf(model, metrics=("flops", "memory", "shapes")) as prof:
            profiled = model(q, kv, kv)
    assert torch.equal(plain, profiled) and hook_state(model) == before
    check_profile(prof, model, backward=False)
    assert prof.unknown_ops() == {}
    # dense scores and weighted sum over the query heads: 2 * b 2 * h 4 * s_q 8 * s_k 8 * (d 16 + d_v 16)
    assert prof.tree.flops_forward == 2 * 2 * 4 * 8 * 8 * (16 + 16) == 32_768


def test_flex_attention_runs_under_the_live_bytes_reader() -> None:
    # metrics=("live_memory",) raised as the FLOP meter did: "no rule registered for HigherOrderOperator
    # flex_attention and mode _Watch".
    model = FlexAttention()
    torch.manual_seed(0)
    q, kv = torch.randn(2, 4, 8, 16), torch.randn(2, 2, 8, 16)
    with torch.no_grad():
        plain = model(q, kv, kv)
        with LayerProf(model, metrics=("live_memory",)) as prof:
            profiled = model(q, kv, kv)
    assert torch.equal(plain, profiled)
    assert prof.tree.live_forward_ops >= 1


def test_flex_attention_backward_formula() -> None:
    # Its backward (CUDA) recomputes the scores, then dP, dV, dQ, dK: five products, as the fused SDPA kernels.
    from layerprof.metrics.formulas import flop_formula
    _flex_attention()
    backward = flop_formula(torch.ops.higher_order.flex_attention_backward)
    q, kv = torch.Size([2, 4, 8, 16]), torch.Size([2, 2, 8, 16])
    # 2 * b 2 * h 4 * s_q 8 * s_k 8 * (3 * d 16 + 2 * d_v 16)
    assert backward(q, kv, kv, q, torch.Size([2, 4, 8]), q) == 2 * 2 * 4 * 8 * 8 * (3 * 16 + 2 * 16) == 81_920


def test_a_compiled_function_in_a_forward_runs_compiled_and_is_counted() -> None:
    # A torch.compile'd helper called in a forward. Under the FLOP meter dynamo skipped its frame (a dispatch mode
    # was on the stack), so it ran eagerly: with inductor, other bits than the unprofiled run; with
    # fullgraph=True, an error. Now its compiled code runs, and the meter sees the ops that code calls.
    runs = []

    def backend(graph: torch.fx.GraphModule, example_inputs: Any) -> Callable[..., Any]:
        def run(*args: Any) -> Any:
            runs.append(1)
            return graph.forward(*args)
        return run

    torch._dynamo.reset()

    @torch.compile(backend=backend, fullgraph=True)
    def scores(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return (x @ w).softmax(-1)

    class Head(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.proj = nn.Linear(16, 32)
            self.w = nn.Parameter(torch.randn(32, 8))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return scores(self.proj(x), self.w)

    torch.manual_seed(0)
    model, x = Head(), torch.randn(4, 16)
    step = training_step(model, lambda: model(x))
    prof, _ = profiled_step_is_true(model, step)  # a plain step, then the profiled one: the same bits
    assert len(runs) == 2  # the profiled step ran the compiled graph too
    # forward: proj 2 * 4 * 16 * 32 = 4,096 and x @ w 2 * 4 * 32 * 8 = 2,048; backward: proj's weight gradient
    # 4,096 (x needs none), w's gradient and the input gradient of x @ w 2,048 each
    assert prof.tree.flops_forward == 4_096 + 2_048 and prof.records["proj"].flops_forward == 4_096
    assert prof.tree.flops_backward == 4_096 + 2 * 2_048


def _decoder(config: str, model: str, attention: str, **kwargs: Any) -> Callable[[], tuple[nn.Module, dict]]:
    """A causal language model from a tiny config, one padded sequence in its batch of 2."""
    def build() -> tuple[nn.Module, dict]:
        transformers = pytest.importorskip("transformers")
        built = getattr(transformers, model)(getattr(transformers, config)(**kwargs, attn_implementation=attention))
        ids = torch.randint(3, 100, (2, 8))
        mask = torch.ones_like(ids)
        mask[0, :3] = 0  # left padding
        return built, {"input_ids": ids, "attention_mask": mask, "labels": ids}
    return build


def _image_model(config: str, model: str, side: int, **kwargs: Any) -> Callable[[], tuple[nn.Module, dict]]:
    def build() -> tuple[nn.Module, dict]:
        transformers = pytest.importorskip("transformers")
        built = getattr(transformers, model)(getattr(transformers, config)(num_labels=2, **kwargs))
        return built, {"pixel_values": torch.randn(2, 3, side, side), "labels": torch.tensor([0, 1])}
    return build


def _timm(name: str, side: int) -> Callable[[], tuple[nn.Module, dict]]:
    def build() -> tuple[nn.Module, dict]:
        timm = pytest.importorskip("timm")
        return timm.create_model(name, pretrained=False, num_classes=10), {"x": torch.randn(2, 3, side, side)}
    return build


LLAMA = dict(vocab_size=100, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=64, use_cache=False)
NEOX = dict(vocab_size=100, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
            rotary_pct=0.5, max_position_embeddings=64, use_cache=False)

ZOO = {
    # Eager attention: matmuls, a padding mask added to the scores, softmax.
    "llama-eager": _decoder("LlamaConfig", "LlamaForCausalLM", "eager", **LLAMA),
    # Fused attention with a padding mask (the CPU flash kernel takes the mask).
    "gpt_neox-sdpa": _decoder("GPTNeoXConfig", "GPTNeoXForCausalLM", "sdpa", **NEOX),
    # Rotary embeddings on half of each head, parallel attention and MLP.
    "gpt_neox-eager": _decoder("GPTNeoXConfig", "GPTNeoXForCausalLM", "eager", **NEOX),
    # Depthwise 7x7 convolutions, LayerNorm over channels.
    "convnext": _image_model("ConvNextConfig", "ConvNextForImageClassification", 32, hidden_sizes=[8, 16],
                             depths=[1, 1], num_stages=2),
    # Inverted residuals, then transformers over unfolded patches, folded back.
    "mobilevit": _image_model("MobileViTConfig", "MobileViTForImageClassification", 64, image_size=64,
                              hidden_sizes=[16, 24, 32], neck_hidden_sizes=[8, 8, 16, 16, 24, 24, 48],
                              num_attention_heads=2),
    # Separable self-attention (a linear-cost attention of 1x1 convolutions), depthwise convolutions.
    "timm-mobilevitv2": _timm("mobilevitv2_050", 64),
}


@pytest.mark.parametrize("key", list(ZOO))
def test_zoo_model(key: str) -> None:
    # A training step bitwise the same as unprofiled, nothing left on the model, the invariants, every op priced;
    # the FLOPs FlopCounterMode's but for its grouped convolutions' weight gradient, which it counts as ungrouped
    # (groups - 1 forwards too many, formulas.py); then the eval forward, the same FLOPs and outputs.
    from .test_transformers_zoo import REFERENCE_FORMULAS
    torch.manual_seed(0)
    model, inputs = ZOO[key]()
    model.train()
    forward = (lambda: model(inputs["x"])) if "x" in inputs else (lambda: model(**inputs))
    prof, _ = profiled_step_is_true(model, training_step(model, forward))
    _, reference_forward, reference_total = flop_counter(model, forward, REFERENCE_FORMULAS)
    grouped = sum((module.groups - 1) * prof.records[name].flops_forward for name, module in model.named_modules()
                  if isinstance(module, nn.modules.conv._ConvNd) and module.groups > 1)
    root = prof.tree
    assert root.flops_forward == reference_forward > 0
    assert root.flops_forward + root.flops_backward == reference_total - grouped
    assert (grouped > 0) == (key in ("convnext", "mobilevit", "timm-mobilevitv2"))
    model.eval()
    with torch.no_grad():
        plain = forward()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with LayerProf(model, metrics=("flops", "memory", "shapes")) as evaluation:
                profiled = forward()
    first = (lambda output: output if isinstance(output, torch.Tensor) else output[0])
    assert torch.equal(first(plain), first(profiled))
    check_profile(evaluation, model, backward=False)
    assert evaluation.tree.flops_forward == root.flops_forward and evaluation.unknown_ops() == {}


def test_int8_matmul_is_counted() -> None:
    # torch._int_mm (int8 @ int8 -> int32, the matmul of torchao's int8 dynamic quantization) had no formula: it
    # counted 0 and was listed as unknown.
    class Int8Linear(nn.Module):
        def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
            return torch._int_mm(a, b)

    model = Int8Linear()
    a = torch.randint(-8, 8, (32, 64), dtype=torch.int8)
    b = torch.randint(-8, 8, (64, 16), dtype=torch.int8)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with LayerProf(model, metrics=("flops",)) as prof:
            out = model(a, b)
    assert torch.equal(out, torch._int_mm(a, b)) and prof.unknown_ops() == {}
    assert prof.tree.flops_forward == 2 * 32 * 64 * 16 == 65_536  # a: [32, 64] @ b: [64, 16]
