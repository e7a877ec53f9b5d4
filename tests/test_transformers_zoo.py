"""Hugging Face transformers built from tiny configs (no download): one training step under every meter, the
invariants, FLOPs against FlopCounterMode, a checkpoint plan applied and measured, the model in inference mode.

FlopCounterMode is the reference with the fused CPU attention kernel priced by its own formula for the flash kernel
(it prices ``_scaled_dot_product_flash_attention_for_cpu`` at 0). Where it is no reference it is said, model by
model, and the gap is asserted exactly: it prices a grouped convolution's weight gradient as an ungrouped one
(``groups - 1`` forwards too many: Wav2Vec2's positional convolution, Mamba's depthwise one), and it has no formula
for the experts' grouped matmul (``_grouped_mm``: Mixtral, Qwen2-MoE), which layerprof counts.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import pytest
import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode, sdpa_backward_flop_count, sdpa_flop_count

from layerprof import LayerProf

from .conftest import hook_state
from .invariants import check_profile, children_within, count_calls
from .zoo_checks import (flop_counter, half_plan_measures_as_predicted, profiled_step_is_true, refuse_network,
                         training_step)

transformers = pytest.importorskip("transformers")

pytestmark = pytest.mark.filterwarnings("ignore:only one step was profiled:RuntimeWarning",
                                        "ignore::FutureWarning")


@pytest.fixture(autouse=True)
def no_network(monkeypatch: pytest.MonkeyPatch) -> None:
    """Models from configs download nothing."""
    refuse_network(monkeypatch, "transformers")


def _query_heads(q: Any, kv: Any) -> tuple[int, ...]:
    """A key's or value's shape with as many heads as the query's: grouped-query attention (Llama's 2 key-value
    heads for 4 query heads) as the kernel broadcasts it. torch 2.14's formulas do this themselves; torch 2.11's
    assert that the heads are the same."""
    return (kv[0], q[1], *kv[2:])


def _cpu_flash_forward(q: Any, k: Any, v: Any, *args: Any, out_shape: Any = None, **kwargs: Any) -> int:
    return sdpa_flop_count(q, _query_heads(q, k), _query_heads(q, v))


def _cpu_flash_backward(grad: Any, q: Any, k: Any, v: Any, *args: Any, out_shape: Any = None, **kwargs: Any) -> int:
    return sdpa_backward_flop_count(grad, q, _query_heads(q, k), _query_heads(q, v))


aten = torch.ops.aten
REFERENCE_FORMULAS = {aten._scaled_dot_product_flash_attention_for_cpu: _cpu_flash_forward,
                      aten._scaled_dot_product_flash_attention_for_cpu_backward: _cpu_flash_backward}

BATCH, SEQ, VOCAB = 2, 8, 100
DECODER = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
               num_key_value_heads=2, max_position_embeddings=64, use_cache=False)
SEQ2SEQ = dict(vocab_size=VOCAB, d_model=32, encoder_layers=1, decoder_layers=1, encoder_attention_heads=2,
               decoder_attention_heads=2, encoder_ffn_dim=64, decoder_ffn_dim=64, use_cache=False)


def _tokens(n: int = SEQ) -> torch.Tensor:
    torch.manual_seed(0)
    return torch.randint(3, VOCAB, (BATCH, n))


def _language_model(config: str, model: str, **kwargs: Any) -> Callable[[], tuple[nn.Module, dict[str, Any]]]:
    def build() -> tuple[nn.Module, dict[str, Any]]:
        ids = _tokens()
        return getattr(transformers, model)(getattr(transformers, config)(**kwargs)), {"input_ids": ids,
                                                                                       "labels": ids}
    return build


def _whisper() -> tuple[nn.Module, dict[str, Any]]:
    config = transformers.WhisperConfig(**SEQ2SEQ, num_mel_bins=16,
                                        max_source_positions=8, max_target_positions=32, pad_token_id=0,
                                        decoder_start_token_id=1, bos_token_id=1, eos_token_id=2)
    model = transformers.WhisperForConditionalGeneration(config)
    torch.manual_seed(0)
    return model, {"input_features": torch.randn(BATCH, 16, 16), "labels": _tokens()}


def _clip() -> tuple[nn.Module, dict[str, Any]]:
    tower = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2)
    config = transformers.CLIPConfig(text_config=dict(tower, vocab_size=VOCAB, max_position_embeddings=16),
                                     vision_config=dict(tower, image_size=32, patch_size=8), projection_dim=16)
    model = transformers.CLIPModel(config)
    torch.manual_seed(0)
    return model, {"input_ids": _tokens(), "pixel_values": torch.randn(BATCH, 3, 32, 32), "return_loss": True}


def _wav2vec2() -> tuple[nn.Module, dict[str, Any]]:
    config = transformers.Wav2Vec2Config(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                                         intermediate_size=64, conv_dim=(16, 16), conv_stride=(5, 2),
                                         conv_kernel=(10, 3), num_conv_pos_embeddings=8,
                                         num_conv_pos_embedding_groups=4, mask_time_prob=0.0)
    model = transformers.Wav2Vec2ForCTC(config)
    torch.manual_seed(0)
    # No labels, a loss of the logits: under any TorchDispatchMode torch's CTC loss takes its tensor-lengths kernel,
    # which saves the two [2] int64 length tensors (32 bytes) for backward, so a profile with the FLOP meter holds
    # 32 bytes more than the memory-only run verify_plan measures.
    return model, {"input_values": torch.randn(BATCH, 400)}


def _image(config: str, model: str, **kwargs: Any) -> Callable[[], tuple[nn.Module, dict[str, Any]]]:
    def build() -> tuple[nn.Module, dict[str, Any]]:
        built = getattr(transformers, model)(getattr(transformers, config)(num_labels=2, **kwargs))
        torch.manual_seed(0)
        return built, {"pixel_values": torch.randn(BATCH, 3, 32, 32), "labels": torch.tensor([0, 1])}
    return build


@dataclass(frozen=True)
class HFModel:
    build: Callable[[], tuple[nn.Module, dict[str, Any]]]
    # FLOPs FlopCounterMode misses or adds, a function of the profile: (forward, total) to add to its figures
    reference_gap: Callable[[Any], tuple[int, int]] = lambda prof: (0, 0)
    gradient_checkpointing: bool = False  # transformers' own (model.gradient_checkpointing_enable())
    # A layer's last modules that its re-run never reaches: torch's non-reentrant checkpoint stops once the last
    # tensor the backward needs is saved again, and a matmul saves its inputs before it runs.
    not_rerun: tuple[str, ...] = ()
    side_effects: bool = False  # BatchNorm in training: the plan may recompute it
    # Under inference_mode any TorchDispatchMode (FlopCounterMode as well as the FLOP meter) gives a Linear on a
    # transposed 3-D input other bits (torch 2.14: Mamba's x_proj): the profiled output is then that under
    # FlopCounterMode, not the plain one.
    inference_bits_change_under_a_dispatch_mode: bool = False


def _experts(layers: int, tokens: int, hidden: int, intermediate: int, top_k: int) -> tuple[int, int]:
    """The grouped matmuls FlopCounterMode has no formula for: each routed token meets its expert's gate and up
    projections [hidden, 2 * intermediate] and down projection [intermediate, hidden]; the backward is twice the
    forward (the input gradient and the weight gradient)."""
    forward = layers * 2 * tokens * top_k * (hidden * 2 * intermediate + intermediate * hidden)
    return forward, 3 * forward


def _grouped_conv_weight_gradient(*names: str) -> Callable[[Any], tuple[int, int]]:
    """FlopCounterMode's weight gradient of a grouped convolution is ``groups`` forwards, not one."""
    def gap(prof: Any) -> tuple[int, int]:
        model = prof.model
        return 0, -sum((model.get_submodule(name).groups - 1) * prof.records[name].flops_forward for name in names)
    return gap


