"""The Hugging Face ecosystem beyond the Trainer, as users combine it with layerprof: diffusers (a UNet and a VAE
from small configs, their attention processors, their own gradient checkpointing), accelerate (a prepared model,
gradient accumulation, bf16 autocast, a DDP wrapper), PEFT (LoRA, DoRA, ``modules_to_save``, two adapters) and
sentence-transformers. Each part skips where its package is not installed; nothing is downloaded."""
from __future__ import annotations

import copy
import socket
import warnings

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from layerprof import LayerProf

from .conftest import hook_state
from .zoo_checks import half_plan_measures_as_predicted, profiled_step_is_true, refuse_network, same_step, training_step

# One-step profiles are the point here; their times are not used.
pytestmark = pytest.mark.filterwarnings("ignore:only one step was profiled:RuntimeWarning")


@pytest.fixture(autouse=True)
def _offline(monkeypatch: pytest.MonkeyPatch) -> None:
    refuse_network(monkeypatch, "Hugging Face ecosystem")


def _containers_only(prof: LayerProf) -> None:
    """Every module ran with times, but the containers that are iterated and never called."""
    for name, record in prof.records.items():
        if record.calls:
            assert record.forward_ms is not None and record.forward_ms >= 0, name
        else:
            assert record.type in ("ModuleList", "ModuleDict"), name


# -- diffusers ----------------------------------------------------------------------------------------------------
ATTENTION = "down_blocks.0.attentions.0.transformer_blocks.0."
BATCH, TOKENS, WIDTH = 2, 7, 32  # the UNet's batch, its text tokens and their width (cross-attention dim)


def _unet() -> tuple[nn.Module, object]:
    """A 2-level UNet2DConditionModel (32 and 64 channels, cross-attention at 32x32) and its denoising step: the MSE
    of the predicted noise."""
    diffusers = pytest.importorskip("diffusers")
    torch.manual_seed(0)
    unet = diffusers.UNet2DConditionModel(
        sample_size=32, in_channels=4, out_channels=4, block_out_channels=(32, 64), layers_per_block=1,
        down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"), up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"),
        cross_attention_dim=WIDTH, attention_head_dim=8, norm_num_groups=32).train()
    latents, noise = torch.randn(BATCH, 4, 32, 32), torch.randn(BATCH, 4, 32, 32)
    timesteps, text = torch.tensor([10, 500]), torch.randn(BATCH, TOKENS, WIDTH)

    def forward() -> torch.Tensor:
        predicted = unet(latents + noise, timesteps, encoder_hidden_states=text).sample
        return nn.functional.mse_loss(predicted, noise)

    return unet, training_step(unet, forward)


# Hand-counted forward FLOPs at the first level: 1024 positions of 32 channels, batch 2 (1 MAC = 2 FLOPs).
POSITIONS, CHANNELS = 32 * 32, 32
LINEAR = 2 * BATCH * POSITIONS * CHANNELS * CHANNELS                   # to_q, to_k, to_v, to_out: 4,194,304 each
SELF_ATTENTION = 4 * LINEAR + 4 * BATCH * POSITIONS * POSITIONS * CHANNELS  # QK^T and AV: 268,435,456 -> 285,212,672
TEXT_LINEAR = 2 * BATCH * TOKENS * WIDTH * CHANNELS                    # to_k, to_v over the 7 tokens: 28,672 each
CROSS_ATTENTION = 2 * LINEAR + 2 * TEXT_LINEAR + 4 * BATCH * POSITIONS * TOKENS * CHANNELS  # 10,280,960
CONV_IN = 2 * BATCH * POSITIONS * CHANNELS * 4 * 3 * 3                 # 4 -> 32 channels, 3x3: 4,718,592


def test_unet_denoising_step_is_true_with_exact_flops_and_a_plan_that_measures_as_predicted() -> None:
    unet, step = _unet()
    prof, plain = profiled_step_is_true(unet, step)  # bitwise the same step, nothing left, every op priced
    _containers_only(prof)
    records = prof.records
    assert records["conv_in"].flops_forward == CONV_IN
    assert records[ATTENTION + "attn1.to_q"].flops_forward == LINEAR
    # The attention block through its processor (AttnProcessor2_0: torch's SDPA) holds its Linears and the SDPA.
    assert records[ATTENTION + "attn1"].flops_forward == SELF_ATTENTION
    assert records[ATTENTION + "attn2.to_k"].flops_forward == TEXT_LINEAR
    assert records[ATTENTION + "attn2"].flops_forward == CROSS_ATTENTION
    half_plan_measures_as_predicted(prof, unet, step, plain, allow_side_effects=False)


