"""Sequence models as their users profile them: recurrent layers on packed batches, an LSTMCell unrolled in a loop,
a seq2seq decoder with attention, a CTC speech model, nn.Transformer with its masks, the encoder's nested-tensor
fast path and nn.MultiheadAttention."""
from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence

from layerprof import LayerProf


def lstm_flops(input_size: int, hidden: int, layers: int, tokens: int, directions: int = 1) -> int:
    """The 4 gate matmuls x @ w_ih^T and h @ w_hh^T at every token, every layer and direction."""
    total, width = 0, input_size
    for _ in range(layers):
        total += directions * 2 * tokens * 4 * hidden * (width + hidden)
        width = hidden * directions
    return total


def _same(a: object, b: object) -> bool:
    """Bitwise equal tensors, however nested (a PackedSequence, an (h, c) tuple)."""
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and torch.equal(a, b)
    if a is None or b is None:
        return a is b
    return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))


@pytest.mark.parametrize("train", [False, True], ids=["eval", "train-mode dropout"])
def test_lstm_under_inference_mode_keeps_its_bits_under_the_flop_meter(train: bool) -> None:
    # Under inference_mode aten.lstm reaches the FLOP meter whole; with no formula it ran decomposed, and a packed
    # LSTM's output (or one in train mode with dropout between its layers) differed from the plain run's in the
    # last bits: a served tagger profiled with `metrics=("flops",)` changed its answers.
    torch.manual_seed(0)
    lstm = nn.LSTM(8, 16, num_layers=2, bidirectional=True, dropout=0.5).train(train)
    x = torch.randn(5, 3, 8)
    for packed in (True, False):
        def forward() -> object:
            torch.manual_seed(3)  # the same dropout draws
            return lstm(pack_padded_sequence(x, [5, 3, 2]) if packed else x)

        with torch.inference_mode():
            plain = forward()
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # one step slowed by the meter
                with LayerProf(lstm, metrics=("flops",)) as prof:
                    profiled = forward()
        assert _same(plain, profiled), packed
        tokens = 5 + 3 + 2 if packed else 5 * 3
        # 2 layers x 2 directions: 2*t*64*(8+16) per direction, then 2*t*64*(32+16): 18,432 t in all
        assert prof.tree.flops_forward == lstm_flops(8, 16, 2, tokens, directions=2) == 18_432 * tokens
        assert prof.unknown_ops() == {}


