"""What users of other profilers reported as miscounted or crashing, replayed on layerprof.

Each test names the report it replays (repository and issue or pull request) and checks layerprof's answer
against the arithmetic written beside it: FLOPs (1 MAC = 2 FLOPs, matmul-like work only), parameters, shapes and
saved bytes, and that the model is left as it was found.
"""
from __future__ import annotations

from collections import namedtuple

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.distributions import Categorical
from torch.nn.utils.rnn import PackedSequence, pack_padded_sequence
from torch.utils.flop_counter import FlopCounterMode

from layerprof import LayerProf
from layerprof.collect.compiled import RefusedModel

from .conftest import hook_state

# One-step profiles are the point here; their times are not used.
pytestmark = pytest.mark.filterwarnings("ignore:only one step was profiled:RuntimeWarning")


class Call(nn.Module):
    """A module whose forward is one function of its inputs (functional code inside a module)."""

    def __init__(self, function) -> None:
        super().__init__()
        self.function = function

    def forward(self, *args: torch.Tensor, **kwargs: torch.Tensor):
        return self.function(*args, **kwargs)


def flops(model: nn.Module, *args: torch.Tensor, backward: bool = False, **kwargs: torch.Tensor) -> LayerProf:
    with LayerProf(model, metrics=("flops",)) as prof:
        out = model(*args, **kwargs)
        if backward:
            out = out[0] if isinstance(out, tuple) else out
            (out.data if isinstance(out, PackedSequence) else out).sum().backward()
    return prof


# -- attention ---------------------------------------------------------------------------------------------
def test_multihead_attention_counts_its_projections_and_scores_whatever_the_heads() -> None:
    """Lyken17/pytorch-OpCounter#197 and sovrasov/flops-counter.pytorch#65: nn.MultiheadAttention counted 0;
    facebookresearch/fvcore#153: the same count for 4 and 8 heads (right: heads split the width)."""
    embed, seq = 16, 10
    x = torch.randn(1, seq, embed)
    # q, k, v and out projections 4 * 2*s*e*e = 20480; scores and weighted sum 2 * 2*s*s*e = 6400
    expected = 4 * 2 * seq * embed * embed + 2 * 2 * seq * seq * embed
    for heads in (1, 4, 8):
        attention = nn.MultiheadAttention(embed, heads, batch_first=True)
        assert flops(attention, x, x, x).tree.flops_forward == expected == 26880
        with torch.no_grad():  # the fused inference path
            assert flops(attention.eval(), x, x, x).tree.flops_forward == expected


def test_a_frozen_transformer_encoder_is_counted() -> None:
    """sovrasov/flops-counter.pytorch#101: a TransformerEncoder whose parameters are frozen counted 0."""
    layer = nn.TransformerEncoderLayer(d_model=16, nhead=4, dim_feedforward=32, batch_first=True)
    encoder = nn.TransformerEncoder(layer, 1, enable_nested_tensor=False)
    encoder.requires_grad_(False)
    # attention 26880 (above) + feed-forward 2 * 2*s*e*f = 2 * 2*10*16*32 = 20480
    assert flops(encoder, torch.randn(1, 10, 16)).tree.flops_forward == 26880 + 20480


def test_hand_written_attention_and_sdpa_count_their_products() -> None:
    """autoliuweijie/FastBERT#14: the matmuls of a hand-written attention were missed; MrYxJ/calculate-flops.pytorch#48:
    F.scaled_dot_product_attention and q @ k were not counted."""
    def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return torch.softmax(q @ k.transpose(-2, -1) / 2.0, -1) @ v

    q, k, v = torch.randn(2, 4, 6, 8), torch.randn(2, 4, 5, 8), torch.randn(2, 4, 5, 3)
    # scores 2*b*h*s_q*s_k*d = 2*2*4*6*5*8 = 3840, weighted sum 2*2*4*6*5*3 = 1440
    assert flops(Call(attention), q, k, v).tree.flops_forward == 3840 + 1440
    assert flops(Call(F.scaled_dot_product_attention), q, k, v).tree.flops_forward == 3840 + 1440


