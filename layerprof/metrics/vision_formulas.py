"""FLOP formulas of torchvision's own ops (``torch.ops.torchvision``), registered by name: they exist only once
torchvision is imported, which may be after layerprof is.

A deformable convolution (``torchvision.ops.deform_conv2d``, ``DeformConv2d``) is a convolution whose inputs are
sampled at learned offsets: its multiply-accumulates are those of a convolution of the same shapes, and the bilinear
sampling and the modulation mask are elementwise work, free by the convention of ``formulas``, as
``F.grid_sample`` is. Its backward computes the input, offset and mask gradients from one product with the weight
and the weight gradient from another: twice the forward, as a convolution's backward.

RoI pooling and alignment (``roi_align``, ``roi_pool``, their position-sensitive forms and their backwards) average or
take the maximum of bilinear samples, and ``nms`` compares boxes: no multiply-accumulates, 0 FLOPs, as
``upsample_bilinear2d`` and pooling count.

>>> deform_conv2d_flops([2, 4, 8, 8], [8, 4, 3, 3], out_shape=[2, 8, 8, 8])  # 2 * (2*8*8*8) * (4*3*3)
73728
"""
from __future__ import annotations

from math import prod
from typing import Any, Sequence

from .formulas import free, register_named_flop_formula

__all__ = ["deform_conv2d_flops", "deform_conv2d_backward_flops"]


def deform_conv2d_flops(x: Sequence[int], w: Sequence[int], *args: Any, out_shape: Sequence[int],
                        **kwargs: Any) -> int:
    """A deformable convolution: every output element takes ``c_in / groups * kh * kw`` multiply-accumulates."""
    # x: [n, c_in, h, w] * w: [c_out, c_in / groups, kh, kw] -> out: [n, c_out, h_out, w_out]
    return 2 * prod(out_shape) * prod(w[1:])


def deform_conv2d_backward_flops(grad_out: Sequence[int], x: Sequence[int], w: Sequence[int], *args: Any,
                                 **kwargs: Any) -> int:
    """Its backward: the columns' gradient (weight^T @ grad_out) and the weight gradient (grad_out @ columns^T),
    each the forward's products once; the input, offset and mask gradients from the columns are elementwise."""
    return 2 * deform_conv2d_flops(x, w, out_shape=grad_out)


register_named_flop_formula(deform_conv2d_flops, ("torchvision::deform_conv2d",))
register_named_flop_formula(deform_conv2d_backward_flops, ("torchvision::_deform_conv2d_backward",))
register_named_flop_formula(free, tuple(f"torchvision::{name}" for name in (
    "nms", "roi_align", "_roi_align_backward", "roi_pool", "_roi_pool_backward", "ps_roi_align",
    "_ps_roi_align_backward", "ps_roi_pool", "_ps_roi_pool_backward", "qroi_align")))
