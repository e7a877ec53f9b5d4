"""FLOP formulas, one registry keyed by aten op (overload packet), filled by ``register_flop_formula``.

Convention, stated once for all of layerprof: **1 MAC (multiply-accumulate) = 2 FLOPs**, and only the
multiply-accumulates of matmul-like ops are counted (matmuls, convolutions, attention, RNN gate matmuls), as
``torch.utils.flop_counter.FlopCounterMode`` does; bias adds, activations, norms, softmax and other elementwise
work count 0. Attention counts the dense score matrix even when causal, as FlopCounterMode does. A product with a
sparse operand counts only its stored entries: the counter scales the dense formula by the operand's share of
stored entries (``2 * nnz * n`` for a sparse ``[m, k]`` times a dense ``[k, n]``; FlopCounterMode counts the zeros).
A complex multiply-accumulate is four real ones (8 FLOPs): the counter multiplies a formula's count by 4 where the
op's operands are complex (FlopCounterMode counts them as real).

A formula is a pure function of shapes: the counter calls it with the op's arguments where every tensor is
replaced by its shape (a ``torch.Size``; a list of tensors by a list of shapes; a nested tensor by a list of
its components' shapes) and the output's shapes as ``out_shape``. It returns the FLOPs, or ``None`` for an op
that is known and costs nothing by the convention above. An in-place op without a formula of its own has its
out-of-place op's (``addmm_`` is ``addmm``). An op with no formula, no ``pointwise`` or view tag and no
decomposition is *unknown*: it counts 0 and is listed (``Profile.unknown_ops()``), never silently.

>>> import torch
>>> @torch.library.custom_op("layerprof_doc::scale", mutates_args=())
... def scale(x: torch.Tensor) -> torch.Tensor:
...     return x * 2
>>> @register_flop_formula(torch.ops.layerprof_doc.scale)
... def scale_flops(x, out_shape=None, **kwargs):
...     '''One multiply per element.'''
...     return prod(x)  # x: [*dims]
>>> flop_formula(torch.ops.layerprof_doc.scale.default) is scale_flops, scale_flops(torch.Size([3, 4]))
(True, 12)
"""
from __future__ import annotations

from math import prod
from typing import Any, Callable, Sequence

import torch

from .._torch import has_decomposition

__all__ = ["FLOP_FORMULAS", "NAMED_FLOP_FORMULAS", "register_flop_formula", "register_named_flop_formula",
           "flop_formula", "is_free", "FlopFormula"]

aten = torch.ops.aten

FlopFormula = Callable[..., "int | None"]

FLOP_FORMULAS: dict[Any, FlopFormula] = {}


def _packet(op: Any) -> Any:
    return getattr(op, "overloadpacket", op)


def register_flop_formula(*ops: Any) -> Callable[[FlopFormula], FlopFormula]:
    """Decorator: count ``ops`` (``torch.ops.ns.name`` packets or their overloads) with the decorated formula.

    A later registration for the same op replaces the earlier one, so users can correct a built-in formula.
    """
    if not ops:
        raise TypeError("register_flop_formula needs at least one op, e.g. @register_flop_formula(torch.ops.aten.mm)")

    def register(formula: FlopFormula) -> FlopFormula:
        for op in ops:
            FLOP_FORMULAS[_packet(op)] = formula
        return formula

    return register


# Formulas of ops of another library, keyed by qualified name (``"torchvision::roi_align"``): such an op exists only
# once its library is imported, which may be after layerprof is; ``flop_formula`` finds it by name then.
NAMED_FLOP_FORMULAS: dict[str, FlopFormula] = {}


def register_named_flop_formula(formula: FlopFormula, names: Sequence[str]) -> None:
    """Count the ops of ``names`` (``"namespace::name"``) with ``formula``, whether or not their library is loaded
    yet; an op registered with ``register_flop_formula`` keeps its own formula."""
    for name in names:
        NAMED_FLOP_FORMULAS[name] = formula


def _register_where_present(formula: FlopFormula, names: Sequence[str]) -> None:
    """Count the aten ops of ``names`` that this torch has with ``formula``: pyproject allows torch>=2.1, and many
    kernels came later (an absent one cannot be named, and then needs no formula)."""
    for name in names:
        if hasattr(aten, name):
            register_flop_formula(getattr(aten, name))(formula)


def _out_of_place(op: Any) -> Any:
    """The out-of-place packet of an in-place op (``aten.masked_fill_`` -> ``aten.masked_fill``), else None."""
    packet = _packet(op)
    name = getattr(packet, "__name__", "")
    if not name.endswith("_") or name.startswith("__"):
        return None
    namespace, _, _ = getattr(packet, "_qualified_op_name", "").partition("::")
    return getattr(getattr(torch.ops, namespace, None), name[:-1], None) if namespace else None


def flop_formula(op: Any) -> FlopFormula | None:
    """The registered formula of an op (an OpOverload or packet), or None if it has none. An in-place op with
    none of its own has its out-of-place op's: ``addmm_`` computes what ``addmm`` does."""
    packet = _packet(op)
    formula = FLOP_FORMULAS.get(packet)
    if formula is None:
        functional = _out_of_place(op)
        formula = None if functional is None else FLOP_FORMULAS.get(functional)
    if formula is None:
        formula = NAMED_FLOP_FORMULAS.get(getattr(packet, "_qualified_op_name", ""))
    return formula


# A view's copy (``diagonal_copy``, ``permute_copy``: what ``torch.diag`` and functionalized views run) moves data.
_FREE_TAGS = {torch.Tag.pointwise, torch.Tag.inplace_view, torch.Tag.view_copy}