# -- convolutions ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("conv, shape, macs", [
    # facebookresearch/fvcore#78: [32 -> 1, 3x3] on a 1x1 input: each input point meets 32*1*9 weights
    (nn.ConvTranspose2d(32, 1, 3), (1, 32, 1, 1), 32 * 9),
    # sovrasov/flops-counter.pytorch#149: stride 2, 2x2 kernel, 3 -> 1 on 2x2: 4 positions * 3*1*4 weights
    (nn.ConvTranspose2d(3, 1, 2, stride=2), (1, 3, 2, 2), 4 * 12),
    # deepspeedai/DeepSpeed#8323 (its three layers, batch 2 of 8x8): 2 * 64 input positions * the weight's size
    (nn.ConvTranspose2d(4, 6, 4, stride=2, padding=1), (2, 4, 8, 8), 2 * 64 * 4 * 6 * 16),
    (nn.ConvTranspose2d(4, 4, 3, stride=2, padding=1, output_padding=1, groups=4), (2, 4, 8, 8), 2 * 64 * 4 * 1 * 9),
    (nn.ConvTranspose2d(6, 6, 2, stride=2, groups=3), (2, 6, 8, 8), 2 * 64 * 6 * 2 * 4),
    # a dilated convolution: [4 -> 8, 3x3, dilation 2] on 10x10 -> 6x6: 2 * 36 * 8*4*9
    (nn.Conv2d(4, 8, 3, dilation=2), (2, 4, 10, 10), 2 * 36 * 8 * 4 * 9),
])
def test_transposed_grouped_and_dilated_convolutions(conv: nn.Module, shape: tuple[int, ...], macs: int) -> None:
    """facebookresearch/fvcore#78, sovrasov/flops-counter.pytorch#57 and #149, deepspeedai/DeepSpeed#8323: a
    transposed convolution (grouped, with output_padding) counted over the wrong positions or as 0."""
    prof = flops(conv, torch.randn(*shape), backward=True)
    assert prof.tree.flops_forward == 2 * macs
    assert prof.tree.flops_backward == 2 * macs  # the weight gradient only: the input needs none


# -- einsum and matmul -------------------------------------------------------------------------------------
@pytest.mark.parametrize("equation, shapes, expected", [
    ("ik,kj->ij", [(3, 4), (4, 5)], 2 * 3 * 4 * 5),
    # zhijian-liu/torchprofile#17's own equation: one multiply-accumulate per element of the inputs
    ("bnchwk,bnchwk->bnchw", [(2, 3, 2, 2, 3, 5), (2, 3, 2, 2, 3, 5)], 2 * 2 * 3 * 2 * 2 * 3 * 5),
    ("i,i->", [(7,), (7,)], 2 * 7),
    # three operands contracted left to right: [2,3,4]@[2,4,5] then [2,3,5]@[2,5,6]
    ("bij,bjk,bkl->bil", [(2, 3, 4), (2, 4, 5), (2, 5, 6)], 2 * 2 * 3 * 4 * 5 + 2 * 2 * 3 * 5 * 6),
])
def test_einsum_counts_its_contractions(equation: str, shapes: list[tuple[int, ...]], expected: int) -> None:
    """Lyken17/pytorch-OpCounter#174 and zhijian-liu/torchprofile#17: torch.einsum not counted."""
    tensors = [torch.randn(*shape) for shape in shapes]
    prof = flops(Call(lambda *operands: torch.einsum(equation, *operands)), *tensors)
    assert prof.tree.flops_forward == expected
    assert prof.unknown_ops() == {}


