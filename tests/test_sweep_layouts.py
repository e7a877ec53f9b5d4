"""Tensors and layouts of real models under the flops meter: sparse graphs, complex weights, bags of embeddings,
spectral layers. The cases a sweep found counted wrong, with the arithmetic."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from layerprof import LayerProf
from layerprof.metrics.bytes import op_bytes

from .conftest import hook_state

pytestmark = pytest.mark.filterwarnings("ignore:only one step was profiled:RuntimeWarning",
                                        "ignore:Sparse CSR tensor support is in beta:UserWarning")
aten = torch.ops.aten


def _ring(n: int, layout: torch.layout) -> torch.Tensor:
    """The adjacency of a ring with self-loops: 2 entries per row, 2 * n stored of n * n."""
    rows = torch.arange(n).repeat_interleave(2)
    cols = torch.stack([torch.arange(n), (torch.arange(n) + 1) % n], 1).flatten()
    adjacency = torch.sparse_coo_tensor(torch.stack([rows, cols]), torch.full((2 * n,), 0.5), (n, n),
                                         check_invariants=True).coalesce()
    return adjacency if layout == torch.sparse_coo else adjacency.to_sparse_csr()


class GraphConv(nn.Module):
    """A GCN layer: a projection, then the sum over each node's neighbours through the sparse adjacency."""

    def __init__(self, inputs: int, outputs: int) -> None:
        super().__init__()
        self.project = nn.Linear(inputs, outputs, bias=False)

    def forward(self, adjacency: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        return torch.sparse.mm(adjacency, self.project(x))


@pytest.mark.parametrize("layout", [torch.sparse_coo, torch.sparse_csr], ids=["coo", "csr"])
def test_sparse_matrix_product_counts_the_stored_entries(layout: torch.layout) -> None:
    # torch.sparse.mm runs aten._sparse_addmm, which had no formula (forward listed as unknown, 0), and its backward
    # runs aten.mm on the transposed sparse adjacency, counted as a dense [n, n] product: on a graph of 20 nodes
    # and 40 edges, 2 * 20 * 20 * 4 = 3,200 FLOPs for 320 of work, growing with n^2 where the work grows with edges.
    adjacency, x = _ring(20, layout), torch.randn(20, 6)
    model = GraphConv(6, 4)
    expected = torch.sparse.mm(adjacency, model.project(x))
    before = hook_state(model)
    with LayerProf(model, metrics=("flops",)) as prof:
        output = model(adjacency, x)
        output.sum().backward()
    assert torch.equal(output, expected) and hook_state(model) == before
    assert prof.unknown_ops() == {}
    project, root = prof.records["project"], prof.tree
    assert project.flops_forward == project.flops_backward == 2 * 20 * 6 * 4  # x: [20, 6] @ w: [6, 4], and dW
    # adjacency [20, 20] with 40 stored @ h: [20, 4]: one multiply-accumulate per stored entry and column
    assert root.flops_forward == 960 + 2 * 40 * 4
    assert root.flops_backward == 960 + 2 * 40 * 4  # dh = adjacency^T @ grad: [20, 4]


def test_sparse_operand_bytes_are_its_indices_and_values() -> None:
    # A sparse tensor was counted by its dense size (n * n elements): 1,600 bytes for the 20-node ring, whose COO
    # form holds 2 * 40 int64 indices and 40 float32 values (800 bytes); a lone CSR operand counted 0 (no strides).
    coo, h = _ring(20, torch.sparse_coo), torch.randn(20, 4)
    bias = torch.zeros(20, 4)
    out = aten._sparse_addmm(bias, coo, h)
    # reads bias 320 + indices 640 + values 160 + h 320, writes out 320
    assert op_bytes(aten._sparse_addmm.default, (bias, coo, h), {}, out) == 320 + 640 + 160 + 320 + 320
    csr = coo.to_sparse_csr()
    # crow_indices 21 int64 (168) + col_indices 40 int64 (320) + values 160, read; the same written
    assert op_bytes(aten.clone.default, (csr,), {}, csr.clone()) == 2 * (168 + 320 + 160)


class ComplexLinear(nn.Module):
    """A linear map with a complex weight (a complex-valued network's layer)."""

    def __init__(self, inputs: int, outputs: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(inputs, outputs, dtype=torch.cfloat))

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        return z @ self.weight


class SpectralMix(nn.Module):
    """The spectral convolution of a Fourier neural operator: complex weights on the lowest modes of the FFT."""

    def __init__(self, channels: int, modes: int) -> None:
        super().__init__()
        self.modes = modes
        self.weight = nn.Parameter(torch.randn(channels, channels, modes, dtype=torch.cfloat))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        spectrum = torch.fft.rfft(x)[..., :self.modes]
        mixed = torch.einsum("bix,iox->box", spectrum, self.weight)
        return torch.fft.irfft(mixed, n=x.shape[-1])


def test_complex_products_count_four_real_multiply_accumulates() -> None:
    # A complex multiply-accumulate, (a + bi)(c + di) added to a sum, is four real ones; complex products were counted
    # as real ones (FlopCounterMode's count), a quarter of their work, beside float32 roofs.
    torch.manual_seed(0)
    model = nn.Sequential(ComplexLinear(8, 16))
    z = torch.randn(3, 8, dtype=torch.cfloat)
    with LayerProf(model, metrics=("flops",)) as prof:
        torch.view_as_real(model(z)).sum().backward()
    record = prof.records["0"]
    assert record.flops_forward == 4 * 2 * 3 * 8 * 16  # z: [3, 8] @ w: [8, 16], 384 complex MACs: 3,072
    assert record.flops_backward == 4 * 2 * 8 * 3 * 16  # dw = z^H: [8, 3] @ grad: [3, 16]
    assert prof.profile.meta["flops"]["dtype"] == "float32"  # complex64's parts: the roofs it runs against


def test_spectral_layer_counts_its_complex_mixing() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(SpectralMix(4, 6))
    x = torch.randn(2, 4, 32)
    with LayerProf(model, metrics=("flops",)) as prof:
        model(x).sum().backward()
    # einsum -> bmm over the 6 modes: [6, 2, 4] @ [6, 4, 4], 192 complex MACs, 4 real ones each
    assert prof.records["0"].flops_forward == 4 * 2 * 6 * 2 * 4 * 4


@pytest.mark.parametrize("mode", ["sum", "mean", "max"])
def test_embedding_bag_is_known_in_every_mode_and_with_sample_weights(mode: str) -> None:
    # A bag with per_sample_weights (mode "sum" only) runs aten._embedding_bag_per_sample_weights_backward in
    # backward, which was listed as an op with no formula ("FLOPs leave out 1 op"): a lookup and its sums are free,
    # as the bag's forward and its other backward kernels are.
    torch.manual_seed(0)
    model = nn.EmbeddingBag(50, 8, mode=mode)
    ids, offsets = torch.randint(0, 50, (10,)), torch.tensor([0, 3, 7])
    weights = torch.rand(10, requires_grad=True) if mode == "sum" else None
    with LayerProf(model, metrics=("flops",)) as prof:
        model(ids, offsets, per_sample_weights=weights).sum().backward()
    assert prof.unknown_ops() == {}
    assert prof.tree.flops_forward == prof.tree.flops_backward == 0
    assert prof.tree.bytes_forward > 0 and prof.tree.bytes_backward > 0



class Sparsify(nn.Module):
    """Makes its output sparse (a pruned activation handed to a sparse product)."""

    def __init__(self, layout: torch.layout) -> None:
        super().__init__()
        self.layout = layout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x).to_sparse(layout=self.layout)