def test_unet_attention_processors_swapped_between_blocks() -> None:
    processors = pytest.importorskip("diffusers.models.attention_processor")
    unet, step = _unet()
    plain = step()
    with LayerProf(unet, metrics=("flops",)) as fused:
        step()
    # The reference processor (baddbmm, softmax, bmm: other roundings than SDPA's) counts the same forward FLOPs.
    unet.set_attn_processor(processors.AttnProcessor())
    plain_reference = step()
    with LayerProf(unet, metrics=("flops",)) as reference:
        assert same_step(step(), plain_reference)
    for prof in (fused, reference):
        assert prof.unknown_ops() == {}
        assert prof.records[ATTENTION + "attn1"].flops_forward == SELF_ATTENTION
        assert prof.records[ATTENTION + "attn2"].flops_forward == CROSS_ATTENTION
    # A processor that is a module (Custom Diffusion's, with Linears of its own) is registered as the attention's
    # child, and taken off again when a plain processor replaces it: the next block walks the model anew.
    custom = {name: processors.CustomDiffusionAttnProcessor2_0(
        train_kv=True, train_q_out=False, hidden_size=unet.get_submodule(name.removesuffix(".processor")).inner_dim,
        cross_attention_dim=WIDTH if "attn2" in name else None) for name in unet.attn_processors}
    unet.set_attn_processor(custom)
    with LayerProf(unet, metrics=("flops",)) as customized:
        step()
    added = ATTENTION + "attn2.processor.to_k_custom_diffusion"
    assert customized.records[added].calls == 1 and customized.records[added].flops_forward == TEXT_LINEAR
    assert customized.unknown_ops() == {}
    unet.set_attn_processor(processors.AttnProcessor2_0())
    with LayerProf(unet, metrics=("flops",)) as restored:
        assert same_step(step(), plain)
    assert list(restored.records) == list(fused.records) == [name for name, _ in unet.named_modules()]


def test_unet_own_gradient_checkpointing_stays_true_and_the_planner_nests_around_it() -> None:
    unet, step = _unet()
    plain = step()
    unet.enable_gradient_checkpointing()
    # The profile of the checkpointed UNet: the same step bitwise, re-runs apart from calls (profiled_step_is_true
    # counts them against torch's global hook), and a re-run's FLOPs as recomputation.
    prof, checkpointed = profiled_step_is_true(unet, step)
    assert same_step(checkpointed, plain)
    attention = prof.records[ATTENTION + "attn1"]
    assert attention.calls == 1 and attention.flops_forward == attention.flops_recompute == SELF_ATTENTION
    assert attention.recompute_ms > 0
    # diffusers checkpoints each resnet and transformer block from its parent: the plan names them as the model's
    # own, measures as predicted with its wrappers around theirs, and leaves their step as it was.
    plan = prof.checkpoint_plan(0.5)
    assert "down_blocks.0.resnets.0" in plan.already_recomputed
    assert ATTENTION.rstrip(".") in plan.already_recomputed
    half_plan_measures_as_predicted(prof, unet, step, plain, allow_side_effects=False)


def test_vae_step_is_true_with_exact_attention_flops() -> None:
    diffusers = pytest.importorskip("diffusers")
    torch.manual_seed(0)
    vae = diffusers.AutoencoderKL(
        in_channels=3, out_channels=3, down_block_types=("DownEncoderBlock2D",) * 2,
        up_block_types=("UpDecoderBlock2D",) * 2, block_out_channels=(32, 64), layers_per_block=1, latent_channels=4,
        norm_num_groups=32, sample_size=32).train()
    images = torch.randn(2, 3, 32, 32)

    def forward() -> torch.Tensor:  # a sampled latent (seeded), decoded: the reconstruction's MSE
        decoded = vae(images, sample_posterior=True, generator=torch.Generator().manual_seed(0)).sample
        return nn.functional.mse_loss(decoded, images)

    step = training_step(vae, forward)
    prof, plain = profiled_step_is_true(vae, step)
    _containers_only(prof)
    # The mid-blocks' single-head attention at 16x16 (256 positions) over 64 channels, batch 2: four Linears of
    # 2*2*256*64*64 = 4,194,304 and the SDPA's 4*2*256*256*64 = 33,554,432.
    for name in ("encoder.mid_block.attentions.0", "decoder.mid_block.attentions.0"):
        assert prof.records[name].flops_forward == 4 * 4_194_304 + 33_554_432
    half_plan_measures_as_predicted(prof, vae, step, plain, allow_side_effects=False)


