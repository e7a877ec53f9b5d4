"""The shapes meter: shapes, dtypes and paths through any nesting, several calls, and no tensor kept alive."""
from __future__ import annotations

import gc
import weakref
from dataclasses import dataclass
from typing import Any

import pytest
import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

import layerprof
from layerprof import LayerProf
from layerprof.metrics.shapes import tensor_specs
from layerprof.render.units import format_shapes

from .models import DictOut, KwargsDataclass, SharedLoop

transformers = pytest.importorskip("transformers")


def _profile(model: nn.Module, *args: Any, metrics: tuple[str, ...] = ("shapes",), **kwargs: Any) -> LayerProf:
    with LayerProf(model, metrics=metrics) as prof:
        model(*args, **kwargs)
    return prof


@pytest.mark.filterwarnings("ignore:The PyTorch API of nested tensors")
@pytest.mark.parametrize("layout", [torch.strided, torch.jagged], ids=["strided", "jagged"])
def test_a_nested_tensors_shape_has_none_for_its_ragged_dimension(layout: torch.layout) -> None:
    # Two components, [3, 4] and [2, 4]: 2 of them, a ragged dimension, then 4. A strided nested tensor has no
    # shape to read (it was recorded as []), a jagged one a symbolic size (a SymInt in the record)
    nested = torch.nested.nested_tensor([torch.randn(3, 4), torch.randn(2, 4)], layout=layout)
    with torch.no_grad():
        prof = _profile(nn.Linear(4, 4), nested)
    record = prof.records[""]
    assert record.input_shapes == record.output_shapes == [[2, None, 4]]
    assert layerprof.loads(prof.profile.to_json()).records[""].input_shapes == [[2, None, 4]]
    assert "In: [2, ?, 4]" in prof.layerwise_summary(columns=("input_shapes",))


def test_linear_shapes_dtypes_paths() -> None:
    model = nn.Sequential(nn.Linear(10, 20), nn.ReLU())
    prof = _profile(model, torch.randn(4, 10))
    linear = prof.records["0"]
    assert linear.input_shapes == [[4, 10]] and linear.output_shapes == [[4, 20]]
    assert linear.input_dtypes == ["float32"] and linear.output_dtypes == ["float32"]
    assert linear.input_paths == ["0"] and linear.output_paths == [""]  # a bare tensor output has the empty path
    assert linear.shape_variants == 1
    text = prof.layerwise_summary(columns=("input_shapes", "output_shapes"))
    assert "(0): Linear【In: [4, 10] | Out: [4, 20]】(in_features=10" in text


@dataclass
class Batch:
    tokens: torch.Tensor
    lengths: list[int]


class Nested(nn.Module):
    """Positional args with a list and a dict inside, a dataclass, keyword args; returns a tuple with a dict."""

    def forward(self, x: torch.Tensor, pair: list[Any], batch: Batch, *, mask: torch.Tensor, scale: float = 1.0) -> Any:
        return x * scale, {"sum": [pair[0] + 1, 3], "none": None}, batch.tokens.float().mean()


def test_nested_args_kwargs_dataclass_outputs() -> None:
    x = torch.randn(2, 3)
    pair = [torch.zeros(5), {"m": torch.ones(1, 2, dtype=torch.float16)}]
    batch = Batch(tokens=torch.zeros(2, 7, dtype=torch.long), lengths=[7, 7])
    prof = _profile(Nested(), x, pair, batch, mask=torch.ones(2, dtype=torch.bool), scale=2.0)
    root = prof.records[""]
    # Depth first: args in order (inside: list items, dict values, dataclass fields), then kwargs.
    assert root.input_paths == ["0", "1.0", "1.1.m", "2.tokens", "mask"]
    assert root.input_shapes == [[2, 3], [5], [1, 2], [2, 7], [2]]
    assert root.input_dtypes == ["float32", "float32", "float16", "int64", "bool"]
    assert root.output_paths == ["0", "1.sum.0", "2"]
    assert root.output_shapes == [[2, 3], [5], []]  # a 0-d tensor has the shape []
    assert format_shapes(root.output_shapes) == "[2, 3], [5], []"
    assert format_shapes(root.input_shapes) == "[2, 3], [5], [1, 2], … +2"


def test_kwargs_only_and_dataclass_or_dict_outputs() -> None:
    prof = _profile(KwargsDataclass(), features=torch.randn(3, 8))
    root = prof.records[""]
    assert root.input_paths == ["features"] and root.input_shapes == [[3, 8]]
    assert root.output_paths == ["logits", "hidden"] and root.output_shapes == [[3, 2], [3, 8]]
    prof = _profile(DictOut(), torch.randn(3, 8))
    assert prof.records[""].output_paths == ["a", "b"]


