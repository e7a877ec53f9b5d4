"""FLOP formulas of statically quantized layers (``torch.ao.quantization``'s ``prepare`` and ``convert``: the
``quantized::`` kernels of a quantized Linear or convolution), and their quantize and dequantize steps.

A quantized Linear or convolution multiplies and accumulates as its float counterpart does, in int8: the same
count, 1 MAC = 2 FLOPs. Its weight is packed in an object, which the counter hands to a formula as it is: a
convolution's kernel size is read from it (``packed.weight()``, once per call in the counted step). Quantizing,
dequantizing and the quantized elementwise kernels (``quantized::add``, ``quantized::batch_norm2d``) count 0, as
their float forms do.

>>> quantized_linear_flops([4, 16], None, 0.1, 0, out_shape=[4, 32])  # 2 * 4 * 16 * 32
4096
"""
from __future__ import annotations

from typing import Any, Sequence

import torch

from .formulas import conv_forward_flops, dynamic_quantized_linear_flops, free, register_flop_formula

__all__ = ["quantized_linear_flops", "quantized_convolution_flops"]


# A quantized Linear multiplies as a dynamically quantized one does (its packed weight read from the output's size).
quantized_linear_flops = dynamic_quantized_linear_flops


def quantized_convolution_flops(x: Sequence[int], packed: Any, *args: Any, out_shape: Sequence[int],
                                **kwargs: Any) -> int:
    """A quantized convolution (or transposed one), its kernel read from the packed weight, counted as the float
    one: w: [c_out, c_in / groups, *kernel] (transposed: [c_in, c_out / groups, *kernel])."""
    return conv_forward_flops(x, packed.weight().shape, out_shape, bool(packed.transpose()))


_QUANTIZED = torch.ops.quantized
for _name in ("linear", "linear_relu"):
    if hasattr(_QUANTIZED, _name):
        register_flop_formula(getattr(_QUANTIZED, _name))(quantized_linear_flops)
for _name in ("conv1d", "conv2d", "conv3d", "conv1d_relu", "conv2d_relu", "conv3d_relu", "conv_transpose1d",
              "conv_transpose2d", "conv_transpose3d", "conv_add", "conv2d_add", "conv2d_add_relu"):
    if hasattr(_QUANTIZED, _name):
        register_flop_formula(getattr(_QUANTIZED, _name))(quantized_convolution_flops)
for _name in ("add", "add_relu", "add_scalar", "mul", "mul_relu", "mul_scalar", "cat", "cat_relu", "batch_norm1d",
              "batch_norm2d", "batch_norm3d", "layer_norm", "group_norm", "instance_norm", "hardswish", "relu6",
              "leaky_relu", "sigmoid", "threshold", "elu", "celu", "embedding_byte", "embedding_4bit",
              "embedding_bag_byte_rowwise_offsets", "embedding_bag_4bit_rowwise_offsets"):
    if hasattr(_QUANTIZED, _name):
        register_flop_formula(getattr(_QUANTIZED, _name))(free)
for _name in ("quantize_per_tensor", "quantize_per_tensor_dynamic", "quantize_per_channel", "dequantize",
              "int_repr", "q_scale", "q_zero_point", "q_per_channel_scales", "q_per_channel_zero_points"):
    if hasattr(torch.ops.aten, _name):
        register_flop_formula(getattr(torch.ops.aten, _name))(free)