def is_free(op: Any) -> bool:
    """Ops free by convention without a registry entry: elementwise (``pointwise`` tag), views and their copies,
    random fills.

    A random fill is an op that draws (``nondeterministic_seeded``) and does not decompose: composite ops that
    may draw for their dropout (``aten.scaled_dot_product_attention``, which reaches the counter whole under
    inference_mode) do real work, priced by their decomposition (``aten.lstm`` and ``aten.gru`` by formulas)."""
    if getattr(op, "is_view", False):
        return True
    tags = getattr(op, "tags", ())
    if any(tag in _FREE_TAGS for tag in tags):
        return True
    if torch.Tag.nondeterministic_seeded in tags and not has_decomposition(op):
        return True
    # An in-place op is untagged where its out-of-place op is pointwise (masked_fill_, eq_, threshold_).
    functional = _out_of_place(op)
    overload = getattr(op, "_overloadname", None)
    if functional is None or overload not in functional.overloads():
        return False
    return torch.Tag.pointwise in getattr(functional, overload).tags


# -- matrix products ---------------------------------------------------------------------------------------
@register_flop_formula(aten.mm, aten._scaled_mm)
def mm_flops(a: Sequence[int], b: Sequence[int], *args: Any, **kwargs: Any) -> int:
    """Matrix product."""
    return 2 * a[0] * a[1] * b[1]  # a: [m, k] @ b: [k, n]


_register_where_present(mm_flops, ("_int_mm",))  # int8 @ int8 -> int32 (torchao's int8 dynamic quantization)


@register_flop_formula(aten.addmm, aten._addmm_activation, aten._sparse_addmm)
def addmm_flops(bias: Sequence[int], a: Sequence[int], b: Sequence[int], *args: Any, **kwargs: Any) -> int:
    """Matrix product plus bias; the bias add is free. ``_sparse_addmm`` (``torch.sparse.mm``) is counted dense here
    and scaled to its stored entries by the counter, as every product with a sparse operand is."""
    return mm_flops(a, b)  # bias + a: [m, k] @ b: [k, n]


@register_flop_formula(aten.sparse_sampled_addmm)
def sampled_addmm_flops(mask: Sequence[int], a: Sequence[int], b: Sequence[int], *args: Any, **kwargs: Any) -> int:
    """Matrix product computed only where a sparse mask stores an entry (the gradient of a CSR operand): counted
    dense here, scaled to the mask's stored entries by the counter, ``2 * nnz * k``."""
    return 2 * prod(a) * b[-1]  # mask: [*batch, m, n] sparse, a: [*batch, m, k] @ b: [*batch, k, n] at its entries


@register_flop_formula(aten.bmm)
def bmm_flops(a: Sequence[int], b: Sequence[int], *args: Any, **kwargs: Any) -> int:
    """Batched matrix product."""
    return 2 * a[0] * a[1] * a[2] * b[2]  # a: [batch, m, k] @ b: [batch, k, n]


@register_flop_formula(aten.baddbmm)
def baddbmm_flops(bias: Sequence[int], a: Sequence[int], b: Sequence[int], *args: Any, **kwargs: Any) -> int:
    """Batched matrix product plus bias."""
    return bmm_flops(a, b)  # bias + a: [batch, m, k] @ b: [batch, k, n]


@register_flop_formula(aten.addbmm)
def addbmm_flops(bias: Sequence[int], a: Sequence[int], b: Sequence[int], *args: Any, **kwargs: Any) -> int:
    """Batched matrix products summed over the batch, plus bias (FlopCounterMode counts 0)."""
    return bmm_flops(a, b)  # bias + sum_batch a: [batch, m, k] @ b: [batch, k, n]


def grouped_mm_flops(a: Sequence[int], b: Sequence[int], *args: Any, out_shape: Sequence[int], **kwargs: Any) -> int:
    """Grouped matrix product (mixture-of-experts layers: each group of rows meets its expert's matrix once)."""
    if len(a) == 3 and len(b) == 3:
        return bmm_flops(a, b)  # a: [g, m, k] @ b: [g, k, n]
    if len(a) == 2 and len(b) == 2:
        return mm_flops(a, b)  # a: [m, k_total] @ b: [k_total, n], k split into g groups by offs -> [g, m, n]
    # a: [m_total, k] @ b: [g, k, n] -> [m_total, n], rows split by offs; a: [g, m, k] @ b: [k, n_total] -> [m, n_total]
    return 2 * prod(out_shape) * a[-1]


_register_where_present(grouped_mm_flops, ("_grouped_mm", "_scaled_grouped_mm", "_scaled_grouped_mm_v2"))


@register_flop_formula(aten.addr)
def addr_flops(bias: Sequence[int], a: Sequence[int], b: Sequence[int], *args: Any, **kwargs: Any) -> int:
    """Outer product plus bias: a rank-1 matrix product (FlopCounterMode counts 0)."""
    return 2 * a[0] * b[0]  # bias + a: [n] (x) b: [m], one multiply-accumulate per output element


def packed_weight_mm_flops(a: Sequence[int], *args: Any, out_shape: Sequence[int], **kwargs: Any) -> int:
    """Matrix product with a weight packed to 8 or 4 bits (weight-only quantized Linear; 4 bits has one kernel per
    device: ``_for_cpu`` on the CPU, ``_with_scales_and_zeros`` on XPU); the weight's dequantization is free. The
    packed weight's shape is the packing's, so ``n`` is read from the output."""
    return 2 * a[0] * a[1] * out_shape[-1]  # a: [m, k] @ dequantized weight: [k, n] -> out [m, n]


_register_where_present(packed_weight_mm_flops, ("_weight_int8pack_mm", "_weight_int4pack_mm",
                                                 "_weight_int4pack_mm_for_cpu",
                                                 "_weight_int4pack_mm_with_scales_and_zeros"))


def dynamic_quantized_linear_flops(x: Sequence[int], *args: Any, out_shape: Sequence[int], **kwargs: Any) -> int:
    """Linear with an int8 (or fp16) weight and the input quantized on the fly
    (``torch.ao.quantization.quantize_dynamic``); the quantization and the fused ReLU are free. The packed weight
    is an opaque object, so ``n`` is read from the output."""
    return 2 * prod(x) * out_shape[-1]  # x: [*, k] @ weight: [k, n] -> out [*, n]