ZOO = {
    # Grouped-query attention, rotary embeddings, RMSNorm, SwiGLU, fused causal attention.
    "llama": HFModel(_language_model("LlamaConfig", "LlamaForCausalLM", **DECODER)),
    # Each layer re-run but for its down projection (after its input, the residual add saves nothing): 2 layers
    # * (311,296 - 65,536) = 491,520 FLOPs recomputed, as FlopCounterMode's total says.
    "llama+checkpointing": HFModel(_language_model("LlamaConfig", "LlamaForCausalLM", **DECODER),
                                   gradient_checkpointing=True, not_rerun=("mlp.down_proj",)),
    # A sliding window of 4 in every layer: the mask is no longer causal alone.
    "mistral": HFModel(_language_model("MistralConfig", "MistralForCausalLM", **DECODER, sliding_window=4)),
    # Logit soft-capping, local and global layers alternating, eager attention.
    "gemma2": HFModel(_language_model("Gemma2Config", "Gemma2ForCausalLM", **DECODER, head_dim=8, sliding_window=4)),
    # Mixture of experts: 16 tokens routed to 2 of 4 experts each, the experts in one grouped matmul.
    "mixtral": HFModel(_language_model("MixtralConfig", "MixtralForCausalLM", **DECODER, num_local_experts=4,
                                       num_experts_per_tok=2),
                       reference_gap=lambda prof: _experts(2, BATCH * SEQ, 32, 64, 2)),
    # Shared expert beside the routed ones (experts of intermediate size 32).
    "qwen2_moe": HFModel(_language_model("Qwen2MoeConfig", "Qwen2MoeForCausalLM", **DECODER, num_experts=4,
                                         num_experts_per_tok=2, moe_intermediate_size=32,
                                         shared_expert_intermediate_size=32),
                         reference_gap=lambda prof: _experts(2, BATCH * SEQ, 32, 32, 2)),
    # ALiBi: the position bias enters the scores through baddbmm.
    "bloom": HFModel(_language_model("BloomConfig", "BloomForCausalLM", vocab_size=VOCAB, hidden_size=32, n_layer=2,
                                     n_head=4, use_cache=False)),
    # Local attention in every other layer, eager attention.
    "gpt_neo": HFModel(_language_model("GPTNeoConfig", "GPTNeoForCausalLM", vocab_size=VOCAB, hidden_size=32,
                                       num_layers=2, num_heads=2, attention_types=[[["global", "local"], 1]],
                                       window_size=4, max_position_embeddings=64, use_cache=False)),
    # Multi-query attention.
    "gpt_bigcode": HFModel(_language_model("GPTBigCodeConfig", "GPTBigCodeForCausalLM", vocab_size=VOCAB, n_embd=32,
                                           n_layer=2, n_head=4, n_positions=64, multi_query=True, use_cache=False)),
    # A state-space model: depthwise causal convolution and the selective scan in plain torch.
    "mamba": HFModel(_language_model("MambaConfig", "MambaForCausalLM", vocab_size=VOCAB, hidden_size=32,
                                     state_size=4, num_hidden_layers=2, expand=2, conv_kernel=4, use_mambapy=False,
                                     use_cache=False),
                     # Its conv1d runs functionally (the module is not called): 64 channels in 64 groups, kernel 4,
                     # 8 tokens padded by 3 -> 11 positions, 2 * 2 * 11 * 64 * 4 = 11,264 FLOPs forward, 63 times
                     # that too many in FlopCounterMode's weight gradient, in each of 2 layers.
                     reference_gap=lambda prof: (0, -2 * 63 * 2 * BATCH * 11 * 64 * 4),
                     inference_bits_change_under_a_dispatch_mode=True),
    # Encoder-decoder sharing one embedding between encoder, decoder (called twice a step).
    "bart": HFModel(_language_model("BartConfig", "BartForConditionalGeneration", **SEQ2SEQ,
                                    max_position_embeddings=64)),
    # Every block re-run whole (a dropout after its last linear saves its mask).
    "t5+checkpointing": HFModel(_language_model("T5Config", "T5ForConditionalGeneration", vocab_size=VOCAB,
                                                d_model=32, d_kv=8, d_ff=64, num_layers=1, num_heads=2,
                                                decoder_start_token_id=0, use_cache=False),
                                gradient_checkpointing=True),
    # Speech: a convolutional front end on mel features, then an encoder-decoder.
    "whisper": HFModel(_whisper),
    # Raw audio: a convolutional feature encoder, a grouped positional convolution under weight norm.
    "wav2vec2": HFModel(_wav2vec2, reference_gap=_grouped_conv_weight_gradient(
        "wav2vec2.encoder.pos_conv_embed.conv")),
    # Two towers and a contrastive loss.
    "clip": HFModel(_clip),
    # Disentangled relative-position attention.
    "deberta_v2": HFModel(_language_model("DebertaV2Config", "DebertaV2ForMaskedLM", vocab_size=VOCAB,
                                          hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                          intermediate_size=64, max_position_embeddings=64, relative_attention=True,
                                          position_buckets=8, max_relative_positions=16,
                                          pos_att_type=["p2c", "c2p"])),
    # Bottlenecks and NoNorm (an elementwise affine in place of LayerNorm).
    "mobilebert": HFModel(_language_model("MobileBertConfig", "MobileBertForMaskedLM", vocab_size=VOCAB,
                                          hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                          intermediate_size=64, embedding_size=16, intra_bottleneck_size=16,
                                          num_feedforward_networks=2, true_hidden_size=16)),
    # Shifted windows (torch.roll) with a relative position bias, patch merging.
    "swin": HFModel(_image("SwinConfig", "SwinForImageClassification", image_size=32, patch_size=4, embed_dim=16,
                           depths=[1, 1], num_heads=[1, 2], window_size=4)),
    # BatchNorm in training.
    "resnet": HFModel(_image("ResNetConfig", "ResNetForImageClassification", embedding_size=8, hidden_sizes=[8, 16],
                             depths=[1, 1]), side_effects=True),
}