# -- accelerate ---------------------------------------------------------------------------------------------------
def _accelerated(**options: object) -> tuple[object, nn.Module, nn.Module, object, object]:
    """An Accelerator and what it prepared: a small regressor, its SGD and a loader of 8 batches of 4."""
    accelerate = pytest.importorskip("accelerate")
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    data = DataLoader(TensorDataset(torch.randn(32, 16), torch.randn(32, 1)), batch_size=4)
    accelerator = accelerate.Accelerator(cpu=True, **options)
    prepared, optimizer, data = accelerator.prepare(model, optimizer, data)
    return accelerator, model, prepared, optimizer, data


def _train(accelerator, prepared, optimizer, data, prof: LayerProf | None) -> list[torch.Tensor]:
    """One epoch with ``accelerator.accumulate``; a layerprof step per optimizer step. Returns the parameters."""
    for x, y in data:
        with accelerator.accumulate(prepared):
            accelerator.backward(nn.functional.mse_loss(prepared(x), y))
            optimizer.step()
            optimizer.zero_grad()
        if prof is not None and accelerator.sync_gradients:
            prof.step()
    return [p.detach().clone() for p in prepared.parameters()]


@pytest.fixture
def _accelerate_state():
    """accelerate keeps its state per process: each test starts from none and leaves none."""
    accelerate = pytest.importorskip("accelerate")
    accelerate.state.AcceleratorState._reset_state(True)
    accelerate.state.GradientState._reset_state()
    yield
    accelerate.state.AcceleratorState._reset_state(True)
    accelerate.state.GradientState._reset_state()


@pytest.mark.usefixtures("_accelerate_state")
def test_accelerate_prepared_model_with_accumulation_and_bf16() -> None:
    accelerator, model, prepared, optimizer, data = _accelerated(gradient_accumulation_steps=2,
                                                                 mixed_precision="bf16")
    # On one process prepare() hands back the model itself (its forward under autocast): either name profiles it.
    assert prepared is model and accelerator.unwrap_model(prepared) is model
    start = copy.deepcopy(model.state_dict())
    unprofiled = _train(accelerator, prepared, optimizer, data, None)
    model.load_state_dict(start)
    before = hook_state(model)
    with LayerProf(accelerator.unwrap_model(prepared), metrics=("flops", "shapes")) as prof:
        profiled = _train(accelerator, prepared, optimizer, data, prof)
    assert all(torch.equal(a, b) for a, b in zip(unprofiled, profiled))  # the same training, bitwise
    assert hook_state(model) == before
    root, first = prof.records[""], prof.records["0"]
    # 8 batches, 4 optimizer steps of 2 micro-batches: the meters ran in the first, the times come from the others.
    assert root.steps == 3 and root.calls == 2
    assert first.flops_forward == 2 * (2 * 4 * 16 * 32)  # two micro-batches of 4: 2 * 4 * 16 * 32 FLOPs each
    assert prof.unknown_ops() == {}
    # The Linears ran in bf16 under accelerate's autocast; the model's output is float32 again (accelerate's
    # convert_to_fp32 around the forward, inside the root's call).
    assert first.output_dtypes == ["bfloat16"] and first.input_dtypes == ["float32"]
    assert root.output_dtypes == ["float32"]


@pytest.mark.usefixtures("_accelerate_state")
def test_accelerate_ddp_wrapper_or_its_model_profile_the_same_modules(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("accelerate")
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    # One process of a CPU "multi-process" run: accelerate wraps the model in DistributedDataParallel (gloo).
    for key, value in dict(LOCAL_RANK="0", RANK="0", WORLD_SIZE="1", LOCAL_WORLD_SIZE="1", OMP_NUM_THREADS="1",
                           MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port)).items():
        monkeypatch.setenv(key, value)
    accelerator, model, prepared, optimizer, data = _accelerated(gradient_accumulation_steps=2)
    try:
        assert isinstance(prepared, nn.parallel.DistributedDataParallel)
        assert accelerator.unwrap_model(prepared) is model
        with LayerProf(prepared, metrics=("flops",)) as wrapped:
            _train(accelerator, prepared, optimizer, data, wrapped)
        with LayerProf(model, metrics=("flops",)) as unwrapped:
            _train(accelerator, prepared, optimizer, data, unwrapped)
    finally:
        if torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()
    # The wrapper's records are the model's under "module."; the FLOPs the same, and DDP's record_function range
    # and its broadcasts are no unknown ops.
    assert list(wrapped.records) == ["", "module"] + ["module." + name for name in unwrapped.records if name]
    for name, record in unwrapped.records.items():
        theirs = wrapped.records["module." + name if name else "module"]
        assert (theirs.calls, theirs.flops_forward, theirs.flops_backward) == \
            (record.calls, record.flops_forward, record.flops_backward), name
    assert unwrapped.records["0"].flops_forward == 2 * (2 * 4 * 16 * 32)  # two micro-batches of 4
    assert wrapped.unknown_ops() == {} and unwrapped.unknown_ops() == {}