for _name in ("linear_dynamic", "linear_relu_dynamic", "linear_dynamic_fp16", "linear_relu_dynamic_fp16",
              "linear_dynamic_fp16_unpacked_weight"):
    # Quantized kernels are registered where torch was built with them (absent from some builds).
    if hasattr(torch.ops.quantized, _name):
        register_flop_formula(getattr(torch.ops.quantized, _name))(dynamic_quantized_linear_flops)


def _unsqueezed(shape: Sequence[int], dims: Sequence[int], rank: int) -> list[int]:
    """``shape`` with a 1 inserted at each of ``dims``, to ``rank`` dimensions (``_trilinear``'s expand)."""
    sizes = iter(shape)
    return [1 if dim in dims else next(sizes) for dim in range(rank)]


@register_flop_formula(aten._trilinear)
def trilinear_flops(i1: Sequence[int], i2: Sequence[int], i3: Sequence[int], expand1: Sequence[int],
                    expand2: Sequence[int], expand3: Sequence[int], *args: Any, **kwargs: Any) -> int:
    """The three-way contraction of ``F.bilinear`` (``nn.Bilinear``) and of its gradients: one multiply-accumulate
    per point of the broadcast space of the three inputs, each unsqueezed at its expand dims (FlopCounterMode
    counts 0). A bilinear layer's forward: x1 [b, i] . W [o, i, j] . x2 [b, j] spans [b, o, i, j]."""
    rank = len(i1) + len(expand1)
    spaces = [_unsqueezed(shape, expand, rank) for shape, expand in ((i1, expand1), (i2, expand2), (i3, expand3))]
    return 2 * prod(max(sizes) for sizes in zip(*spaces))


@register_flop_formula(aten.mv)
def mv_flops(a: Sequence[int], x: Sequence[int], *args: Any, **kwargs: Any) -> int:
    """Matrix-vector product (FlopCounterMode counts 0)."""
    return 2 * a[0] * a[1]  # a: [m, k] @ x: [k]


@register_flop_formula(aten.addmv)
def addmv_flops(bias: Sequence[int], a: Sequence[int], x: Sequence[int], *args: Any, **kwargs: Any) -> int:
    """Matrix-vector product plus bias (FlopCounterMode counts 0)."""
    return mv_flops(a, x)  # bias + a: [m, k] @ x: [k]


@register_flop_formula(aten.dot, aten.vdot)
def dot_flops(a: Sequence[int], b: Sequence[int], *args: Any, **kwargs: Any) -> int:
    """Inner product of two vectors (FlopCounterMode counts 0)."""
    return 2 * a[0]  # a: [k] . b: [k]


@register_flop_formula(aten._euclidean_dist)
def euclidean_dist_flops(x1: Sequence[int], x2: Sequence[int], *args: Any, out_shape: Sequence[int],
                         **kwargs: Any) -> int:
    """``torch.cdist``'s matrix-product path (p=2 on more than 25 rows: a VQ codebook lookup). The kernel pads each
    row with its squared norm and a 1, then multiplies: ``[-2 x1, |x1|^2, 1] @ [x2, 1, |x2|^2]^T`` (FlopCounterMode
    counts 0, and the gradient's products, which it counts)."""
    return 2 * prod(out_shape) * (x1[-1] + 2)  # x1: [*, m, d + 2] @ x2^T: [*, d + 2, n] -> [*, m, n]


@register_flop_formula(aten.affine_grid_generator)
def affine_grid_flops(theta: Sequence[int], size: Sequence[int], *args: Any, out_shape: Sequence[int],
                      **kwargs: Any) -> int:
    """``F.affine_grid`` (a spatial transformer): every point of the base grid, homogeneous, times the affine
    matrix (FlopCounterMode counts 0, and the gradient's batched product, which it counts)."""
    # 2-D: base grid [n, h * w, 3] @ theta^T [n, 3, 2] -> [n, h, w, 2]; 3-D: [n, d * h * w, 4] @ [n, 4, 3]
    return 2 * prod(out_shape) * theta[-1]


# -- convolutions ------------------------------------------------------------------------------------------
def conv_forward_flops(x: Sequence[int], w: Sequence[int], out: Sequence[int], transposed: bool = False) -> int:
    """One convolution: every weight element meets every position of the larger spatial side once per sample."""
    # x: [n, c_in, *spatial_in], w: [c_out, c_in / groups, *kernel] (transposed: [c_in, c_out / groups, *kernel])
    # -> out: [n, c_out, *spatial_out]; the sliding positions are spatial_out, or spatial_in when transposed.
    positions = prod(x[2:]) if transposed else prod(out[2:])
    return 2 * x[0] * prod(w) * positions


@register_flop_formula(aten.convolution, aten._convolution, aten.convolution_overrideable)
def convolution_flops(x: Sequence[int], w: Sequence[int], bias: Any, stride: Any, padding: Any, dilation: Any,
                      transposed: bool, *args: Any, out_shape: Sequence[int], **kwargs: Any) -> int:
    """Convolution (groups are in the weight's shape); the bias add is free."""
    return conv_forward_flops(x, w, out_shape, bool(transposed))  # x: [n, c_in, h, w] * w: [c_out, c_in/g, kh, kw]


@register_flop_formula(aten.cudnn_convolution, aten.mkldnn_convolution, aten._slow_conv2d_forward)
def plain_convolution_flops(x: Sequence[int], w: Sequence[int], *args: Any, out_shape: Sequence[int],
                            **kwargs: Any) -> int:
    """A backend's non-transposed convolution kernel."""
    return conv_forward_flops(x, w, out_shape, False)  # x: [n, c_in, h, w] * w: [c_out, c_in/g, kh, kw]


@register_flop_formula(aten.cudnn_convolution_transpose)
def transposed_convolution_flops(x: Sequence[int], w: Sequence[int], *args: Any, out_shape: Sequence[int],
                                 **kwargs: Any) -> int:
    """A backend's transposed convolution kernel."""
    return conv_forward_flops(x, w, out_shape, True)  # x: [n, c_in, h, w] * w: [c_in, c_out/g, kh, kw]