def hf_step(key: str) -> tuple[nn.Module, dict[str, Any], Callable[[], tuple[torch.Tensor, list[Any]]]]:
    """The model in training mode, its inputs, and a repeatable training step returning (loss, gradients)."""
    spec = ZOO[key]
    torch.manual_seed(0)
    model, inputs = spec.build()
    model.train()
    if spec.gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    return model, inputs, training_step(model, lambda: model(**inputs))


@pytest.mark.parametrize("key", list(ZOO))
def test_transformers_model(key: str) -> None:
    spec = ZOO[key]
    model, inputs, step = hf_step(key)
    # Bitwise the same step, nothing left on the model, every module present with its calls.
    prof, plain = profiled_step_is_true(model, step)

    # FLOPs: the forward against FlopCounterMode module by module, the step's total, the recomputation.
    root = prof.tree
    per_module, forward, total = flop_counter(model, lambda: model(**inputs), REFERENCE_FORMULAS)
    forward_gap, total_gap = spec.reference_gap(prof)
    assert root.flops_forward == forward + forward_gap
    recompute = root.flops_recompute or 0
    # FlopCounterMode's total counts a checkpoint's re-run too.
    assert root.flops_forward + root.flops_backward + recompute == total + total_gap
    if not forward_gap:
        for name, record in prof.records.items():
            assert (record.flops_forward or 0) == per_module.get(name, 0), name
    assert (recompute > 0) == spec.gradient_checkpointing
    if spec.gradient_checkpointing:
        # transformers checkpoints each layer: its re-run is its forward again, apart from the forward.
        layers = [name for name, module in model.named_modules()
                  if isinstance(module, transformers.modeling_layers.GradientCheckpointingLayer)]
        skipped = [f"{layer}.{suffix}" for layer in layers for suffix in spec.not_rerun]
        assert layers and recompute == (sum(prof.records[name].flops_forward for name in layers)
                                        - sum(prof.records[name].flops_forward for name in skipped))
        assert all(prof.records[name].flops_recompute == 0 for name in skipped)
        return  # the model checkpoints itself: no plan on top

    # A plan to half the saved bytes, applied and measured: exactly as predicted, within budget, same step.
    half_plan_measures_as_predicted(prof, model, step, plain, allow_side_effects=spec.side_effects)

    # In inference mode: the same outputs, calls and forward FLOPs (dropout is free), no backward.
    model.eval()
    kwargs = {name: value for name, value in inputs.items() if name not in ("labels", "return_loss")}
    if model.config.is_encoder_decoder:
        kwargs["decoder_input_ids"] = inputs["labels"]
    with torch.inference_mode():
        plain = model(**kwargs)
        with count_calls(model) as reference, LayerProf(model, metrics=("flops", "memory", "shapes")) as inference:
            profiled = model(**kwargs)
    if spec.inference_bits_change_under_a_dispatch_mode:
        with torch.inference_mode(), FlopCounterMode(display=False):
            under_mode = model(**kwargs)
        assert torch.equal(profiled[0], under_mode[0]) and torch.allclose(plain[0], profiled[0], rtol=0, atol=1e-6)
    else:
        assert torch.equal(plain[0], profiled[0])
    check_profile(inference, model, backward=False)
    assert {name: record.calls for name, record in inference.records.items()} == {
        name: reference[name] for name in inference.records}
    assert inference.tree.flops_forward == root.flops_forward and inference.unknown_ops() == {}


