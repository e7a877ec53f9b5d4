"""All three meters on the real-model zoo: results unchanged bitwise, invariants hold, checkpointing shows."""
from __future__ import annotations

import pytest
import torch

from layerprof import LayerProf

from .conftest import hook_state
from .invariants import check_profile
from .test_zoo import ZOO, _gpt2, hf_checkpoints_layer_call, zoo_step

ALL = ("params", "shapes", "memory")
INCLUSIVE = ("params", "trainable_params", "param_bytes", "buffers", "buffer_bytes", "activation_bytes", "saved_bytes")


@pytest.mark.parametrize("name", list(ZOO))
def test_zoo_with_every_meter(name: str) -> None:
    model, step = zoo_step(name)

    before = hook_state(model)
    plain_loss, plain_grads = step()
    with LayerProf(model, metrics=ALL) as prof:
        prof_loss, prof_grads = step()
    assert torch.equal(plain_loss, prof_loss)
    assert all((a is None and b is None) or torch.equal(a, b) for a, b in zip(plain_grads, prof_grads))
    assert hook_state(model) == before
    assert torch._C._autograd._top_saved_tensors_default_hooks(False) is None
    check_profile(prof, model)

    root = prof.tree
    assert root.params == sum(p.numel() for p in model.parameters())
    assert root.saved_bytes > 0 and root.activation_bytes > 0 and root.input_shapes
    for record in prof.records.values():
        assert (record.input_shapes is None) == (record.calls == 0), record.name
        for child in record.children:
            for field in INCLUSIVE:
                if record.calls and child.calls or field.endswith(("params", "param_bytes", "buffers", "buffer_bytes")):
                    assert getattr(child, field) <= getattr(record, field), (record.name, child.name, field)
    assert sum(r.self_saved_bytes or 0 for r in prof.records.values()) == root.saved_bytes


def test_hugging_face_gradient_checkpointing_saves_less() -> None:
    profiles = {}
    for checkpointing in (False, True):
        torch.manual_seed(0)
        model, inputs = _gpt2()
        if checkpointing:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model.train()
        with LayerProf(model, metrics=("memory",)) as prof:
            model(**inputs).loss.backward()
        profiles[checkpointing] = prof.records
    plain, checkpointed = profiles[False], profiles[True]
    # The checkpointed block keeps only its input hidden states, 2*16*32 float32 = 4096 B, to recompute from: in
    # the block where the checkpoint is called from its forward (transformers 5.24), in the model around it where
    # the checkpoint wraps the block's __call__ (5.17: the model keeps both blocks' inputs itself, where it keeps
    # nothing unchecked).
    kept = 2 * 16 * 32 * 4
    if hf_checkpoints_layer_call():
        assert checkpointed["transformer.h.0"].saved_bytes == 0 < plain["transformer.h.0"].saved_bytes
        assert checkpointed["transformer"].self_saved_bytes == 2 * kept and plain["transformer"].self_saved_bytes == 0
    else:
        assert checkpointed["transformer.h.0"].saved_bytes == kept < plain["transformer.h.0"].saved_bytes
    for part in ("attn", "mlp"):
        assert checkpointed[f"transformer.h.0.{part}"].saved_bytes == 0 < plain[f"transformer.h.0.{part}"].saved_bytes
        assert checkpointed[f"transformer.h.0.{part}"].recompute_ms is not None
    assert checkpointed[""].saved_bytes < plain[""].saved_bytes / 4
