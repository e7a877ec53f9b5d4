"""Meter sweep: accidents for the memory, shapes, params and flops meters and the roofline."""
import torch
from torch import nn

from layerprof import LayerProf
from layerprof.metrics.bytes import op_bytes

aten = torch.ops.aten


def test_like_fills_do_not_read_their_template():
    # zeros_like / new_zeros use the template's shape and dtype only: the op writes its result, reads nothing.
    x = torch.zeros(4, 8)  # 128 bytes
    cases = [(aten.zeros_like.default, (x,)), (aten.ones_like.default, (x,)), (aten.full_like.default, (x, 2.0)),
             (aten.new_zeros.default, (x, [4, 8])), (aten.new_ones.default, (x, [4, 8])),
             (aten.new_full.default, (x, [4, 8], 1.0)), (aten.randn_like.default, (x,))]
    for op, args in cases:
        assert op_bytes(op, args, {}, op(*args)) == 128, op


class _ZerosLike(nn.Module):
    def forward(self, x):
        return torch.zeros_like(x)


def test_module_of_zeros_like_moves_its_output_only():
    model = nn.Sequential(_ZerosLike())
    x = torch.randn(16, 16)  # 1 KiB
    with LayerProf(model, metrics=("flops",), peaks={"flops": 1e12, "bandwidth": 1e11}) as prof:
        model(x)
        prof.step()
    assert prof.records["0"].bytes_forward == 1024