@pytest.mark.parametrize("a, b, macs", [
    ((8,), (8,), 8), ((4, 8), (8,), 4 * 8),
    ((2, 1, 4, 8), (3, 8, 5), 2 * 3 * 4 * 8 * 5),  # batches [2, 1] and [3] broadcast to [2, 3]
    ((5, 8), (2, 8, 3), 2 * 5 * 8 * 3),
])
def test_broadcast_matmul(a: tuple[int, ...], b: tuple[int, ...], macs: int) -> None:
    """deepspeedai/DeepSpeed#8419: matmul of vectors and broadcast batches counted 8x over or 3x under."""
    assert flops(Call(torch.matmul), torch.randn(*a), torch.randn(*b)).tree.flops_forward == 2 * macs


# -- recurrent layers --------------------------------------------------------------------------------------
def test_an_lstm_on_a_packed_sequence_counts_the_steps_it_ran() -> None:
    """deepspeedai/DeepSpeed#4333 (a PackedSequence input crashed the RNN hook) and #8507 (its fix first counted
    8 times over): a 2-layer LSTM(8, 16) on 4 sequences of lengths 5, 3, 2, 1."""
    lstm = nn.LSTM(8, 16, num_layers=2)
    packed = pack_padded_sequence(torch.randn(5, 4, 8), [5, 3, 2, 1])
    prof = flops(lstm, packed, backward=True)
    # 11 steps ran; layer 1: w_ih [64, 8], w_hh [64, 16]; layer 2: w_ih [64, 16], w_hh [64, 16]
    forward = 2 * 11 * (64 * 8 + 64 * 16) + 2 * 11 * (64 * 16 + 64 * 16)
    assert prof.tree.flops_forward == forward == 78848
    # every product again for the weight gradients and the data gradients, less those autograd skips: the input
    # gradient of layer 1 (2 * 11 * 64*8) and the initial state's in each layer (2 * 2 * 4 * 64*16)
    assert prof.tree.flops_backward == 2 * forward - 2 * 11 * 64 * 8 - 2 * 2 * 4 * 64 * 16 == 130048
    with FlopCounterMode(display=False) as counter:
        lstm(pack_padded_sequence(torch.randn(5, 4, 8), [5, 3, 2, 1]))[0].data.sum().backward()
    assert counter.get_total_flops() == forward + 130048


# -- shared modules and parameters -------------------------------------------------------------------------
class Holder(nn.Module):
    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.inner(x)


class ThreeHolders(nn.Module):
    """One Linear held by three parents, each calling it on a third of the input."""

    def __init__(self) -> None:
        super().__init__()
        shared = nn.Linear(100, 100)
        self.a, self.b, self.c = Holder(shared), Holder(shared), Holder(shared)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x1, x2, x3 = x.split(100, dim=1)
        return self.a(x1) + self.b(x2) + self.c(x3)


def test_a_module_held_by_several_parents_counts_each_call_once() -> None:
    """deepspeedai/DeepSpeed#7256, Lyken17/pytorch-OpCounter#98, sovrasov/flops-counter.pytorch#106: a shared
    module's FLOPs added once per parent (180 kFLOPs for 60)."""
    model = ThreeHolders()
    with LayerProf(model, metrics=("params", "flops")) as prof:
        model(torch.randn(1, 300))
    # three calls of 2 * 100 * 100 = 20000 FLOPs; one Linear of 100*100 + 100 parameters
    assert prof.tree.flops_forward == 60000
    assert prof.records["a.inner"].flops_forward == 60000  # the module, every call (it is b.inner and c.inner too)
    assert prof.tree.params == 10100