@register_flop_formula(aten.convolution_backward)
def convolution_backward_flops(grad_out: Sequence[int], x: Sequence[int], w: Sequence[int], bias_sizes: Any,
                               stride: Any, padding: Any, dilation: Any, transposed: bool, output_padding: Any,
                               groups: int, output_mask: Sequence[bool], **kwargs: Any) -> int:
    """Input gradient and weight gradient each redo every product of the forward once: each costs the forward.

    FlopCounterMode (torch 2.14) computes the weight gradient as an ungrouped convolution, so it counts it
    ``groups`` times too high: a depthwise 3x3 conv with 64 groups has forward+backward = 66x forward there.
    """
    # grad_out: [n, c_out, *spatial_out]; grad_input = conv_transpose(grad_out, w), grad_w = conv(x, grad_out).
    forward = conv_forward_flops(x, w, grad_out, bool(transposed))
    return forward * (int(bool(output_mask[0])) + int(bool(output_mask[1])))  # the bias gradient is a sum


@register_flop_formula(aten.conv_tbc)
def conv_tbc_flops(x: Sequence[int], w: Sequence[int], *args: Any, out_shape: Sequence[int], **kwargs: Any) -> int:
    """Time-batch-channel 1-D convolution (fairseq's ``ConvTBC``): every weight element meets every output position
    (FlopCounterMode counts 0, and the backward's products, which it counts)."""
    return 2 * out_shape[0] * out_shape[1] * prod(w)  # x: [t, b, c_in] * w: [k, c_in, c_out] -> [t_out, b, c_out]


# -- attention ---------------------------------------------------------------------------------------------
def attention_flops(batch: int, heads: int, seq_q: int, seq_k: int, dim_qk: int, dim_v: int) -> int:
    """Scores and weighted sum of one dense attention."""
    # q: [b, h, s_q, d] @ k^T: [b, h, d, s_k] -> scores: [b, h, s_q, s_k] @ v: [b, h, s_k, d_v]
    return 2 * batch * heads * seq_q * seq_k * (dim_qk + dim_v)


def attention_backward_flops(batch: int, heads: int, seq_q: int, seq_k: int, dim_qk: int, dim_v: int) -> int:
    """Backward of one dense attention: recompute scores, then dP = dO V^T, dV = P^T dO, dQ = dS K, dK = dS^T Q."""
    # scores (d_qk) + dP (d_v) + dV (d_v) + dQ (d_qk) + dK (d_qk), each 2 * b * h * s_q * s_k * d FLOPs
    return 2 * batch * heads * seq_q * seq_k * (3 * dim_qk + 2 * dim_v)


@register_flop_formula(
    aten._scaled_dot_product_flash_attention_for_cpu,
    aten._scaled_dot_product_flash_attention,
    aten._scaled_dot_product_efficient_attention,
    aten._scaled_dot_product_cudnn_attention,
    aten._scaled_dot_product_fused_attention_overrideable,
)
def sdpa_flops(q: Sequence[int], k: Sequence[int], v: Sequence[int], *args: Any, **kwargs: Any) -> int:
    """Fused scaled-dot-product attention (FlopCounterMode counts 0 for the CPU kernel)."""
    return attention_flops(q[0], q[1], q[2], k[2], q[3], v[3])  # q: [b, h, s_q, d], k: [b, h_kv, s_k, d]


@register_flop_formula(
    aten._scaled_dot_product_flash_attention_for_cpu_backward,
    aten._scaled_dot_product_flash_attention_backward,
    aten._scaled_dot_product_efficient_attention_backward,
    aten._scaled_dot_product_cudnn_attention_backward,
    aten._scaled_dot_product_fused_attention_overrideable_backward,
)
def sdpa_backward_flops(grad_out: Sequence[int], q: Sequence[int], k: Sequence[int], v: Sequence[int],
                        *args: Any, **kwargs: Any) -> int:
    """Backward of fused scaled-dot-product attention."""
    return attention_backward_flops(q[0], q[1], q[2], k[2], q[3], v[3])  # q: [b, h, s_q, d], v: [b, h, s_k, d_v]


def flex_attention_flops(q: Sequence[int], k: Sequence[int], v: Sequence[int], *args: Any, **kwargs: Any) -> int:
    """Flex attention (a higher-order op): the dense scores and weighted sum, whatever its block mask skips."""
    return attention_flops(q[0], q[1], q[2], k[2], q[3], v[3])  # q: [b, h, s_q, d], k: [b, h_kv, s_k, d]


def flex_attention_backward_flops(q: Sequence[int], k: Sequence[int], v: Sequence[int], *args: Any,
                                  **kwargs: Any) -> int:
    """Backward of flex attention: recompute the scores, then dP, dV, dQ, dK, as the fused kernels do."""
    return attention_backward_flops(q[0], q[1], q[2], k[2], q[3], v[3])  # q: [b, h, s_q, d], v: [b, h, s_k, d_v]


# Higher-order ops are named under torch.ops.higher_order, where this torch has them (flex attention: 2.5).
for _name, _formula in (("flex_attention", flex_attention_flops),
                        ("flex_attention_backward", flex_attention_backward_flops)):
    if hasattr(torch.ops.higher_order, _name):
        register_flop_formula(getattr(torch.ops.higher_order, _name))(_formula)


def _varlen_dims(q: Sequence[int], k: Sequence[int], v: Sequence[int], cum_seq_q: Sequence[int] | None,
                 max_q: int, max_k: int) -> tuple[int, int, int, int, int, int]:
    if cum_seq_q is None:  # dense, kernel layout q: [b, s_q, h, d]
        return q[0], q[2], q[1], k[1], q[3], v[3]
    # packed q: [total, h, d] with offsets cum_seq_q: [b + 1]: every sequence counted at its maximum length
    return cum_seq_q[0] - 1, q[1], max_q, max_k, q[2], v[2]