def test_hugging_face_model_output_and_int_inputs() -> None:
    config = transformers.BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                     intermediate_size=32, max_position_embeddings=16)
    model = transformers.BertModel(config).eval()
    ids = torch.randint(0, 50, (2, 8))
    prof = _profile(model, input_ids=ids, attention_mask=torch.ones_like(ids))
    root = prof.records[""]
    assert root.input_paths == ["input_ids", "attention_mask"] and root.input_dtypes == ["int64", "int64"]
    assert root.output_paths == ["last_hidden_state", "pooler_output"]
    assert root.output_shapes == [[2, 8, 16], [2, 16]]
    assert prof.records["embeddings.word_embeddings"].output_shapes == [[2, 8, 16]]


def test_several_calls() -> None:
    model = SharedLoop()  # cell called three times on [2, 8]
    prof = _profile(model, torch.randn(2, 8))
    cell = prof.records["cell"]
    assert cell.calls == 3 and cell.shape_variants == 1 and cell.input_shapes == [[2, 8]]
    layer = nn.Linear(4, 4)
    with LayerProf(layer, metrics=("shapes",)) as prof:
        layer(torch.randn(1, 4))
        layer(torch.randn(5, 4))
        layer(torch.randn(1, 4))
    record = prof.records[""]
    # The first call's shapes are shown; two distinct signatures were seen.
    assert record.calls == 3 and record.shape_variants == 2 and record.input_shapes == [[1, 4]]


def test_checkpoint_recompute_adds_no_variant() -> None:
    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.block = nn.Linear(4, 4)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return checkpoint(self.block, x, use_reentrant=False)

    model = Net()
    with LayerProf(model, metrics=("shapes",)) as prof:
        model(torch.randn(2, 4, requires_grad=True)).sum().backward()
    block = prof.records["block"]
    assert block.recompute_ms is not None and block.calls == 1 and block.shape_variants == 1


def test_keeps_no_tensor_alive() -> None:
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU())
    gc.collect()
    gc.disable()  # reference counting alone must free them: no cycle through the profiler either
    try:
        x = torch.randn(2, 4, requires_grad=True)
        with LayerProf(model, metrics=("shapes", "memory")) as prof:
            y = model(x)
            y.sum().backward()
        refs = [weakref.ref(x), weakref.ref(y)]
        del x, y
        assert [ref() for ref in refs] == [None, None]
        assert prof.records[""].input_shapes == [[2, 4]]
    finally:
        gc.enable()


def test_tensor_specs_hold_only_sizes_and_dtypes() -> None:
    specs = tensor_specs((torch.zeros(2, 3), 5, "text"), {"k": (torch.zeros(1),)})
    assert specs == (((0,), torch.Size([2, 3]), torch.float32), (("k", 0), torch.Size([1]), torch.float32))
    assert all(not isinstance(part, torch.Tensor) for spec in specs for part in spec)


def test_iter_tensors_finds_what_iter_tensor_paths_finds_in_the_same_order() -> None:
    # The tracker reads every call's output with iter_tensors (a stack, no generator per level); the shapes meter
    # with iter_tensor_paths. Both must see the same tensors, in the same order, down to the same depth limit.
    import dataclasses
    import random

    from layerprof._tensors import iter_tensor_paths, iter_tensors

    @dataclasses.dataclass
    class Pair:
        a: object
        b: object

    def nest(depth: int) -> object:
        roll = rng.random()
        if depth > 18 or roll < 0.3:  # deeper than the limit of 16 on some branches
            return torch.zeros(1) if rng.random() < 0.6 else rng.choice([1, "x", None, 2.0])
        if roll < 0.5:
            return [nest(depth + 1) for _ in range(rng.randint(0, 3))]
        if roll < 0.7:
            return tuple(nest(depth + 1) for _ in range(rng.randint(0, 3)))
        if roll < 0.85:
            return {str(i): nest(depth + 1) for i in range(rng.randint(0, 3))}
        return Pair(nest(depth + 1), nest(depth + 1))

    rng = random.Random(0)
    found = 0
    for _ in range(2000):
        value = nest(0)
        fast = [id(t) for t in iter_tensors(value)]
        assert fast == [id(t) for _, t in iter_tensor_paths(value)]
        found += len(fast)
    assert found > 1000
    deep: object = torch.ones(1)
    for _ in range(20):
        deep = [deep]
    assert list(iter_tensors(deep)) == [] and list(iter_tensors([[torch.ones(1)]]))[0].item() == 1.0
    # Flat containers (read without the general walk's stack): a module's tuple with None, a ModelOutput, a dict
    # whose last value is not a tensor (the general walk from there), and a list.
    from transformers.modeling_outputs import BaseModelOutput

    t, u = torch.ones(1), torch.zeros(2)
    for flat, expected in (((t, None, u), [t, u]), (BaseModelOutput(last_hidden_state=u), [u]),
                           ({"a": t, "b": u, "n": 3}, [t, u]), ([u, t], [u, t]), ((t, (u,)), [t, u]), ((), [])):
        assert [id(x) for x in iter_tensors(flat)] == [id(x) for x in expected]
        assert [id(x) for _, x in iter_tensor_paths(flat)] == [id(x) for x in expected]