class SharedActivation(nn.Module):
    """One ReLU instance given to three blocks of two Linear(4, 4) each."""

    def __init__(self) -> None:
        super().__init__()
        relu = nn.ReLU()
        self.blocks = nn.ModuleList(
            nn.Sequential(nn.Linear(4, 4), relu, nn.Linear(4, 4), relu) for _ in range(3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return x


class TiedHead(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(50, 8)
        self.head = nn.Linear(8, 50, bias=False)
        self.head.weight = self.embed.weight

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.embed(ids))


def test_tied_and_shared_parameters_count_once() -> None:
    """TylerYep/torchinfo#322 and #377 (tied embeddings counted twice), TylerYep/torchinfo PR #396 (one activation
    instance shared by blocks: 160 parameters for 120), sksq96/pytorch-summary#201 (a module called twice)."""
    tied = TiedHead()
    with LayerProf(tied) as prof:
        tied(torch.randint(0, 50, (2, 3)))
    assert prof.tree.params == 50 * 8 == sum(p.numel() for p in tied.parameters())
    assert prof.records["head"].shared_with == {"weight": ["embed.weight"]}

    blocks = SharedActivation()
    with LayerProf(blocks, metrics=("params", "flops")) as prof:
        blocks(torch.randn(1, 4))
    assert prof.tree.params == 6 * (16 + 4) == 120
    assert [prof.records[f"blocks.{i}"].params for i in range(3)] == [40, 40, 40]
    assert prof.tree.flops_forward == 6 * 2 * 4 * 4

    twice = nn.Conv2d(1, 1, 3, padding=1)
    model = Call(lambda x, y: (twice(x), twice(y)))
    model.conv = twice
    with LayerProf(model, metrics=("params", "flops", "shapes")) as prof:
        model(torch.randn(1, 1, 16, 16), torch.randn(1, 1, 28, 28))
    conv = prof.records["conv"]
    assert (prof.tree.params, conv.calls, conv.shape_variants) == (10, 2, 2)
    assert conv.flops_forward == 2 * 9 * (16 * 16 + 28 * 28)


class ReZero(nn.Sequential):
    """A container with a parameter of its own beside its children's."""

    def __init__(self, *blocks: nn.Module) -> None:
        super().__init__(*blocks)
        self.alphas = nn.Parameter(torch.zeros(len(blocks)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for index, block in enumerate(self):
            x = x + self.alphas[index] * block(x)
        return x


def test_parameters_of_a_container_itself_and_of_lazy_modules() -> None:
    """TylerYep/torchinfo#137 and #54 (a module's own nn.Parameter beside children left out: 12 for 14) and
    TylerYep/torchinfo#117 (an UninitializedParameter crashed the summary)."""
    model = ReZero(nn.Linear(2, 2), nn.Linear(2, 2))
    with LayerProf(model) as prof:
        model(torch.randn(1, 2))
    assert (prof.tree.params, prof.tree.trainable_params, prof.tree.own_params) == (2 * 6 + 2, 14, 2)

    lazy = nn.Sequential(nn.LazyLinear(4), nn.ReLU(), nn.LazyLinear(2))
    with LayerProf(lazy, metrics=("params", "flops")) as prof:
        lazy(torch.randn(3, 5))
    # read after the first call materialized them: 5*4 + 4 and 4*2 + 2
    assert [prof.records[name].params for name in ("", "0", "2")] == [34, 24, 10]
    assert prof.tree.flops_forward == 2 * 3 * 5 * 4 + 2 * 3 * 4 * 2


def test_weight_norm_counts_its_two_tensors_and_its_convolution() -> None:
    """nmhkahn/torchsummaryX#20: a weight-normed convolution lost its kernel's row in the summary."""
    conv = nn.utils.parametrizations.weight_norm(nn.Conv2d(10, 20, 5))
    with LayerProf(conv, metrics=("params", "flops")) as prof:
        conv(torch.randn(1, 10, 9, 9))
    # g [20, 1, 1, 1] + v [20, 10, 5, 5] + bias [20]; 5x5 output: 2 * 25 * 20*10*25
    assert prof.tree.params == 20 + 5000 + 20 == sum(p.numel() for p in conv.parameters())
    assert prof.tree.flops_forward == 2 * 25 * 5000


# -- what models take and return ---------------------------------------------------------------------------
def test_outputs_that_are_dicts_distributions_or_arrays() -> None:
    """sksq96/pytorch-summary#149 (a dict output crashed), TylerYep/torchinfo#329 (a torch.distributions output
    crashed) and #152 (numpy arrays returned)."""
    linear = nn.Linear(4, 4)
    as_dict = Call(lambda x: {"y": linear(x), "aux": [linear(x), (x,)]})
    as_dict.linear = linear
    with LayerProf(as_dict, metrics=("shapes", "memory")) as prof:
        as_dict(torch.randn(2, 4))["y"].sum().backward()
    assert prof.tree.output_paths == ["y", "aux.0", "aux.1.0"]
    assert prof.tree.output_shapes == [[2, 4]] * 3

    policy = Call(lambda x: Categorical(logits=linear(x)))
    policy.linear = linear
    with LayerProf(policy, metrics=("shapes", "flops")) as prof:
        (-policy(torch.randn(1, 4)).log_prob(torch.tensor([1]))).sum().backward()
    # the Distribution's tensors, by attribute (a Categorical made from logits keeps them; probs are made lazily)
    assert (prof.tree.output_paths, prof.tree.output_shapes) == (["logits"], [[1, 4]])
    assert (prof.tree.flops_forward, prof.tree.flops_backward) == (2 * 4 * 4, 2 * 4 * 4)

    to_numpy = Call(lambda x: linear(x).detach().numpy())
    to_numpy.linear = linear
    with LayerProf(to_numpy, metrics=("shapes", "flops")) as prof:
        out = to_numpy(torch.randn(1, 4))
    assert isinstance(out, np.ndarray) and prof.tree.flops_forward == 2 * 4 * 4


def test_a_keyword_argument_holding_a_list_of_tensors() -> None:
    """MrYxJ/calculate-flops.pytorch#63: a list of tensors passed as a keyword argument crashed."""
    convs = nn.ModuleList(nn.Conv2d(4, 4, 1) for _ in range(3))
    model = Call(lambda *, x: [conv(t) for conv, t in zip(convs, x)])
    model.convs = convs
    inputs = [torch.randn(1, 4, 8, 8), torch.randn(1, 4, 4, 4), torch.randn(1, 4, 2, 2)]
    with LayerProf(model, metrics=("shapes", "flops")) as prof:
        model(x=inputs)
    assert prof.tree.input_paths == ["x.0", "x.1", "x.2"]
    assert prof.tree.flops_forward == 2 * 16 * (64 + 16 + 4)


# -- the profiler's own state ------------------------------------------------------------------------------
def test_a_forward_that_raises_leaves_the_model_as_it_was() -> None:
    """ultralytics/thop PR #140: a forward that raised left hooks and buffers on the model."""
    class Raises(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.linear = nn.Linear(4, 4)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            self.linear(x)
            raise ValueError("a bug in the user's forward")

    model = Raises()
    before, keys = hook_state(model), list(model.state_dict())
    with pytest.raises(ValueError, match="a bug in the user's forward"):
        with LayerProf(model, metrics=("params", "flops", "shapes", "memory")):
            model(torch.randn(2, 4))
    assert hook_state(model) == before and list(model.state_dict()) == keys


def test_profiling_again_counts_the_same() -> None:
    """deepspeedai/DeepSpeed#2097 and #2292: FLOPs grew with every profile or step of the same model."""
    linear = nn.Linear(256, 128)
    counts = []
    for _ in range(3):
        with LayerProf(linear, metrics=("flops",)) as prof:
            for _ in range(3):
                linear(torch.randn(1, 256)).sum().backward()
                prof.step()
        counts.append((prof.tree.flops_forward, prof.tree.flops_backward))
    assert counts == [(2 * 256 * 128, 2 * 256 * 128)] * 3  # one step's, the weight gradient in backward


def test_a_compiled_module_is_refused_with_what_to_do() -> None:
    """pytorch/pytorch#128199 and sovrasov/flops-counter.pytorch#110: a torch.compile'd model crashed the counter
    or had its FLOPs tripled."""
    model = nn.Sequential(torch.compile(nn.Linear(4, 4)), nn.ReLU())
    with pytest.raises(RefusedModel, match="_orig_mod"):
        LayerProf(model, metrics=("flops",))


def test_inference_mode_counts_the_forward() -> None:
    """pytorch/pytorch#126268: FlopCounterMode read 0 under torch.inference_mode."""
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                          nn.Linear(4, 2)).eval()
    with torch.inference_mode():
        prof = flops(model, torch.randn(1, 3, 8, 8))
    # conv 2 * 36 positions * 4*3*9, linear 2 * 4*2; batch norm and pooling count 0
    assert prof.tree.flops_forward == 2 * 36 * 108 + 16
    assert prof.unknown_ops() == {}


def test_a_module_built_during_the_forward_is_counted() -> None:
    """ultralytics/thop PR #170: a submodule the forward builds after the hooks went on counted 0, silently."""
    class BuildsLate(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.first = nn.Linear(4, 4)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            if not hasattr(self, "second"):
                self.second = nn.Linear(4, 4)
            return self.second(self.first(x))

    model = BuildsLate()
    with LayerProf(model, metrics=("params", "flops")) as prof:
        model(torch.randn(2, 4))
    assert prof.records["second"].flops_forward == 2 * 2 * 4 * 4
    assert prof.tree.params == 40


def test_a_module_called_in_a_loop_saves_for_every_call() -> None:
    """TylerYep/torchinfo#144: a Linear called 100 times in a loop estimated one call's activation memory."""
    class Loop(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.linear = nn.Linear(64, 64)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            for _ in range(10):
                x = self.linear(x)
            return x

    model = Loop()
    with LayerProf(model, metrics=("memory",)) as prof:
        model(torch.randn(32, 64, requires_grad=True)).sum().backward()
    # each call saves its own input, [32, 64] float32 = 8 KiB, and returns a new one: 10 calls
    assert prof.records["linear"].saved_bytes == 10 * 32 * 64 * 4
    assert prof.records["linear"].activation_bytes == 10 * 32 * 64 * 4


def test_interpolation_is_free_and_never_overflows() -> None:
    """sovrasov/flops-counter.pytorch#144 (a scalar scale_factor overflowed) and #119 (F.interpolate crashed)."""
    prof = flops(Call(lambda x: F.interpolate(x, scale_factor=2, mode="bilinear")), torch.randn(200, 3, 10, 10))
    assert prof.tree.flops_forward == 0 and prof.unknown_ops() == {}


# -- kernels that were listed as having no formula ---------------------------------------------------------
def test_cdist_counts_its_matrix_product_in_both_passes() -> None:
    """facebookresearch/fvcore#42 reported the ops it skipped; layerprof lists the same kind as unknown_ops(). A sweep
    of functional ops found torch.cdist's matrix-product path listed (its forward 0, its gradient counted)."""
    x1, x2 = torch.randn(2, 30, 4, requires_grad=True), torch.randn(2, 40, 4, requires_grad=True)
    prof = flops(Call(torch.cdist), x1, x2, backward=True)
    # on more than 25 rows torch computes [-2 x1, |x1|^2, 1] @ [x2, 1, |x2|^2]^T: 2 * 2*30*40 * (4 + 2)
    assert prof.tree.flops_forward == 2 * 2 * 30 * 40 * 6 == 28800
    # the gradient of each input is one product [30, 40] @ [40, 4] (and its transpose): 2 * 2 * 2*30*40*4
    assert prof.tree.flops_backward == 38400
    assert prof.unknown_ops() == {}
    # few rows: distances computed directly, elementwise work (as F.pdist), known and free
    small = flops(Call(torch.cdist), torch.randn(2, 3, 4, requires_grad=True), torch.randn(2, 5, 4), backward=True)
    assert (small.tree.flops_forward, small.tree.flops_backward, small.unknown_ops()) == (0, 0, {})
    pdist = flops(Call(F.pdist), torch.randn(6, 4, requires_grad=True), backward=True)
    assert (pdist.tree.flops_backward, pdist.unknown_ops()) == (0, {})


def test_affine_grid_and_conv_tbc_count_their_products() -> None:
    """facebookresearch/fvcore#42 (skipped ops): a spatial transformer's F.affine_grid and fairseq's ConvTBC were
    listed as unknown, their forward 0 beside a counted backward."""
    theta = torch.randn(2, 2, 3, requires_grad=True)
    prof = flops(Call(lambda t: F.affine_grid(t, [2, 3, 4, 5], align_corners=False)), theta, backward=True)
    # base grid [2, 4*5, 3] @ theta^T [2, 3, 2]: 2 * 2*20*3*2; the backward's product has the same size
    assert (prof.tree.flops_forward, prof.tree.flops_backward, prof.unknown_ops()) == (480, 480, {})

    x, weight, bias = torch.randn(5, 2, 4), torch.randn(3, 4, 6, requires_grad=True), torch.randn(6)
    prof = flops(Call(lambda x, w, b: torch.conv_tbc(x, w, b, 1)), x, weight, bias, backward=True)
    # x: [t=5, b=2, c_in=4], w: [k=3, 4, 6], pad 1 -> [5, 2, 6]: 2 * 5*2 positions * 3*4*6
    assert prof.tree.flops_forward == 2 * 10 * 72 == 1440
    assert prof.unknown_ops() == {}


def test_a_margin_loss_and_a_cross_product_are_known_and_free() -> None:
    """facebookresearch/fvcore#42 (skipped ops): F.multilabel_margin_loss and torch.linalg.cross were listed as
    ops with no formula, a warning under every FLOPs summary, though they hold no matrix product."""
    scores = torch.randn(4, 5, requires_grad=True)
    targets = torch.tensor([[1, 2, -1, 0, 0]] * 4)
    prof = flops(Call(F.multilabel_margin_loss), scores, targets, backward=True)
    assert (prof.tree.flops_forward, prof.tree.flops_backward, prof.unknown_ops()) == (0, 0, {})
    prof = flops(Call(torch.linalg.cross), torch.randn(4, 3, requires_grad=True), torch.randn(4, 3), backward=True)
    assert (prof.tree.flops_forward, prof.tree.flops_backward, prof.unknown_ops()) == (0, 0, {})


def test_named_tuple_fields_name_their_paths() -> None:
    """TylerYep/torchinfo#161 (its NamedTuple cases failed; on layerprof they ran, but a named tuple's tensors were
    named by position, "0.1", where a dataclass's are named by field)."""
    Output = namedtuple("Output", "logits hidden")
    linear = nn.Linear(4, 4)
    model = Call(lambda x: Output(linear(x) * 2, linear(x)))
    model.linear = linear
    with LayerProf(model, metrics=("shapes",)) as prof:
        model(torch.randn(1, 4))
    assert prof.tree.output_paths == ["logits", "hidden"]

    lstm = nn.LSTM(8, 16)
    with LayerProf(lstm, metrics=("shapes",)) as prof:
        lstm(pack_padded_sequence(torch.randn(5, 2, 8), [5, 3]))
    # PackedSequence(data [8, 8], batch_sizes [5]) in, PackedSequence and (h, c) out; its None fields are skipped
    assert prof.tree.input_paths == ["0.data", "0.batch_sizes"]
    assert prof.tree.input_shapes == [[8, 8], [5]]
    assert prof.tree.output_paths == ["0.data", "0.batch_sizes", "1.0", "1.1"]

    # torch.return_types (struct sequences: no _fields, their names in __match_args__) are named too
    top = Call(lambda x: torch.max(linear(x), 1))
    top.linear = linear
    with LayerProf(top, metrics=("shapes",)) as prof:
        top(torch.randn(3, 4))
    assert prof.tree.output_paths == ["values", "indices"] and prof.tree.output_shapes == [[3], [3]]