# -- PEFT -------------------------------------------------------------------------------------------------------
LORA = "base_model.model.model.layers.0.self_attn."


def _llama_with_lora(**lora: object) -> tuple[nn.Module, object, object]:
    """A 2-layer Llama (width 32, eager attention) from its config under a LoRA of rank 4 on q_proj and v_proj, and
    its causal-LM step on 2 x 16 tokens."""
    peft = pytest.importorskip("peft")
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                                      num_key_value_heads=2, vocab_size=100, max_position_embeddings=64,
                                      use_cache=False, attn_implementation="eager")
    options = dict(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], lora_dropout=0.0)
    model = peft.get_peft_model(transformers.LlamaForCausalLM(config).train(), peft.LoraConfig(**{**options, **lora}))
    ids = torch.randint(0, 100, (2, 16))
    return model, training_step(model, lambda: model(input_ids=ids, labels=ids).loss), peft


# 32 tokens of width 32: the frozen q_proj 2*32*32*32 = 65,536; lora_A 32 -> 4 and lora_B 4 -> 32: 8,192 each.
Q_PROJ, LORA_A = 2 * 32 * 32 * 32, 2 * 32 * 32 * 4


def test_lora_trainable_figures_branch_flops_and_a_plan() -> None:
    model, step, _ = _llama_with_lora(modules_to_save=["lm_head"])
    prof, plain = profiled_step_is_true(model, step)
    _containers_only_or_idle(prof, model)
    q = prof.records
    assert q[LORA + "q_proj.base_layer"].flops_forward == Q_PROJ
    assert q[LORA + "q_proj.lora_A.default"].flops_forward == q[LORA + "q_proj.lora_B.default"].flops_forward == LORA_A
    assert q[LORA + "q_proj"].flops_forward == Q_PROJ + 2 * LORA_A  # the scaling and the sum are free
    # Layer 0's input needs no gradient (frozen embeddings): lora_A's backward is its weight's gradient alone,
    # lora_B's its weight's and its input's; the frozen Linear runs no backward at all.
    assert q[LORA + "q_proj.lora_A.default"].flops_backward == LORA_A
    assert q[LORA + "q_proj.lora_B.default"].flops_backward == 2 * LORA_A
    assert q[LORA + "q_proj.base_layer"].backward_ms is None
    # modules_to_save: the trained copy of lm_head runs, the original is kept aside and never called.
    head = "base_model.model.lm_head"
    assert q[head + ".modules_to_save.default"].calls == 1 and q[head + ".original_module"].calls == 0
    half_plan_measures_as_predicted(prof, model, step, plain, allow_side_effects=False)
    with LayerProf(model, metrics=("params",)) as counted:
        step()
    trainable, total = model.get_nb_trainable_parameters()
    assert (counted.records[""].trainable_params, counted.records[""].params) == (trainable, total)


def _containers_only_or_idle(prof: LayerProf, model: nn.Module) -> None:
    """Every module ran, but containers, the LoraModel (PEFT calls the model inside it, not it) and the original
    of a ``modules_to_save`` module, kept aside."""
    idle = [name for name, record in prof.records.items() if not record.calls]
    assert [name for name in idle if name != "base_model" and "original_module" not in name
            and prof.records[name].type not in ("ModuleList", "ModuleDict", "ParameterDict")] == []
    assert "base_model" in idle and "base_model.model.lm_head.original_module" in idle