@register_flop_formula(aten._flash_attention_forward)
def flash_attention_flops(q: Sequence[int], k: Sequence[int], v: Sequence[int], cum_seq_q: Sequence[int] | None,
                          cum_seq_k: Any, max_q: int, max_k: int, *args: Any, **kwargs: Any) -> int:
    """The flash attention kernel (layout [b, s, h, d], or packed: an upper bound)."""
    dense = len(q) == 4
    return attention_flops(*_varlen_dims(q, k, v, None if dense else cum_seq_q, max_q, max_k))


@register_flop_formula(aten._efficient_attention_forward)
def efficient_attention_flops(q: Sequence[int], k: Sequence[int], v: Sequence[int], bias: Any,
                              cu_seqlens_q: Sequence[int] | None, cu_seqlens_k: Any, max_q: int | None,
                              max_k: int | None, *args: Any, **kwargs: Any) -> int:
    """The memory-efficient attention kernel (layout [b, s, h, d], or packed: an upper bound)."""
    dense = len(q) == 4
    return attention_flops(*_varlen_dims(q, k, v, None if dense else cu_seqlens_q, max_q or 0, max_k or 0))


@register_flop_formula(aten._flash_attention_backward)
def flash_attention_backward_flops(grad_out: Sequence[int], q: Sequence[int], k: Sequence[int], v: Sequence[int],
                                   out: Any, logsumexp: Any, cum_seq_q: Sequence[int] | None, cum_seq_k: Any,
                                   max_q: int, max_k: int, *args: Any, **kwargs: Any) -> int:
    """Backward of the flash attention kernel (layout [b, s, h, d], or packed: an upper bound)."""
    dense = len(q) == 4
    return attention_backward_flops(*_varlen_dims(q, k, v, None if dense else cum_seq_q, max_q, max_k))


@register_flop_formula(aten._efficient_attention_backward)
def efficient_attention_backward_flops(grad_out: Sequence[int], q: Sequence[int], k: Sequence[int],
                                       v: Sequence[int], bias: Any, out: Any, cu_seqlens_q: Sequence[int] | None,
                                       cu_seqlens_k: Any, max_q: int, max_k: int, *args: Any, **kwargs: Any) -> int:
    """Backward of the memory-efficient attention kernel (layout [b, s, h, d], or packed: an upper bound)."""
    dense = len(q) == 4
    return attention_backward_flops(*_varlen_dims(q, k, v, None if dense else cu_seqlens_q, max_q, max_k))


def nested_linear_flops(x: Any, weight: Sequence[int], *args: Any, **kwargs: Any) -> int:
    """``F.linear`` on a nested tensor (given as its components' shapes): each component's rows times the weight
    (``nn.TransformerEncoder``'s layers on a padded batch, where a hook of the user's turns the fused path off)."""
    rows = [prod(shape[:-1]) for shape in x] if isinstance(x, list) else [prod(x[:-1])]
    return sum(2 * count * weight[1] * weight[0] for count in rows)  # [rows, in] @ [in, out] per component


# Ops that decompose on plain tensors but run whole on a strided nested tensor, whose sizes a decomposition cannot
# read: priced per component.
NESTED_FORMULAS: dict[Any, Any] = {aten.linear.default: nested_linear_flops}


def _lengths(x: Any) -> list[int]:
    """Sequence lengths of a [b, s, e] batch, or of a nested batch given as its components' [s_i, e] shapes."""
    if isinstance(x, list):
        return [shape[0] for shape in x]
    return [x[1]] * x[0]


def _multi_head_attention_flops(lengths_q: list[int], lengths_k: list[int], embed: int) -> int:
    # per sample: q/k/v projections [s, e] @ [e, e], scores and weighted sum (heads * head_dim = e), out projection
    total = 0
    for seq_q, seq_k in zip(lengths_q, lengths_k):
        total += 2 * embed * embed * (2 * seq_q + 2 * seq_k) + attention_flops(1, 1, seq_q, seq_k, embed, embed)
    return total


@register_flop_formula(aten._native_multi_head_attention)
def native_multi_head_attention_flops(q: Any, k: Any, v: Any, embed_dim: int, num_heads: int,
                                      *args: Any, **kwargs: Any) -> int:
    """nn.MultiheadAttention's fused inference path: in-projections, attention, out-projection."""
    return _multi_head_attention_flops(_lengths(q), _lengths(k), embed_dim)  # q: [b, s_q, e], k, v: [b, s_k, e]


@register_flop_formula(aten._transformer_encoder_layer_fwd)
def transformer_encoder_layer_flops(src: Any, embed_dim: int, num_heads: int, qkv_weight: Any, qkv_bias: Any,
                                    proj_weight: Any, proj_bias: Any, use_gelu: bool, norm_first: bool, eps: float,
                                    norm_weight_1: Any, norm_bias_1: Any, norm_weight_2: Any, norm_bias_2: Any,
                                    ffn_weight_1: Sequence[int], *args: Any, **kwargs: Any) -> int:
    """nn.TransformerEncoderLayer's fused inference path: self-attention plus the two feed-forward linears."""
    lengths = _lengths(src)  # src: [b, s, e]; ffn_weight_1: [f, e], ffn_weight_2: [e, f]
    return _multi_head_attention_flops(lengths, lengths, embed_dim) + 2 * 2 * sum(lengths) * prod(ffn_weight_1)


# -- recurrent kernels -------------------------------------------------------------------------------------
def _rnn_tokens(x: Sequence[int], batch_sizes: Sequence[int]) -> int:
    # x: [t, b, i] or [b, t, i] (either way t * b tokens), or packed [sum(batch_sizes), i]
    return sum(batch_sizes) if batch_sizes else prod(x[:-1])


@register_flop_formula(aten.mkldnn_rnn_layer)
def mkldnn_rnn_layer_flops(x: Sequence[int], w_ih: Sequence[int], w_hh: Sequence[int], b_ih: Any, b_hh: Any,
                           hx: Any, cx: Any, reverse: bool, batch_sizes: Sequence[int], *args: Any,
                           **kwargs: Any) -> int:
    """One layer, one direction of nn.LSTM on CPU: the gate matmuls x @ w_ih^T and h @ w_hh^T at every step."""
    # x: [t, b, i] @ w_ih: [gates * h, i]^T, h: [b, h] @ w_hh: [gates * h, h]^T, t steps; gate math is free
    return 2 * _rnn_tokens(x, batch_sizes) * (prod(w_ih) + prod(w_hh))