def test_llama_generation_counts_every_decoding_step() -> None:
    # generate() with a key/value cache: the prompt's forward, then one forward per new token on one position.
    model, inputs, _ = hf_step("llama")
    model.eval()
    model.generation_config.pad_token_id = 0
    before = hook_state(model)
    prompt = inputs["input_ids"]
    plain = model.generate(prompt, max_new_tokens=4, do_sample=False, use_cache=True)
    with count_calls(model) as reference, LayerProf(model, metrics=("flops", "memory", "shapes")) as prof:
        profiled = model.generate(prompt, max_new_tokens=4, do_sample=False, use_cache=True)
    assert torch.equal(plain, profiled) and profiled.shape == (2, 8 + 4)
    assert hook_state(model) == before
    check_profile(prof, model, backward=False)
    # 4 forwards: the 8-token prompt and 3 single tokens (the 4th new token needs no forward after it).
    assert {name: record.calls for name, record in prof.records.items()} == {
        name: reference[name] for name in prof.records}
    assert prof.records["model.layers.0.self_attn"].calls == 4 and prof.unknown_ops() == {}
    with FlopCounterMode(display=False, custom_mapping=REFERENCE_FORMULAS) as counter:
        model.generate(prompt, max_new_tokens=4, do_sample=False, use_cache=True)
    assert prof.tree.flops_forward == counter.get_total_flops()
    # generate() asks for the last position's logits only (logits_to_keep=1): 4 forwards * 2 * 2 rows * 32 * 100
    # = 51,200 FLOPs in the head, not the prompt's 8 positions.
    assert prof.records["lm_head"].flops_forward == 4 * 2 * 2 * 32 * 100


