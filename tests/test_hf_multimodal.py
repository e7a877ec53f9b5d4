"""Hugging Face multimodal, audio and generation models from tiny configs (no download): the shapes of key/value
caches through generate(), and what the zoo (test_transformers_zoo.py) does not cover."""
from __future__ import annotations

from typing import Any

import pytest
import torch

from layerprof import LayerProf

from .conftest import hook_state
from .invariants import count_calls
from .zoo_checks import refuse_network

transformers = pytest.importorskip("transformers")

pytestmark = pytest.mark.filterwarnings("ignore:only one step was profiled:RuntimeWarning", "ignore::FutureWarning")


@pytest.fixture(autouse=True)
def no_network(monkeypatch: pytest.MonkeyPatch) -> None:
    refuse_network(monkeypatch, "transformers")


def _gpt2() -> tuple[Any, dict[str, torch.Tensor]]:
    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=100, n_positions=64)
    model = transformers.GPT2LMHeadModel(config).eval()
    model.generation_config.pad_token_id = 0
    return model, {"input_ids": torch.randint(3, 100, (2, 6))}


def _whisper() -> tuple[Any, dict[str, torch.Tensor]]:
    torch.manual_seed(0)
    config = transformers.WhisperConfig(vocab_size=100, d_model=32, encoder_layers=1, decoder_layers=1,
                                        encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=64,
                                        decoder_ffn_dim=64, num_mel_bins=16, max_source_positions=8,
                                        max_target_positions=32, pad_token_id=0, decoder_start_token_id=1,
                                        bos_token_id=1, eos_token_id=2)
    model = transformers.WhisperForConditionalGeneration(config).eval()
    model.generation_config.forced_decoder_ids = None
    return model, {"input_features": torch.randn(2, 16, 16)}


def _generate(model: Any, inputs: dict[str, torch.Tensor], beams: int) -> Any:
    return model.generate(**inputs, max_new_tokens=4, min_new_tokens=4, do_sample=False, num_beams=beams,
                          use_cache=True)


def test_generate_shows_the_key_value_cache_growing_in_the_shapes() -> None:
    # GPT-2 (2 layers, 2 heads of 16) generating 4 tokens after a 6-token prompt with a DynamicCache. The cache was
    # an opaque object to the shapes meter: no cache tensor in any path, and each attention layer's 4 calls read
    # as 2 signatures (the prompt's 6 positions, then 1 position 3 times) while its cache grew 6 -> 7 -> 8 -> 9.
    model, inputs = _gpt2()
    plain = _generate(model, inputs, 1)  # (the first call installs transformers' own output hooks)
    before = hook_state(model)
    with count_calls(model) as reference, LayerProf(model, metrics=("shapes",)) as prof:
        profiled = _generate(model, inputs, 1)
    assert torch.equal(plain, profiled) and hook_state(model) == before
    root = prof.records[""]
    assert root.calls == reference[""] == 4
    # The model's first call returns the cache it filled: keys and values [batch 2, heads 2, 6, 16], its first
    # layer's standing for both layers' (every layer's call is handed the whole cache: read whole, a forward's walk
    # would grow with the square of the depth).
    assert root.output_paths == ["logits", "cache.layers.0.keys", "cache.layers.0.values"]
    assert root.output_shapes == [[2, 1, 100]] + [[2, 2, 6, 16]] * 2
    # The second layer is handed the cache too: its first layer's keys and values, filled by the first layer's call.
    assert prof.records["transformer.h.1"].input_paths == ["0", "1.layers.0.keys", "1.layers.0.values", "position_ids"]
    assert not any(".layers.1." in path for record in prof.records.values() for path in record.input_paths or ())
    # Every call of the model and of each layer differs from the others: the cache is one position longer.
    for name in ("", "transformer", "transformer.h.0", "transformer.h.1"):
        assert prof.records[name].shape_variants == 4, name
    # The tensors of the cache are sizes only: nothing is kept.
    assert all(isinstance(size, int) for shape in root.output_shapes for size in shape)