def test_two_adapters_switched_and_added_between_blocks_and_merged_after() -> None:
    model, step, peft = _llama_with_lora()
    with LayerProf(model, metrics=("params", "flops")) as first:
        step()
    # A second adapter added (new modules) and made the active one (other parameters trainable) between two blocks:
    # the second block walks the model anew and counts the new adapter's modules and trainable parameters.
    model.add_adapter("two", peft.LoraConfig(r=2, lora_alpha=8, target_modules=["q_proj", "k_proj"], lora_dropout=0.0))
    model.set_adapter("two")
    with LayerProf(model, metrics=("params", "flops")) as second:
        step()
    assert LORA + "k_proj.lora_A.two" not in first.records
    assert second.records[LORA + "k_proj.lora_A.two"].flops_forward == 2 * 32 * 32 * 2  # rank 2: 4,096
    assert second.records[LORA + "q_proj.lora_A.default"].calls == 0  # the idle adapter did not run
    assert second.records[LORA + "q_proj"].flops_forward == Q_PROJ + 2 * (2 * 32 * 32 * 2)
    for prof in (first, second):
        trainable, total = model.get_nb_trainable_parameters() if prof is second else (2 * 2 * 2 * 32 * 4, None)
        assert prof.records[""].trainable_params == trainable  # 2 layers x 2 projections x (32*4 + 4*32)
    assert second.records[""].params == total
    # Back to the first adapter: only the trainable figure changes, and the walk sees it.
    model.set_adapter("default")
    with LayerProf(model, metrics=("params",)) as third:
        step()
    assert third.records[""].trainable_params == first.records[""].trainable_params
    # Merged and unloaded after the profiles: a plain Llama, profiled afresh, its q_proj the Linear alone.
    before = hook_state(model)
    merged = model.merge_and_unload()
    assert hook_state(model) != before  # (the LoRA layers are gone: the model changed, not by layerprof)
    with torch.no_grad(), LayerProf(merged, metrics=("flops",)) as unloaded:
        merged(input_ids=torch.randint(0, 100, (2, 16)))
    assert list(unloaded.records) == [name for name, _ in merged.named_modules()]
    assert unloaded.records["model.layers.0.self_attn.q_proj"].flops_forward == Q_PROJ
    assert not any("lora" in name for name in unloaded.records)


def test_dora_step_is_true_and_counted_as_flop_counter_mode_counts_it() -> None:
    model, step, _ = _llama_with_lora(use_dora=True, lora_dropout=0.1)
    prof, plain = profiled_step_is_true(model, step)
    # DoRA's magnitude module calls the LoRA branch's Linears from its own forward (on an identity matrix for the
    # weight's norm, then on the input): two calls each, made from a sibling's forward.
    assert prof.records[LORA + "q_proj.lora_A.default"].calls == 2
    magnitude = prof.records[LORA + "q_proj.lora_magnitude_vector.default"]
    # Its forward: the two branch calls (2 x (8,192 + 8,192)) and, with dropout on, the frozen weight again.
    assert magnitude.flops_forward == 2 * 2 * LORA_A + Q_PROJ
    with torch.utils.flop_counter.FlopCounterMode(display=False) as counter:
        step()
    root = prof.records[""]
    assert root.flops_forward + root.flops_backward == counter.get_total_flops()
    half_plan_measures_as_predicted(prof, model, step, plain, allow_side_effects=False)


# -- sentence-transformers ----------------------------------------------------------------------------------------
def test_sentence_transformer_contrastive_step(tmp_path) -> None:
    pytest.importorskip("sentence_transformers")
    transformers = pytest.importorskip("transformers")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        from sentence_transformers import SentenceTransformer
        from sentence_transformers.sentence_transformer.losses import MultipleNegativesRankingLoss
        from sentence_transformers.sentence_transformer.modules import Pooling, Transformer
    torch.manual_seed(0)
    words = "the a cat dog sat on mat ran fast red blue".split()
    (tmp_path / "vocab.txt").write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *words]) + "\n")
    transformers.BertTokenizer(str(tmp_path / "vocab.txt")).save_pretrained(tmp_path)
    config = transformers.BertConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                                     vocab_size=len(words) + 5)
    transformers.BertModel(config).save_pretrained(tmp_path)
    model = SentenceTransformer(modules=[Transformer(str(tmp_path), max_seq_length=16), Pooling(32)], device="cpu")
    model.train()
    loss = MultipleNegativesRankingLoss(model)
    anchors = dict(model.preprocess(["the cat sat", "a dog ran fast", "red mat"]))
    positives = dict(model.preprocess(["the cat sat on the mat", "a dog ran", "blue mat"]))
    step = training_step(model, lambda: loss([anchors, positives], None))
    prof, plain = profiled_step_is_true(model, step)
    root = prof.records[""]
    assert root.calls == 2 and prof.records["1"].calls == 2  # the anchors' batch and the positives'
    # The Transformer module calls its BertModel's forward method directly, not the module: the BertModel holds
    # its children's sum, not a call of its own, and its modules ran twice.
    assert prof.records["0.model"].calls == 0 and prof.records["0.model.encoder"].calls == 2
    half_plan_measures_as_predicted(prof, model, step, plain, allow_side_effects=False)
