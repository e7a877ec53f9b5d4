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


class _TwoBranchBlock(nn.Module):
    """A pre-norm block that calls its feed-forward twice (timm ViT's block shape, reduced): a model's own
    checkpoint around it stops recomputing early, inside the second call."""

    def __init__(self) -> None:
        super().__init__()
        self.n1, self.n2 = nn.LayerNorm(64), nn.LayerNorm(64)
        self.fc1, self.act, self.fc2 = nn.Linear(64, 256), nn.GELU(), nn.Linear(256, 64)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.fc2(self.act(self.fc1(self.n1(x))))
        return x + self.fc2(self.act(self.fc1(self.n2(x))))


@pytest.mark.usefixtures("live_bytes_torch")
def test_a_models_own_checkpoint_that_stops_early_keeps_no_recomputed_graph_alive() -> None:
    # Checkpoint's early stop raises out of the recomputation. The recomputed block's call then never walked its
    # graph, and the nodes its sub-calls' walks had left to it (with the tensors the recomputed graph saved) stayed
    # on the call until the block's end: the profiled step's peak read 20,480 bytes (one GELU output, 4x5x256 fp32)
    # above the plain step's, and peak plans on it were refused as out of reach.
    from layerprof.metrics.live_bytes import read_step
    from torch.utils.checkpoint import checkpoint

    torch.manual_seed(0)
    inp, block, head = nn.Linear(32, 64), _TwoBranchBlock(), nn.Linear(64, 1)
    model = nn.ModuleDict({"inp": inp, "block": block, "head": head})
    x = torch.randn(4, 5, 32)

    def step() -> None:
        model.zero_grad(set_to_none=True)
        head(checkpoint(block, inp(x), use_reentrant=False)).sum().backward()

    step()
    plain = read_step(step).peak
    with LayerProf(model) as prof:
        profiled = read_step(step).peak
    assert profiled == plain
    assert prof.records["block"].recompute_ms is not None  # the recomputation was seen and timed
    assert prof.records["block.fc1"].calls == 2


@pytest.mark.usefixtures("live_bytes_torch")
def test_a_forward_that_raised_lets_go_of_the_graph_it_was_building() -> None:
    # A forward that ran out of memory and is tried again (a smaller batch): the failed attempt's graph, saved
    # tensors and all, was held by the profiler until the block's end.
    import gc

    from torch.multiprocessing.reductions import StorageWeakRef

    class Fails(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(8, 8)
            self.fail = True

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            scaled = x * 3
            h = scaled.sin()  # the call's own node, which the sub-call's walk hands to it, saves ``scaled``
            kept.append(StorageWeakRef(scaled.untyped_storage()))
            out = self.fc(h)
            if self.fail:
                raise RuntimeError("out of memory (made up)")
            return out

    kept: list[Any] = []
    model = nn.Sequential(Fails())
    x = torch.randn(64, 8, requires_grad=True)
    with LayerProf(model) as prof:
        with pytest.raises(RuntimeError, match="made up"):
            model(x)
        gc.collect()
        assert kept[0].expired()  # the failed attempt's tensors are gone while the block runs on
        model[0].fail = False
        model(x[:32]).sum().backward()
    assert prof.records["0"].calls == 1 and prof.records["0"].backward_ms is not None
