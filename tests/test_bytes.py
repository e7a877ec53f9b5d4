"""Bytes read and written per module, forward and backward, counted op by op beside the FLOPs: exact figures,
the arithmetic in the comments (float32 = 4 bytes, int64 = 8 bytes)."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from layerprof import LayerProf
from layerprof.metrics.bytes import BYTES_FORMULAS, op_bytes, register_bytes_formula

pytestmark = pytest.mark.filterwarnings("ignore:only one step was profiled:RuntimeWarning")
aten = torch.ops.aten


def profile(model: nn.Module, *inputs: torch.Tensor, backward: bool = True) -> LayerProf:
    with LayerProf(model, metrics=("flops",)) as prof:
        out = model(*inputs)
        if backward:
            out.sum().backward()
    return prof


def passes(prof: LayerProf, name: str = "") -> tuple[int | None, int | None]:
    record = prof.records[name]
    return record.bytes_forward, record.bytes_backward


class Call(nn.Module):
    """A module around a function, so that functional code has a record."""

    def __init__(self, function) -> None:
        super().__init__()
        self.function = function

    def forward(self, *args: torch.Tensor) -> torch.Tensor:
        return self.function(*args)


def test_linear() -> None:
    prof = profile(nn.Linear(8, 16), torch.randn(4, 8, requires_grad=True))
    # forward addmm: reads bias 16*4 + x 4*8*4 + w 16*8*4 = 64 + 128 + 512 = 704, writes y 4*16*4 = 256
    # backward, g the gradient of sum(): one float expanded to y's shape (stride 0), read as its 4 bytes:
    # grad_x = g @ w reads 4 + 512, writes 128 (644); grad_w = g^T @ x reads 4 + 128, writes 512 (644);
    # grad_b = g.sum(0) reads 4, writes 64 (68)
    assert passes(prof) == (704 + 256, 644 + 644 + 68)
    assert prof.profile.rows()[0]["self_bytes"] == 960 + 1356  # a leaf: its own ops are all its ops


def test_conv2d() -> None:
    prof = profile(nn.Conv2d(3, 8, 3, padding=1), torch.randn(2, 3, 10, 10, requires_grad=True))
    # forward: reads x 2*3*10*10*4 = 2400, w 8*3*3*3*4 = 864, b 8*4 = 32; writes y 2*8*10*10*4 = 6400
    # backward convolution_backward: reads g 4 (sum()'s gradient: one float, expanded) + x 2400 + w 864; writes
    # grad_x 2400, grad_w 864, grad_b 32
    assert passes(prof) == (2400 + 864 + 32 + 6400, 4 + 2400 + 864 + 2400 + 864 + 32)


def test_bmm_and_matmul() -> None:
    a, b = torch.randn(2, 4, 8, requires_grad=True), torch.randn(2, 8, 16, requires_grad=True)
    prof = profile(Call(torch.bmm), a, b)
    # a 2*4*8*4 = 256, b 2*8*16*4 = 1024, out 2*4*16*4 = 512; backward, g sum()'s gradient (one float, expanded:
    # 4 bytes): g @ b^T (4 + 1024 -> 256), a^T @ g (256 + 4 -> 1024)
    assert passes(prof) == (256 + 1024 + 512, (4 + 1024 + 256) + (256 + 4 + 1024))
    x, w = torch.randn(6, 8), torch.randn(8, 4)
    prof = profile(Call(torch.matmul), x, w, backward=False)
    assert passes(prof) == (6 * 8 * 4 + 8 * 4 * 4 + 6 * 4 * 4, None)  # mm: 192 + 128 read, 96 written


def test_layer_norm() -> None:
    prof = profile(nn.LayerNorm(32), torch.randn(4, 32, requires_grad=True))
    # forward: reads x 4*32*4 = 512, weight 128, bias 128; writes y 512, mean 4*4 = 16, rstd 16
    # backward: reads g 4 (sum()'s gradient, one float expanded), x 512, mean 16, rstd 16, weight 128, bias 128
    # (the op's arguments); writes grad_x 512, grad_w 128, grad_b 128
    assert passes(prof) == (512 + 128 + 128 + 512 + 16 + 16, 4 + 512 + 16 + 16 + 128 + 128 + 512 + 128 + 128)


def test_softmax() -> None:
    prof = profile(nn.Softmax(-1), torch.randn(4, 32, requires_grad=True))
    # forward: x 512 read, y 512 written; backward: reads g 4 (sum()'s gradient, one float expanded) and y 512,
    # writes grad_x 512
    assert passes(prof) == (1024, 4 + 512 + 512)


def test_embedding_reads_only_gathered_rows() -> None:
    prof = profile(nn.Embedding(100, 16), torch.tensor([[1, 2, 3], [4, 5, 1]]))
    # forward: reads indices 6*8 = 48 and the 6 rows it gathers 6*16*4 = 384 (not the 100*16*4 = 6400 table),
    # writes them 384; backward embedding_dense_backward: reads g 4 (sum()'s gradient, one float expanded) +
    # indices 48, writes grad_w 6400
    assert passes(prof) == (48 + 384 + 384, 4 + 48 + 6400)


def test_sdpa_reads_q_k_v_once() -> None:
    q, k, v = (torch.randn(2, 2, 8, 4, requires_grad=True) for _ in range(3))
    prof = profile(Call(F.scaled_dot_product_attention), q, k, v)
    # fused CPU kernel: reads q, k, v 2*2*8*4*4 = 512 each; writes out 512 and logsumexp 2*2*8*4 = 128;
    # never the 2*2*8*8 score matrix. backward: reads g 4 (sum()'s gradient, one float expanded), q, k, v, out
    # (4*512) and logsumexp 128, writes grad_q, grad_k, grad_v (3*512)
    assert passes(prof) == (3 * 512 + 512 + 128, 4 + 4 * 512 + 128 + 3 * 512)


def test_elementwise_chain() -> None:
    prof = profile(Call(lambda x: torch.tanh(x * 2 + 1)), torch.randn(4, 32, requires_grad=True))
    # three ops, each reading 512 and writing 512; backward: tanh_backward reads g 4 (sum()'s gradient, one
    # float expanded) and y 512, writes 512; the mul's backward (its gradient) * 2 reads 512, writes 512; the
    # add's passes its gradient through (no op)
    assert passes(prof) == (3 * 1024, 4 + 512 + 512 + 1024)


def test_in_place_ops_and_views() -> None:
    def body(x: torch.Tensor) -> torch.Tensor:
        y = x * 2  # reads 512, writes 512
        y.add_(1)  # in place: reads y 512, writes y 512
        y = y.t()  # a view: moves nothing
        both = torch.cat([y[:8], y[8:16]])  # two views of one storage, 8*4*4 = 128 each: reads 256, writes 256
        return (both * both).contiguous()  # reads `both` once (256), writes 256; contiguous: already is
    prof = profile(Call(body), torch.randn(4, 32, requires_grad=True), backward=False)
    assert passes(prof) == (1024 + 1024 + 512 + 512, None)


def test_storage_once_per_op_and_views_by_extent() -> None:
    x = torch.zeros(8, 16)  # 512 bytes
    assert op_bytes(aten.add.Tensor, (x, x), {}, x + x) == 512 + 512  # x read once
    view = x[:2]  # 2*16*4 = 128 bytes of the 512
    assert op_bytes(aten.mul.Tensor, (view, 3), {}, view * 3) == 128 + 128
    halves = x[:, :8], x[:, 8:]  # two views of 256 each: together the whole storage, no more
    assert op_bytes(aten.add.Tensor, halves, {}, halves[0] + halves[1]) == 512 + 256
    out = torch.empty(8, 16)
    # an out= argument is written, not read: reads x 512, writes out 512
    assert op_bytes(aten.neg.out, (x,), {"out": out}, out) == 1024
    assert op_bytes(aten.copy_.default, (out, x), {}, out) == 1024  # copy_: reads source, writes destination
    assert op_bytes(aten.empty.memory_format, ([8, 16],), {}, out) == 0  # allocation


def test_an_expanded_view_reads_its_elements_once() -> None:
    # ``b.expand(4096, 64)`` is a view with stride 0 over b's 64 floats: an add reads them once, as the same add
    # broadcasting b itself does (before: billed 4096*64*4 = 1,048,576 bytes for b's 256-byte storage alone, and
    # the 256 of the storage where a second view of it joined the same op: reading more counted less).
    a, b, c = torch.randn(4096, 64), torch.randn(1, 64), torch.randn(1, 64)
    wide = b.expand(4096, 64)
    assert op_bytes(aten.add.Tensor, (a, b), {}, a + b) == 4096 * 64 * 4 + 64 * 4 + 4096 * 64 * 4  # 2,097,408
    assert op_bytes(aten.add.Tensor, (a, wide), {}, a + wide) == 4096 * 64 * 4 + 64 * 4 + 4096 * 64 * 4
    one = [wide, c.expand(4096, 64)[:, :32]]  # b's 64 floats and 32 of c's: 256 + 128 bytes read
    two = [wide, wide[:, :32]]  # two views of b's storage: at most its 256 bytes
    written = 4096 * 96 * 4
    assert op_bytes(aten.cat.default, (one, 1), {}, torch.cat(one, 1)) == written + 256 + 128
    assert op_bytes(aten.cat.default, (two, 1), {}, torch.cat(two, 1)) == written + 256
    column = torch.randn(8, 1).expand(8, 16)  # stride (1, 0): 8 floats, each read once
    assert op_bytes(aten.mul.Tensor, (column, 3), {}, column * 3) == 8 * 4 + 8 * 16 * 4


def test_an_overlapping_view_reads_its_storage_once_alone_or_copied() -> None:
    # ``unfold`` makes windows that share elements: 1,024 floats (4,096 bytes) seen as 961 windows of 64. Alone in an
    # op it was billed every window's elements (961 * 64 * 4 = 246,016 bytes), where beside another tensor it was
    # capped at its storage; and ``copy_`` read an expanded source at its expanded size.
    signal = torch.randn(1024)
    windows = signal.unfold(0, 64, 1)  # [961, 64], strides (1, 1)
    out = windows * 2.0
    assert op_bytes(aten.mul.Tensor, (windows, 2.0), {}, out) == 4096 + 961 * 64 * 4  # storage once + written
    scalar = torch.tensor(2.0)
    assert op_bytes(aten.mul.Tensor, (windows, scalar), {}, out) == 4096 + 4 + 961 * 64 * 4
    b, destination = torch.randn(1, 512), torch.empty(1024, 512)
    # copy_: reads b's 512 floats once (2,048 bytes), writes 1024 * 512 * 4
    assert op_bytes(aten.copy_.default, (destination, b.expand(1024, 512)), {}, destination) == 2048 + 2097152
    assert op_bytes(aten.copy_.default, (destination, b), {}, destination) == 2048 + 2097152


def test_nested_modules_inclusive_and_self() -> None:
    net = nn.Sequential(nn.Linear(8, 16), nn.ReLU())
    with LayerProf(net, metrics=("flops",)) as prof:
        net(torch.randn(4, 8))
    linear, relu, root = prof.records["0"], prof.records["1"], prof.tree
    assert linear.bytes_forward == 960  # as in test_linear
    assert relu.bytes_forward == 256 + 256  # reads and writes [4, 16]
    assert root.bytes_forward == 960 + 512 and root.self_bytes == 0  # the Sequential runs no op of its own
    assert root.bytes_backward is None and linear.self_flops == 2 * 4 * 8 * 16


def test_register_bytes_formula_overrides_an_op() -> None:
    saved = BYTES_FORMULAS.get(aten.neg)
    try:
        @register_bytes_formula(aten.neg)
        def neg_bytes(x, *args, out=None, **kwargs):
            return 7
        prof = profile(Call(torch.neg), torch.randn(3), backward=False)
        assert prof.tree.bytes_forward == 7
    finally:
        BYTES_FORMULAS.pop(aten.neg, None)
        if saved is not None:
            BYTES_FORMULAS[aten.neg] = saved
        register_bytes_formula(aten.empty)(BYTES_FORMULAS[aten.empty])  # clears the per-op cache
    assert profile(Call(torch.neg), torch.randn(3), backward=False).tree.bytes_forward == 24


def test_no_bytes_without_the_flops_meter() -> None:
    net = nn.Linear(4, 4)
    with LayerProf(net) as prof:
        net(torch.randn(2, 4))
    assert getattr(prof.tree, "bytes_forward", None) is None
    assert "bytes_forward" not in prof.tree.to_dict()


def test_resnet18_invariants() -> None:
    torchvision = pytest.importorskip("torchvision")
    model = torchvision.models.resnet18(weights=None)
    prof = profile(model, torch.randn(2, 3, 32, 32))
    records = list(prof.records.values())
    for record in records:
        for field in ("bytes_forward", "bytes_backward"):
            children = sum(getattr(child, field) or 0 for child in record.children)
            assert children <= getattr(record, field), (record.name, field)
        assert 0 <= record.self_bytes <= record.bytes_forward + record.bytes_backward
    # every op is credited to exactly one module as its own: the self figures add up to the model's
    assert sum(record.self_bytes for record in records) == prof.tree.bytes_forward + prof.tree.bytes_backward
    assert sum(record.self_flops for record in records) == prof.tree.flops_forward + prof.tree.flops_backward
    # the first conv's input 2*3*32*32*4 = 24576 bytes and weight 64*3*7*7*4 = 37632 are read, its output
    # 2*64*16*16*4 = 131072 written
    assert prof.records["conv1"].bytes_forward == 24576 + 37632 + 131072


def test_checkpoint_recompute_bytes_kept_apart() -> None:
    from torch.utils.checkpoint import checkpoint

    block = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 8))
    net = nn.Sequential(block)
    net.forward = lambda x: checkpoint(block, x, use_reentrant=True)  # type: ignore[method-assign]
    prof = profile(net, torch.randn(4, 8, requires_grad=True))
    record = prof.records["0"]
    # block forward: addmm reads 64 + 128 + 512, writes 256 (960); tanh reads and writes [4, 16] (512);
    # addmm reads bias 32 + h 256 + w 512, writes 128 (928). The reentrant checkpoint re-runs all of it.
    assert record.bytes_forward == 960 + 512 + 928
    assert record.bytes_recompute == record.bytes_forward
    assert prof.tree.bytes_recompute == record.bytes_forward


def test_counting_leaves_outputs_and_gradients_bitwise_identical() -> None:
    transformers = pytest.importorskip("transformers")
    config = transformers.BertConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
                                     intermediate_size=128, vocab_size=500, hidden_dropout_prob=0.0,
                                     attention_probs_dropout_prob=0.0, attn_implementation="sdpa")
    model = transformers.BertModel(config)
    ids = torch.randint(0, 500, (2, 16))

    def run() -> tuple[torch.Tensor, list[torch.Tensor]]:
        model.zero_grad(set_to_none=True)
        out = model(input_ids=ids).last_hidden_state
        out.sum().backward()
        return out.detach(), [p.grad.clone() for p in model.parameters() if p.grad is not None]

    plain_out, plain_grads = run()
    with LayerProf(model, metrics=("flops",)) as prof:
        out, grads = run()
    assert torch.equal(out, plain_out) and len(grads) == len(plain_grads)
    assert all(torch.equal(a, b) for a, b in zip(grads, plain_grads))
    assert prof.tree.bytes_forward > 0 and prof.tree.bytes_backward > 0
    assert all(not module._forward_hooks and not module._forward_pre_hooks for module in model.modules())