def test_layers_extending_a_key_value_cache_are_never_recomputed() -> None:
    # Mistral as transformers builds it, use_cache=True: in training too each layer extends a cache it is handed.
    # allow_side_effects=True let the plan wrap them, and the recomputation attended over the 3 keys the sliding
    # window kept plus the 8 the forward appended: "size of tensor a (11) must match ... (8)" in backward.
    config = {**DECODER, "use_cache": True}
    model, inputs = _language_model("MistralConfig", "MistralForCausalLM", **config, sliding_window=4)()
    step = training_step(model.train(), lambda: model(**inputs))
    prof, plain = profiled_step_is_true(model, step)
    records = prof.records
    # Each decoder layer and its attention are handed the cache: 2 layers * 2 = 4 calls in the model.
    assert [records[name].checkpoint_cache_updates for name in ("", "model.layers.0", "model.layers.0.self_attn",
                                                                 "model.layers.0.mlp")] == [4, 2, 1, 0]
    assert not any(record.checkpoint_side_effects for record in records.values())
    plan = prof.checkpoint_plan(0.5, allow_side_effects=True)
    assert plan.excluded["model.layers.1.self_attn"] == (
        "updates a key/value cache it is handed (a recompute would find it extended): pass use_cache=False for "
        "training, as gradient_checkpointing_enable() does")
    assert not [name for name in plan.modules if records[name].checkpoint_cache_updates]
    # Half is out of reach without the attention layers (the note says so, and what lets a plan wrap them); two
    # thirds is within.
    assert not plan.feasible and "cannot be met" in str(plan)
    assert ("; 6 modules updating a key/value cache they are handed are excluded: profile with use_cache=False (as "
            "gradient_checkpointing_enable() sets it) to let a plan wrap them. Plan for that or more") in plan.note
    half_plan_measures_as_predicted(prof, model, step, plain, allow_side_effects=True, budget=0.67)