class SparseProduct(nn.Module):
    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return torch.sparse.mm(h, torch.eye(h.shape[1]))


@pytest.mark.parametrize("layout", [torch.sparse_coo, torch.sparse_csr], ids=["coo", "csr"])
def test_conversions_to_sparse_and_their_gradients_are_known_free_ops(layout: torch.layout) -> None:
    # x.to_sparse() runs aten._to_sparse (_to_sparse_csr), and a sparse product's backward to it aten.is_coalesced
    # and aten.sparse_mask: each was listed as an op with no formula, though they only move data (a conversion, a
    # query, a masked copy).
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 8), Sparsify(layout), SparseProduct())
    x = torch.randn(6, 8)
    with LayerProf(model, metrics=("flops",)) as prof:
        model(x).sum().backward()
    assert prof.unknown_ops() == {}
    assert prof.records["1"].flops_forward == 0 and prof.records["1"].flops_backward == 0
    assert prof.records["0"].flops_forward == 2 * 6 * 8 * 8  # x: [6, 8] @ w: [8, 8]
    stored = (torch.relu(model[0](x)) != 0).sum().item()
    # h: [6, 8] sparse @ eye: [8, 8]: one multiply-accumulate per stored entry and column
    assert prof.records["2"].flops_forward == 2 * stored * 8
    # A COO h's gradient is the dense grad: [6, 8] @ eye^T: [8, 8], then masked (torch computes all of it); a CSR
    # h's is sampled at its entries (sparse_sampled_addmm, which was unknown too): 2 * stored * 8.
    backward = 2 * 6 * 8 * 8 if layout == torch.sparse_coo else 2 * stored * 8
    assert prof.records["2"].flops_backward == backward


def test_a_dense_product_counts_exactly_however_large() -> None:
    # Scaling every count by a sparse operand's share of stored entries (1.0 for dense ones) went through a float:
    # a dense product past 2**53 FLOPs lost its last digits (this one read 42 fewer). On meta tensors: no data.
    m, k, n = 3 * 2**20 + 1, 2**20 + 3, 2**20 + 7
    model = nn.Linear(k, n, bias=False, device="meta")
    with LayerProf(model, metrics=("flops",)) as prof:
        model(torch.empty(m, k, device="meta"))
    assert prof.tree.flops_forward == 2 * m * k * n  # x: [m, k] @ w: [k, n]


class SampledProduct(nn.Module):
    def forward(self, mask: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return torch.sparse.sampled_addmm(mask, a, b)


def test_a_batched_sampled_product_counts_each_batch() -> None:
    # torch.sparse.sampled_addmm takes a batch of CSR masks: [3, 5, 6] with 5 entries each, a: [3, 5, 4],
    # b: [3, 4, 6]. The formula read the shapes as a 2-D product (m = 3, k = 5, n = 4): 20 FLOPs for 120.
    mask = torch.stack([torch.eye(5, 6)] * 3).to_sparse_csr()
    model = SampledProduct()
    with LayerProf(model, metrics=("flops",)) as prof:
        model(mask, torch.randn(3, 5, 4), torch.randn(3, 4, 6))
    assert prof.unknown_ops() == {}
    assert prof.tree.flops_forward == 2 * 15 * 4  # 15 stored entries, a row of a times a column of b each: k = 4