@register_flop_formula(aten.mkldnn_rnn_layer_backward)
def mkldnn_rnn_layer_backward_flops(x: Sequence[int], w_ih: Sequence[int], w_hh: Sequence[int], *args: Any,
                                    **kwargs: Any) -> int:
    """Backward of one mkldnn RNN layer: the kernel always computes data and weight gradients, 2x the forward."""
    # batch_sizes is the 21st argument (index 20); gradients of x and h (1x) and of w_ih and w_hh (1x)
    batch_sizes = args[17] if len(args) > 17 else kwargs.get("batch_sizes", ())
    return 2 * 2 * _rnn_tokens(x, batch_sizes) * (prod(w_ih) + prod(w_hh))


def _cudnn_rnn_matrix_elements(weights: Sequence[Sequence[int]]) -> int:
    # per layer and direction: w_ih [g*h, i], w_hh [g*h, h or proj], biases [g*h], optionally w_hr [proj, h]
    return sum(prod(shape) for shape in weights if len(shape) == 2)


@register_flop_formula(aten._cudnn_rnn)
def cudnn_rnn_flops(x: Sequence[int], weights: Sequence[Sequence[int]], *args: Any, **kwargs: Any) -> int:
    """A whole nn.LSTM/GRU/RNN on cuDNN: every weight matrix meets every token once per layer and direction."""
    batch_sizes = args[12]  # (x, weights, weight_stride0, weight_buf, hx, cx, mode, ..., batch_sizes, dropout_state)
    # x: [t, b, i]; each 2-D weight [out, in] is one [tokens, in] @ [in, out] matmul
    return 2 * _rnn_tokens(x, batch_sizes) * _cudnn_rnn_matrix_elements(weights)


def _whole_rnn_flops(x: Sequence[int], params: Sequence[Sequence[int]], tokens: int) -> int:
    # every 2-D weight ([gates * h, in]) meets every token once per layer and direction; biases are free
    return 2 * tokens * _cudnn_rnn_matrix_elements(params)


@register_flop_formula(aten.gru, aten.rnn_tanh, aten.rnn_relu)
def whole_rnn_flops(x: Sequence[int], second: Any, params: Any, *args: Any, **kwargs: Any) -> int:
    """nn.GRU/nn.RNN on CPU under inference_mode, where the op reaches the meter whole: priced here and run as it
    is (run decomposed, its output had other bits than unprofiled)."""
    if params and isinstance(params[0], int):  # packed: (data [tokens, i], batch_sizes, hx, params, ...)
        return _whole_rnn_flops(x, args[0], x[0])
    return _whole_rnn_flops(x, params, prod(x[:-1]))  # (input [b, t, i] or [t, b, i], hx, params, ...)


@register_flop_formula(aten.lstm)
def whole_lstm_flops(x: Sequence[int], second: Any, third: Any, *args: Any, **kwargs: Any) -> int:
    """nn.LSTM on CPU under inference_mode, where the op reaches the meter whole: priced here and run as it is (run
    decomposed, a packed LSTM's output, or one with dropout between layers, had other bits than unprofiled)."""
    if second and isinstance(second[0], int):  # packed: (data [tokens, i], batch_sizes [t], [h0, c0], params, ...)
        return _whole_rnn_flops(x, args[0], x[0])
    return _whole_rnn_flops(x, third, prod(x[:-1]))  # (input [b, t, i] or [t, b, i], [h0, c0], params, ...)


@register_flop_formula(aten.miopen_rnn)
def miopen_rnn_flops(x: Sequence[int], weights: Sequence[Sequence[int]], *args: Any, **kwargs: Any) -> int:
    """A whole nn.LSTM/GRU/RNN on MIOpen: every weight matrix meets every token once per layer and direction."""
    batch_sizes = args[10]  # (x, weights, weight_stride0, hx, cx, mode, ..., batch_sizes, dropout_state)
    return 2 * _rnn_tokens(x, batch_sizes) * _cudnn_rnn_matrix_elements(weights)  # x: [t, b, i]


@register_flop_formula(aten._cudnn_rnn_backward)
def cudnn_rnn_backward_flops(x: Sequence[int], weights: Sequence[Sequence[int]], *args: Any, **kwargs: Any) -> int:
    """Backward of a cuDNN RNN: data gradients (1x forward) always, weight gradients (1x) when asked."""
    batch_sizes, output_mask = args[16], args[19]  # after x and weights: ... batch_sizes, ..., output_mask[4]
    forward = 2 * _rnn_tokens(x, batch_sizes) * _cudnn_rnn_matrix_elements(weights)
    return forward * (1 + int(bool(output_mask[3])))


# -- ops that are free by convention but carry no pointwise/view tag ----------------------------------------
def free(*args: Any, **kwargs: Any) -> None:
    """Known op with no counted FLOPs (reductions, norms, softmax, pooling, copies, factories, losses)."""
    return None


