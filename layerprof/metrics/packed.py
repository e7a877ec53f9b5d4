"""Weights packed in a ``torch.ScriptObject``, which are neither parameters nor buffers: a dynamically quantized
Linear's (``torch.ao.quantization.quantize_dynamic``), a statically quantized convolution's or Linear's, a quantized
embedding's. ``packed_tensors`` finds them for the params meter; ``packed_linear_bytes`` prices a dynamically
quantized Linear's bytes, its weight included."""
from __future__ import annotations

from typing import Any

import torch

__all__ = ["packed_tensors", "packed_linear_bytes"]


def _holds_packed(module: torch.nn.Module) -> bool:
    """Whether an attribute of ``module`` is a ``torch.ScriptObject``, for a module of a quantized class
    (``torch.ao.nn.quantized...``, its ``dynamic`` and ``intrinsic`` forms, or another library's module whose name says
    ``quantized``) without parameters of its own: the look through every attribute would cost each module of a model
    about 2.5 µs as a block on it first starts (a 9,001-module stack: 53.6 ms to read its parameters, 76.0 with it)."""
    if module._parameters or "quantized" not in type(module).__module__:
        return False
    return any(isinstance(value, torch.ScriptObject) for value in module.__dict__.values())


def packed_tensors(module: torch.nn.Module) -> list[torch.Tensor]:
    """The weights and biases ``module`` holds packed (none for a module without a ``torch.ScriptObject``): what its
    state dict saves for itself beyond its parameters and buffers, tensors of one dimension or more (a scale and zero
    point are the output's quantization). A weight packed in float16 that unpacks to float32
    (``quantize_dynamic(dtype=torch.float16)``) stands in the dtype it is stored in, as an empty meta tensor."""
    if not _holds_packed(module):
        return []
    own = {id(tensor) for table in (module._parameters, module._buffers) for tensor in table.values()}
    stored = getattr(module, "dtype", None)
    found = []
    for key, value in module.state_dict(keep_vars=True).items():
        if "." in key:  # (a child's: counted where it is held)
            continue
        for tensor in value if isinstance(value, tuple) else (value,):
            if not isinstance(tensor, torch.Tensor) or not tensor.dim() or id(tensor) in own:
                continue
            if (isinstance(stored, torch.dtype) and stored.is_floating_point and tensor.dim() >= 2
                    and tensor.dtype != stored):
                tensor = torch.empty(tensor.shape, dtype=stored, device="meta")
            found.append(tensor.detach())
    return found


def packed_linear_bytes(itemsize: int) -> Any:
    """The bytes formula of a dynamically quantized Linear whose packed weight has ``itemsize`` bytes an element
    (int8: 1, float16: 2): the input, the weight and the float32 bias read, the output written."""

    def formula(x: torch.Tensor, packed: Any, *args: Any, out: Any = None, **kwargs: Any) -> int:
        bias = packed.bias() if isinstance(packed, torch.ScriptObject) else None
        weight = x.shape[-1] * out.shape[-1] * itemsize  # x: [*, k] @ weight: [k, n] -> out: [*, n]
        read = x.numel() * x.element_size() + weight + (0 if bias is None else bias.numel() * bias.element_size())
        return read + out.numel() * out.element_size()

    return formula