def test_the_walk_of_every_calls_output_looks_up_no_field_names() -> None:
    # iter_tensors reads every module call's output (the tracker's hot path); a named tuple's field names are the
    # shapes meter's paths only. A tuple type that counts the lookups of its ``_fields``: none in the walk.
    from collections import namedtuple

    from layerprof._tensors import iter_tensor_paths, iter_tensors

    looked_up = []

    class Counting(type):
        def __getattribute__(cls, name: str) -> object:
            if name == "_fields":
                looked_up.append(name)
            return super().__getattribute__(name)

    Pair = Counting("Pair", (namedtuple("Pair", "first second"),), {})
    t, u = torch.ones(1), torch.zeros(2)
    value = (Pair(t, [u]), {"x": Pair(u, t)}, None)
    assert [id(x) for x in iter_tensors(value)] == [id(t), id(u), id(u), id(t)]
    assert looked_up == []
    assert [path for path, _ in iter_tensor_paths(value)] == [
        (0, "first"), (0, "second", 0), (1, "x", "first"), (1, "x", "second")]
    assert looked_up


def test_steps_of_other_shapes_are_noted_where_a_meter_counts_one_step() -> None:
    # A short first batch, then long ones: FLOPs and saved bytes were the 4-row step's while the times were the
    # 512-row steps' (FLOP/s 128 times too low, a plan's bytes against other steps' recompute times), unsaid.
    import warnings

    net = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 64))
    with pytest.warns(RuntimeWarning, match=r"the steps' inputs changed shape \(3 step\(s\) other than the first's\), "
                      r"and metrics \['flops', 'memory'\] count one step"):
        with LayerProf(net, metrics=("flops", "memory", "shapes")) as prof:
            for rows in (4, 512, 512, 512):
                net(torch.randn(rows, 64)).sum().backward()
                prof.step()
    assert prof.profile.meta["shapes"] == {"steps_with_other_shapes": 3}
    assert prof.tree.flops_forward == 2 * 4 * (64 * 256 + 256 * 64)  # the counted step's: 4 rows
    with pytest.warns(RuntimeWarning, match=r"checkpoint_plan: the profiled steps' inputs changed shape"):
        prof.profile.checkpoint_plan("50%", wrap_cost=None)
    # Steps alike (shapes changing inside a step, as a growing cache's, are alike from step to step): no note.
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with LayerProf(net, metrics=("flops", "memory", "shapes")) as prof:
            for _ in range(3):
                for rows in (2, 3):
                    net(torch.randn(rows, 64)).sum().backward()
                prof.step()
    assert "shapes" not in prof.profile.meta and prof.records["0"].shape_variants == 2


def test_a_last_short_batch_is_not_steps_of_other_shapes() -> None:
    # An epoch's last batch is short: the first step's shapes are still the workload's, and nothing is noted.
    import warnings

    net = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with LayerProf(net, metrics=("flops", "memory", "shapes")) as prof:
            for rows in (32, 32, 32, 32, 7):
                net(torch.randn(rows, 16)).sum().backward()
                prof.step()
        prof.profile.checkpoint_plan("50%", wrap_cost=None)
    assert "shapes" not in prof.profile.meta and prof.records["0"].shape_variants == 2


def test_steps_of_other_shapes_are_noted_without_the_shapes_meter() -> None:
    # Without the shapes meter nothing told: FLOPs of a batch of 8 against the times of batches of 1,024 read every
    # Linear as overhead-bound at 1.4 % of the roof. The root's inputs tell it: its calls' batch sizes and shapes.
    import warnings

    net = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 64))
    with pytest.warns(RuntimeWarning, match=r"the model's inputs changed shape after the counted step, and metrics "
                      r"\['flops'\] count one step"):
        with LayerProf(net, metrics=("flops",)) as prof:
            for rows in (8, 1024, 1024):
                net(torch.randn(rows, 64)).sum().backward()
                prof.step()
    assert prof.tree.flops_forward == 2 * 8 * (64 * 256 + 256 * 64)  # the counted step's: 8 rows
    # A last short batch, or steps of one shape: no note.
    for batches in ((16, 16, 16, 5), (16, 16, 16)):
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            with LayerProf(net, metrics=("flops",)) as prof:
                for rows in batches:
                    net(torch.randn(rows, 64)).sum().backward()
                    prof.step()