_FREE_OPS = (
    # reductions and statistics
    "sum", "mean", "amax", "amin", "max", "min", "argmax", "argmin", "prod", "var", "var_mean", "std", "std_mean",
    "norm", "linalg_vector_norm", "cumsum", "cumprod", "logsumexp", "all", "any", "topk", "sort", "count_nonzero",
    # normalization, softmax, losses
    "native_layer_norm", "native_layer_norm_backward", "native_batch_norm", "native_batch_norm_backward",
    "_native_batch_norm_legit", "_native_batch_norm_legit_no_training", "_native_batch_norm_legit_functional",
    "batch_norm_backward", "cudnn_batch_norm", "cudnn_batch_norm_backward", "miopen_batch_norm",
    "native_group_norm", "native_group_norm_backward", "_fused_rms_norm", "_fused_rms_norm_backward",
    "_softmax", "_log_softmax", "_softmax_backward_data", "_log_softmax_backward_data", "_safe_softmax",
    "nll_loss_forward", "nll_loss_backward", "nll_loss2d_forward", "nll_loss2d_backward", "mse_loss",
    "mse_loss_backward", "binary_cross_entropy", "binary_cross_entropy_backward",
    "binary_cross_entropy_with_logits", "smooth_l1_loss", "smooth_l1_loss_backward",
    # pooling and resampling
    "max_pool2d_with_indices", "max_pool2d_with_indices_backward", "max_pool3d_with_indices",
    "max_pool3d_with_indices_backward", "avg_pool2d", "avg_pool2d_backward", "avg_pool3d", "avg_pool3d_backward",
    "_adaptive_avg_pool2d", "_adaptive_avg_pool2d_backward", "_adaptive_avg_pool3d",
    "_adaptive_avg_pool3d_backward", "adaptive_max_pool2d", "adaptive_max_pool2d_backward", "_pdist_forward",
    "upsample_nearest2d", "upsample_nearest2d_backward", "upsample_bilinear2d", "upsample_bilinear2d_backward",
    "_upsample_nearest_exact2d", "_upsample_bilinear2d_aa", "grid_sampler_2d", "constant_pad_nd",
    "reflection_pad2d", "replication_pad2d", "upsample_nearest1d", "upsample_nearest3d", "upsample_linear1d",
    "upsample_bicubic2d", "upsample_trilinear3d", "_upsample_nearest_exact1d", "_upsample_nearest_exact3d",
    "_upsample_bicubic2d_aa", "_upsample_lanczos2d_aa", "grid_sampler_3d", "_grid_sampler_2d_cpu_fallback",
    "adaptive_max_pool3d", "fractional_max_pool3d", "max_unpool3d", "max_pool2d_backward",
    "adaptive_avg_pool3d_backward", "unfold_copy",
    # embeddings, indexing, copies, factories, dropout
    "embedding", "embedding_dense_backward", "_embedding_bag", "index", "index_put", "index_put_", "_index_put_impl_",
    "index_select", "index_add", "index_copy", "gather", "scatter", "scatter_add", "scatter_reduce",
    "masked_fill", "masked_scatter", "masked_select", "where", "cat", "stack", "clone", "copy", "copy_",
    "_to_copy", "_copy_from", "_copy_from_and_resize", "contiguous", "empty", "empty_like", "empty_strided",
    "new_empty", "new_empty_strided", "new_zeros", "new_ones", "new_full", "zeros", "zeros_like", "ones",
    "ones_like", "full", "full_like", "fill", "fill_", "zero_", "arange", "linspace", "scalar_tensor", "tril",
    "triu", "flip", "roll", "repeat", "repeat_interleave", "slice_backward", "select_backward",
    "index_select_backward", "unfold_backward", "as_strided_scatter", "slice_scatter", "select_scatter",
    "diagonal_scatter", "nonzero", "unique", "_unique2", "bincount", "one_hot", "native_dropout",
    "native_dropout_backward", "lift_fresh", "lift_fresh_copy", "_local_scalar_dense", "item", "equal",
    "_assert_async", "_assert_tensor_metadata", "_has_compatible_shallow_copy_type", "set_", "resize_",
    "_resize_output_", "_unsafe_index", "_unsafe_index_put", "_pin_memory", "_efficientzerotensor",
    "_thnn_fused_lstm_cell", "_thnn_fused_lstm_cell_backward_impl", "_thnn_fused_gru_cell",
    "_thnn_fused_gru_cell_backward", "_masked_softmax", "_fused_sdp_choice", "_chunk_cat", "split_with_sizes_copy",
    "_foreach_add", "_foreach_add_", "_foreach_mul", "_foreach_mul_", "_foreach_div_", "_foreach_sqrt",
    "_foreach_addcmul_", "_foreach_addcdiv_", "_foreach_lerp_", "_foreach_copy_", "_foreach_zero_",
    "_fused_adam_", "_fused_adamw_", "_fused_sgd_",
    # activations and their backwards whose overloads carry no pointwise tag
    "relu", "gelu", "gelu_backward", "hardswish", "hardswish_", "hardswish_backward", "hardsigmoid",
    "hardsigmoid_", "hardsigmoid_backward", "hardtanh", "hardtanh_", "hardtanh_backward", "elu", "elu_backward",
    "leaky_relu", "leaky_relu_backward", "softplus", "softplus_backward", "mish", "mish_backward", "silu",
    "silu_backward", "threshold", "threshold_backward", "log_sigmoid_forward", "log_sigmoid_backward",
    "_prelu_kernel", "_prelu_kernel_backward", "glu", "glu_backward", "rrelu_with_noise",
    "rrelu_with_noise_backward", "softshrink_backward", "hardshrink_backward", "sigmoid_backward", "tanh_backward",
    # more data movement, statistics and losses
    "_unsafe_view", "unsafe_split", "unsafe_split_with_sizes", "split_copy", "im2col", "col2im", "pixel_shuffle",
    "pixel_unshuffle", "channel_shuffle", "reflection_pad1d", "reflection_pad3d", "replication_pad1d",
    "replication_pad3d", "max_unpool2d", "fractional_max_pool2d", "_embedding_bag_backward",
    "_embedding_bag_dense_backward", "huber_loss", "huber_loss_backward", "soft_margin_loss", "multi_margin_loss",
    "_ctc_loss", "_ctc_loss_backward", "_weight_norm_interface", "_weight_norm_interface_backward",
    "_batch_norm_with_update", "_batch_norm_no_update", "native_norm", "renorm", "logcumsumexp", "cummax",
    "cummin", "median", "nanmedian", "mode", "kthvalue", "aminmax", "histc", "searchsorted", "bucketize",
    "_nested_tensor_from_mask", "_nested_tensor_from_mask_left_aligned", "to_padded_tensor", "_nested_tensor_size",
    "_transform_bias_rescale_qkv", "_masked_softmax_backward", "_to_dense", "_coalesce", "_fused_dropout",
    # indexing, reordering and elementwise kernels without a pointwise tag; random draws of the philox family
    "index_fill", "index_reduce", "floor_divide", "take", "put", "unique_consecutive", "unique_dim", "_unique",
    "nonzero_static", "diag_embed", "rot90", "alias_copy", "narrow_copy", "trace", "complex", "polar",
    "_unsafe_masked_index", "_unsafe_masked_index_put_accumulate", "embedding_renorm", "_embedding_bag_forward_only",
    "_embedding_bag_per_sample_weights_backward", "segment_reduce", "_segment_reduce_backward", "_cummax_helper",
    "_cummin_helper", "_philox_key_split",
    "_philox_normal", "_philox_uniform",
    # sparse COO tensors made from indices and values (the gradient of an Embedding with sparse=True), conversions
    # to sparse layouts and the masked copy and query of a sparse operand's gradient (x.to_sparse() in a forward)
    "_sparse_coo_tensor_with_dims_and_tensors", "_sparse_coo_tensor_with_dims", "_coalesced_", "_to_sparse",
    "_to_sparse_csr", "_to_sparse_csc", "_to_sparse_bsr", "_to_sparse_bsc", "is_coalesced", "sparse_mask",
    "_sparse_mask_projection",
    # checks and index factories (transformers' torch_compilable_check runs _is_all_true in LLaVA's forward)
    "_is_all_true", "_is_any_true", "isin", "allclose", "tril_indices", "triu_indices",
    # more factories, reductions and data movement (SigLIP's loss makes its labels with eye, DETR's takes a diagonal)
    "eye", "logspace", "nansum", "diagonal_backward", "block_diag", "histogram", "_pack_padded_sequence",
    # distances computed directly, without a matrix product (torch.cdist on few rows or p != 2, F.pdist), a cross
    # product and a margin loss: elementwise work and reductions
    "_cdist_forward", "_cdist_backward", "_pdist_backward", "linalg_cross", "multilabel_margin_loss_forward",
    "multilabel_margin_loss_backward",
    # fake quantization (quantization-aware training's FakeQuantize and its fused observer) rounds and clamps
    "_fused_moving_avg_obs_fq_helper", "fake_quantize_per_tensor_affine_cachemask",
    "_fake_quantize_per_tensor_affine_cachemask_tensor_qparams", "fake_quantize_per_channel_affine_cachemask",
    "_fake_quantize_learnable_per_tensor_affine", "_fake_quantize_learnable_per_channel_affine",
)