def test_beam_search_shows_the_encoder_decoder_cache_in_the_shapes() -> None:
    # Whisper (d_model 32, 2 heads of 16, 8 encoder positions) with 3 beams over a batch of 2: 6 rows. The
    # EncoderDecoderCache holds the decoder's self-attention keys and values (1 position at the first token) and
    # the cross-attention ones over the 8 encoder positions.
    model, inputs = _whisper()
    plain = _generate(model, inputs, 3)
    before = hook_state(model)
    with LayerProf(model, metrics=("shapes", "flops")) as prof:
        profiled = _generate(model, inputs, 3)
    assert torch.equal(plain, profiled) and hook_state(model) == before
    decoder = prof.records["model.decoder"]
    assert decoder.calls == 4 and decoder.shape_variants == 4
    caches = [f"cache.{kind}_attention_cache.layers.0.{part}" for kind in ("self", "cross")
              for part in ("keys", "values")]
    assert decoder.output_paths == ["last_hidden_state", *caches]
    assert decoder.output_shapes == [[6, 1, 32], [6, 2, 1, 16], [6, 2, 1, 16], [6, 2, 8, 16], [6, 2, 8, 16]]
    # The cross-attention is handed the cache its self-attention just extended: 1 position at the first token.
    cross = prof.records["model.decoder.layers.0.encoder_attn"]
    assert cross.input_paths == ["0", "key_value_states", *caches[:2]]
    assert cross.input_shapes == [[6, 1, 32], [6, 8, 32], [6, 2, 1, 16], [6, 2, 1, 16]]
    assert cross.shape_variants == 4


def test_an_encoder_that_ran_only_in_the_counted_step_is_not_called_not_run() -> None:
    # Whisper's generate() stepped once a token (prof.step() in a logits processor): the encoder runs once, before
    # the first token, in the step the FLOP meter counts, which the times leave out once other steps were recorded.
    # The summary called it "not run" beside FLOPs that are 57 % of the model's.
    model, inputs = _whisper()
    plain = _generate(model, inputs, 3)

    class EachToken(transformers.LogitsProcessor):
        def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
            prof.step()
            return scores

    with LayerProf(model, metrics=("flops",)) as prof:
        profiled = model.generate(**inputs, max_new_tokens=4, min_new_tokens=4, do_sample=False, num_beams=3,
                                  use_cache=True, logits_processor=transformers.LogitsProcessorList([EachToken()]))
    assert torch.equal(plain, profiled)
    records = prof.records
    encoder = records["model.encoder"]
    assert encoder.calls == 0 and encoder.forward_ms is None and records["model.decoder"].calls == 1
    # Its FLOPs (batch 2, 16 mel bins x 16 frames, d_model 32, 8 positions after the stride-2 conv, 2 heads of 16):
    # conv1 2*2*16*32*(16*3) = 98,304; conv2 2*2*8*32*(32*3) = 98,304; q, k, v, out 4 * 2*2*8*32*32 = 131,072;
    # scores and weighted values 2 * 2*2*2*8*8*16 = 16,384; fc1 and fc2 2 * 2*2*8*32*64 = 131,072.
    assert encoder.flops_forward == 98_304 + 98_304 + 131_072 + 16_384 + 131_072 == 475_136
    lines = prof.layerwise_summary(columns=("forward", "flops")).split("\n")
    line = next(text for text in lines if "(encoder): WhisperEncoder" in text)
    share = 100 * 475_136 / prof.tree.flops_forward
    note = "ran only in the counted step, which the times leave out"
    assert round(share) == 57
    assert line == f"    (encoder): WhisperEncoder【Forward Time: — | FLOPs: 475 kFLOPs ({share:.1f}%) | {note}】("
    # The encoder's layers, a ModuleList it iterates, show their children's counts, not "not run".
    layers = next(text for text in lines if "(layers): ModuleList" in text)
    assert layers.startswith("      (layers): ModuleList【Forward Time: — | FLOPs: 279 kFLOPs (")
    assert layers.endswith("%) | sum of its children: not called itself】(")
    assert not any("not run" in text for text in lines)