def _generation_model(key: str) -> tuple[nn.Module, dict[str, Any]]:
    """An encoder-decoder from a tiny config, in eval mode, that generates 4 tokens whatever it predicts."""
    torch.manual_seed(0)
    if key == "bart":
        config = transformers.BartConfig(**SEQ2SEQ, max_position_embeddings=64, forced_eos_token_id=None)
        model, inputs = transformers.BartForConditionalGeneration(config), {"input_ids": _tokens()}
    elif key == "t5":
        config = transformers.T5Config(vocab_size=VOCAB, d_model=32, d_kv=8, d_ff=64, num_layers=1, num_heads=2,
                                       decoder_start_token_id=0)
        model, inputs = transformers.T5ForConditionalGeneration(config), {"input_ids": _tokens()}
    else:
        model, features = _whisper()
        model.generation_config.forced_decoder_ids = None
        inputs = {"input_features": features["input_features"]}
    return model.eval(), inputs


@pytest.mark.parametrize("key", ["bart", "t5", "whisper"])
def test_encoder_decoder_generation_counts_the_encoder_in_the_model(key: str) -> None:
    # generate() calls the encoder once by itself (model.get_encoder()(...)), outside every call of the model, then
    # the whole model once per token: the model and its base model adopt the encoder's call (record/adoption.py).
    model, inputs = _generation_model(key)
    settings = dict(max_new_tokens=4, min_new_tokens=4, do_sample=False, use_cache=True, num_beams=1)
    plain = model.generate(**inputs, **settings)
    with count_calls(model) as reference, LayerProf(model, metrics=("flops", "memory")) as prof:
        profiled = model.generate(**inputs, **settings)
    assert torch.equal(plain, profiled)
    records = prof.records
    # Every module present, with its own calls: the model 4 (one a token), the encoder 1.
    assert list(records) == [name for name, _ in model.named_modules(remove_duplicate=True)]
    assert {name: record.calls for name, record in records.items()} == {name: reference[name] for name in records}
    encoder_name = next(name for name, module in model.named_modules() if module is model.get_encoder())
    base = encoder_name.rpartition(".")[0]
    root, encoder = records[""], records[encoder_name]
    assert root.calls == 4 and encoder.calls == 1 and records[base].calls == 4
    # Times: the model's own calls plus the encoder's call, in the model and the base model; nothing else adopted.
    check_profile(prof, model, backward=False)
    by_itself = encoder.call_times[0].forward_ms
    for record in (root, records[base]):
        assert record.forward_ms == pytest.approx(sum(t.forward_ms for t in record.call_times) + by_itself, abs=1e-6)
    # Children never exceed their parent, in time, FLOPs and memory, nor do their sums.
    children_within(prof, ("forward_ms", "flops_forward", "activation_bytes"))
    # FLOPs: the root's are every op of generate() inside the model, FlopCounterMode's whole count; the root and
    # the base model have no FLOPs of their own code, so theirs are their children's: the encoder's call by itself
    # in (BART, Whisper: the base model's encoder and decoder; T5: the root's encoder, decoder and head).
    with FlopCounterMode(display=False, custom_mapping=REFERENCE_FORMULAS) as counter:
        model.generate(**inputs, **settings)
    assert root.flops_forward == counter.get_total_flops()
    for record in {root.name: root, base: records[base]}.values():
        assert record.self_flops == 0
        assert record.flops_forward == sum(child.flops_forward for child in record.children if child.calls)
    assert encoder.flops_forward > 0 and prof.unknown_ops() == {}