_register_where_present(free, _FREE_OPS)
for _name in _FREE_OPS:
    # The backward of an op with no multiply-accumulates has none either (reflection_pad2d_backward, ...); one
    # that decomposes is left to be priced by its parts.
    _backward = getattr(aten, _name + "_backward", None)
    if _backward is not None and not any(has_decomposition(getattr(_backward, overload))
                                         for overload in _backward.overloads()):
        register_flop_formula(_backward)(free)
register_flop_formula(torch.ops.prim.device)(free)

# Ops that carry no arithmetic, outside aten: ``record_function``'s range marks (DistributedDataParallel's forward
# opens one, and so may a model's own code), and the collectives of DDP, FSDP and functional collectives
# (communication, which FlopCounterMode does not count either).
_FREE_OTHER_OPS = {
    "profiler": ("_record_function_enter", "_record_function_enter_new", "_record_function_exit"),
    "c10d": ("broadcast_", "allreduce_", "allreduce_coalesced_", "allgather_", "allgather_coalesced_",
             "allgather_into_tensor_coalesced_", "_allgather_base_", "reduce_", "reduce_scatter_",
             "_reduce_scatter_base_", "reduce_scatter_tensor_coalesced_", "gather_", "scatter_", "alltoall_",
             "alltoall_base_", "barrier", "monitored_barrier_", "send", "recv_", "recv_any_source_"),
    "_c10d_functional": ("all_reduce", "all_reduce_", "all_reduce_coalesced", "all_reduce_coalesced_",
                         "all_gather_into_tensor", "all_gather_into_tensor_coalesced", "all_gather_into_tensor_out",
                         "reduce_scatter_tensor", "reduce_scatter_tensor_coalesced", "reduce_scatter_tensor_out",
                         "all_to_all_single", "broadcast", "broadcast_", "wait_tensor"),
}
for _namespace, _names in _FREE_OTHER_OPS.items():
    for _name in _names:  # (a torch built without distributed support has no c10d ops: nothing to name then)
        _op = getattr(getattr(torch.ops, _namespace), _name, None)
        if _op is not None:
            register_flop_formula(_op)(free)
# Data movement defined by modules that may load after layerprof, so named: FSDP2's copies into and out of its
# all-gather and reduce-scatter buffers (``torch.distributed.fsdp`` defines them when imported), and the autograd
# wrapping of a functional collective's result (DTensor's redistribute).
register_named_flop_formula(free, ("fsdp::all_gather_copy_in", "fsdp::split_with_sizes_copy", "fsdp::chunk_cat",
                                   "fsdp::copy_", "_c10d_functional::_wrap_tensor_autograd"))

# torch's primitives (``prims``) that functorch's forward-mode rules run as they are (``jacfwd``, ``hessian``:
# ``prims.add`` and ``prims.mul`` on tangents): elementwise, shapes, copies and reductions, free as their aten
# counterparts are; their ops carry no pointwise tag.
_FREE_PRIMS = (
    "abs", "acos", "acosh", "asin", "asinh", "atan", "atanh", "cos", "cosh", "erf", "erfc", "exp", "expm1", "exp2",
    "log", "log1p", "log2", "log10", "neg", "reciprocal", "sign", "sin", "sinh", "sqrt", "rsqrt", "tan", "tanh",
    "add", "sub", "mul", "div", "pow", "maximum", "minimum", "eq", "ne", "ge", "gt", "le", "lt", "where",
    "convert_element_type", "broadcast_in_dim", "clone", "sum", "amax", "amin", "prod", "var",
)
for _name in _FREE_PRIMS:
    if hasattr(torch.ops.prims, _name):
        register_flop_formula(getattr(torch.ops.prims, _name))(free)
