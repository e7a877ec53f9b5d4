"""Recompute time rolls up the module tree: a module not re-run itself whose submodules were (Hugging Face 5.24's
``GradientCheckpointingLayer`` checkpoints ``forward``, not ``__call__``; a model around checkpointed layers) gets
the sum of its children's; an own span is kept; a module that never ran stays None."""
from __future__ import annotations

from typing import Any, Callable

import pytest
import torch
from torch import nn

from layerprof import LayerProf
from layerprof.record.records import ModuleRecord

from .models import CheckpointedBody
from .test_zoo import _bert, _gpt2, hf_checkpoints_layer_call


def children_sum(record: ModuleRecord) -> float:
    return sum(child.recompute_ms for child in record.children if child.recompute_ms is not None)


@pytest.mark.filterwarnings("ignore:`gradient_checkpointing_enable` is deprecated:FutureWarning")
@pytest.mark.parametrize("build, layers", [(_gpt2, "transformer.h"), (_bert, "encoder.layer")], ids=["gpt2", "bert"])
def test_hugging_face_checkpointed_layers_get_their_childrens_recompute(
        build: Callable[[], tuple[nn.Module, dict[str, Any]]], layers: str) -> None:
    pytest.importorskip("transformers")
    torch.manual_seed(0)
    model, inputs = build()
    model.gradient_checkpointing_enable()
    model.train()
    with LayerProf(model) as prof:
        output = model(**inputs)
        (output.loss if getattr(output, "loss", None) is not None else output.last_hidden_state.sum()).backward()
    records = prof.records
    container = records[layers]
    assert container.calls == 0 and container.recompute_ms is None  # iterated, never called: not run, as before
    own_call = hf_checkpoints_layer_call()
    for layer in container.children:
        reruns = [timing.recompute for timing in layer.call_times]
        if own_call:  # transformers 5.17 re-runs the layer's __call__: a recompute call of its own, around its
            # children's
            assert layer.calls == 1 and reruns == [False, True], layer.name
            assert layer.recompute_ms >= children_sum(layer) > 0
        else:  # 5.24 re-runs the layer's forward, not its __call__: no recompute call of its own, only its children's
            assert layer.calls == 1 and reruns == [False], layer.name
            assert layer.recompute_ms == pytest.approx(children_sum(layer), rel=1e-12) and layer.recompute_ms > 0
        # the re-run forward happens inside backward
        assert 0 < layer.recompute_ms <= layer.backward_ms, layer.name
    # the layers' recompute reaches the model through the container that never ran
    layers_total = sum(layer.recompute_ms for layer in container.children)
    holder = records[layers.rsplit(".", 1)[0]]
    assert holder.recompute_ms == pytest.approx(layers_total, rel=1e-12)
    assert prof.tree.recompute_ms == pytest.approx(children_sum(prof.tree), rel=1e-12)
    assert prof.tree.recompute_ms >= layers_total > 0
    assert prof.tree.recompute_ms <= prof.tree.backward_ms
    embeddings = next(name for name in ("transformer.wte", "embeddings") if name in records)
    assert records[embeddings].recompute_ms is None  # not checkpointed


def test_an_own_recompute_span_is_kept_and_rolled_to_the_parent() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(CheckpointedBody())
    with LayerProf(model) as prof:
        model(torch.randn(4, 8, requires_grad=True)).sum().backward()
    body, net = prof.records["0.body"], prof.records["0"]
    # body re-ran as a call: its recompute is that call's time, not its children's sum (which it includes)
    rerun = [timing.forward_ms for timing in body.call_times if timing.recompute]
    assert len(rerun) == 1 and body.recompute_ms == rerun[0] >= children_sum(body)
    assert net.recompute_ms == body.recompute_ms == prof.tree.recompute_ms
    assert prof.records["0.head"].recompute_ms is None


def test_without_checkpointing_recompute_stays_none() -> None:
    model = nn.Sequential(nn.Sequential(nn.Linear(8, 8), nn.ReLU()), nn.Linear(8, 1))
    with LayerProf(model) as prof:
        model(torch.randn(4, 8)).sum().backward()
    assert all(record.recompute_ms is None for record in prof.records.values())