class PackedTagger(nn.Module):
    """Embedding, a 2-layer bidirectional LSTM on a packed batch with its own (h0, c0), a head on the padded
    output."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(30, 8)
        self.rnn = nn.LSTM(8, 16, num_layers=2, bidirectional=True, batch_first=True)
        self.head = nn.Linear(32, 5)

    def forward(self, ids: torch.Tensor, lengths: torch.Tensor, state: tuple[torch.Tensor, torch.Tensor]
                ) -> torch.Tensor:
        packed = pack_padded_sequence(self.embed(ids), lengths, batch_first=True, enforce_sorted=False)
        out, _ = self.rnn(packed, state)
        return self.head(nn.utils.rnn.pad_packed_sequence(out, batch_first=True)[0])


class CellLoop(nn.Module):
    """One LSTMCell unrolled over the time steps in Python, a Linear read out at every step."""

    def __init__(self) -> None:
        super().__init__()
        self.cell = nn.LSTMCell(8, 16)
        self.out = nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: [t, b, 8]
        h = c = x.new_zeros(x.shape[1], 16)
        outputs = []
        for step in x:
            h, c = self.cell(step, (h, c))
            outputs.append(self.out(h))
        return torch.stack(outputs)


def test_training_steps_of_recurrent_models_are_true_and_exact() -> None:
    from .zoo_checks import flop_counter, profiled_step_is_true, training_step

    torch.manual_seed(0)
    tagger, ids, lengths = PackedTagger(), torch.randint(1, 30, (3, 7)), torch.tensor([7, 4, 2])
    state = (torch.randn(4, 3, 16), torch.randn(4, 3, 16))
    forward = lambda: tagger(ids, lengths, state)  # noqa: E731
    prof, _ = profiled_step_is_true(tagger, training_step(tagger, forward))
    rnn = prof.records["rnn"]
    # 13 packed tokens: 2 directions x (2*13*64*(8+16) + 2*13*64*(32+16)) = 239,616; FlopCounterMode agrees
    assert rnn.flops_forward == lstm_flops(8, 16, 2, 13, directions=2) == 239_616
    assert flop_counter(tagger, forward)[0]["rnn"] == 239_616
    assert rnn.input_paths[:2] == ["0.data", "0.batch_sizes"] and rnn.input_shapes[0] == [13, 8]
    assert rnn.output_paths == ["0.data", "0.batch_sizes", "0.sorted_indices", "0.unsorted_indices", "1.0", "1.1"]
    assert rnn.output_shapes[0] == [13, 32] and rnn.output_shapes[4:] == [[4, 3, 16], [4, 3, 16]]
    assert 0 < rnn.saved_bytes <= prof.tree.saved_bytes

    loop, x = CellLoop(), torch.randn(5, 2, 8)
    prof, _ = profiled_step_is_true(loop, training_step(loop, lambda: loop(x)))
    cell = prof.records["cell"]
    assert cell.calls == len(cell.call_times) == 5 and cell.backward_ms > 0
    assert cell.forward_ms == pytest.approx(sum(t.forward_ms for t in cell.call_times))
    # per call 2*2*64*(8+16) = 6,144; backward: no gradient for x (5 x 2*2*64*8) nor for the zero h0 (2*2*64*16)
    assert cell.flops_forward == 5 * 6_144
    assert cell.flops_backward == 2 * 5 * 6_144 - 5 * 2 * 2 * 64 * 8 - 2 * 2 * 64 * 16 == 47_104


def test_multihead_attention_and_the_encoders_nested_fast_path_count_exactly() -> None:
    torch.manual_seed(0)
    attention = nn.MultiheadAttention(16, 4, batch_first=True)
    x, padding = torch.randn(2, 6, 16), torch.zeros(2, 6, dtype=torch.bool)
    padding[1, 4:] = True
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with LayerProf(attention, metrics=("flops", "shapes")) as prof:
            out, weights = attention(x, x, x, key_padding_mask=padding, need_weights=False)
    assert weights is None
    # in_proj 2*12*16*48 = 18,432, out_proj 2*12*16*16 = 6,144, scores and weighted sum 2 * 2*2*6*6*16 = 4,608;
    # FlopCounterMode counts 24,576: 0 for the CPU's fused attention kernel
    assert prof.tree.flops_forward == 18_432 + 6_144 + 4_608 == 29_184
    assert prof.tree.output_paths == ["0"] and prof.tree.output_shapes == [[2, 6, 16]]

    layer = nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, batch_first=True)
    encoder = nn.TransformerEncoder(layer, 2, enable_nested_tensor=True).eval()
    x, padding = torch.randn(3, 7, 16), torch.zeros(3, 7, dtype=torch.bool)
    padding[1, 5:], padding[2, 3:] = True, True  # lengths 7, 5, 3: 15 tokens
    with torch.no_grad():
        plain = encoder(x, src_key_padding_mask=padding)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with LayerProf(encoder, metrics=("flops", "memory", "shapes")) as prof:
                profiled = encoder(x, src_key_padding_mask=padding)
    assert torch.equal(plain, profiled)
    first = prof.records["layers.0"]
    assert first.calls == 1 and first.input_shapes == [[3, None, 16]]  # a nested tensor, ragged in its lengths
    # per layer: in_proj 2*15*16*48 = 23,040, out_proj 2*15*16*16 = 7,680, attention 2 * 2*(49+25+9)*16 = 5,312,
    # feed-forward 2 * 2*15*16*32 = 30,720
    assert first.flops_forward == 23_040 + 7_680 + 5_312 + 30_720 == 66_752
    assert prof.tree.flops_forward == 2 * 66_752 and prof.tree.saved_bytes == 0


class Translator(nn.Module):
    """nn.Transformer with a causal target mask and key padding masks on both sides, batch first."""

    def __init__(self) -> None:
        super().__init__()
        self.source, self.target = nn.Embedding(40, 16), nn.Embedding(40, 16)
        self.transformer = nn.Transformer(16, 2, num_encoder_layers=2, num_decoder_layers=2, dim_feedforward=32,
                                          dropout=0.0, batch_first=True)
        self.out = nn.Linear(16, 40)

    def forward(self, source: torch.Tensor, target: torch.Tensor, source_padding: torch.Tensor,
                target_padding: torch.Tensor) -> torch.Tensor:
        causal = nn.Transformer.generate_square_subsequent_mask(target.shape[1])
        hidden = self.transformer(self.source(source), self.target(target), tgt_mask=causal, tgt_is_causal=True,
                                  src_key_padding_mask=source_padding, tgt_key_padding_mask=target_padding,
                                  memory_key_padding_mask=source_padding)
        return self.out(hidden)


def test_transformer_training_step_and_half_plan() -> None:
    from .zoo_checks import half_plan_measures_as_predicted, profiled_step_is_true, training_step

    torch.manual_seed(0)
    model = Translator()
    source, target = torch.randint(0, 40, (2, 6)), torch.randint(0, 40, (2, 5))
    source_padding = torch.tensor([[False] * 6, [False] * 4 + [True] * 2])
    target_padding = torch.tensor([[False] * 5, [False] * 3 + [True] * 2])
    step = training_step(model, lambda: model(source, target, source_padding, target_padding))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch: a float causal mask beside boolean padding masks is deprecated
        prof, plain = profiled_step_is_true(model, step)
        cross = prof.records["transformer.decoder.layers.0.multihead_attn"]
        # q, out projections 2 * 2*10*16*16 = 10,240, k and v 2*12*16*32 = 12,288, attention 2 * 2*2*5*6*16 = 3,840
        assert cross.flops_forward == 10_240 + 12_288 + 3_840 == 26_368
        half_plan_measures_as_predicted(prof, model, step, plain, allow_side_effects=False)
