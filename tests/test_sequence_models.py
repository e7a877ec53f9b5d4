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
