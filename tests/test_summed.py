"""A module never called itself (ModuleList, ModuleDict, a root the step did not call) counts as the sum of its
children, by one rule (``record/summed.py``) that the summary, the report and the plots share."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from layerprof import LayerProf, load
from layerprof.record.records import ModuleRecord
from layerprof.record.summed import TreeValues
from layerprof.render.plot_layout import layout_tree
from layerprof.render.plot_metrics import resolve_metric
from layerprof.render.report import report_data
from layerprof.render.summary import SUMMED_NOTE, annotated_repr
from layerprof.render.tree import render_tree

from .models import MLP

transformers = pytest.importorskip("transformers")


def _records(spec: list[tuple[str, str, float | None, float | None]]) -> ModuleRecord:
    records: dict[str, ModuleRecord] = {}
    for name, kind, forward, backward in spec:
        parent = records[name.rpartition(".")[0]] if name else None
        record = records[name] = ModuleRecord(name, kind, parent=parent)
        if forward is not None:
            record.calls, record.forward_ms, record.backward_ms = 1, forward, backward
    return records[""]


# A root that was not called, a Linear that ran, a ModuleList of two that ran, a ModuleDict of one that did not.
SPEC = [("", "Net", None, None), ("a", "Linear", 2.0, 1.0), ("layers", "ModuleList", None, None),
        ("layers.0", "Linear", 3.0, 2.0), ("layers.1", "Linear", 4.0, 1.0),
        ("heads", "ModuleDict", None, None), ("heads.x", "Linear", None, None)]


def test_values_of_summed_containers_by_hand() -> None:
    root = _records(SPEC)
    layers, heads = root.children[1], root.children[2]
    values = TreeValues(root)
    assert [values.summed(r) for r in (root, layers, heads)] == [True, True, False]  # heads: nothing under it ran
    assert values.value(layers, "forward_ms") == 3.0 + 4.0 and values.value(layers, "backward_ms") == 2.0 + 1.0
    assert values.value(root, "total_ms") == (2 + 1) + (7 + 3)  # the root: its top-level modules that ran
    assert values.value(layers, "time_percent") == pytest.approx(100 * 10 / 13)
    assert values.value(layers, "self_forward_ms") is None and values.value(layers, "calls") == 0
    assert values.value(heads, "forward_ms") is None
    assert root.forward_ms is None and layers.forward_ms is None  # the records are not changed
    # ModuleList takes no level: its children are at its depth
    assert [values.shown_depth(r) for r in (root, layers, *layers.children)] == [0, 1, 1, 1]


def test_a_root_given_times_without_a_call_keeps_them() -> None:
    root = _records(SPEC)
    root.forward_ms, root.backward_ms = 10.0, 5.0  # an integration billing the trainer's step to the root
    values = TreeValues(root)
    assert not values.summed(root) and values.value(root, "total_ms") == 15.0
    assert values.value(root.children[1], "time_percent") == pytest.approx(100 * 10 / 15)
    assert annotated_repr(root).startswith("Step: forward 10 ms, backward 5 ms, total 15 ms; percentages are")


def test_summary_totals_a_root_that_did_not_run_and_says_so() -> None:
    text = annotated_repr(_records(SPEC))
    assert text.split("\n")[:6] == [
        "Step: forward 9 ms, backward 4 ms, total 13 ms, summed over the top-level modules that ran (the model "
        "itself was not called); percentages are of that total.",
        # 9 / 13 = 69.2 %, 4 / 13 = 30.8 %
        f"Net【Forward Time: 9 ms (69.2%) | Backward Time: 4 ms (30.8%) | {SUMMED_NOTE}】(",
        "  (a): Linear【Forward Time: 2 ms (15.4%) | Backward Time: 1 ms (7.7%)】()",
        f"  (layers): ModuleList【Forward Time: 7 ms (53.8%) | Backward Time: 3 ms (23.1%) | {SUMMED_NOTE}】(",
        "    (0): Linear【Forward Time: 3 ms (23.1%) | Backward Time: 2 ms (15.4%)】()",
        "    (1): Linear【Forward Time: 4 ms (30.8%) | Backward Time: 1 ms (7.7%)】()",
    ]
    assert "(heads): ModuleDict【not run】(" in text and "(x): Linear【not run】()" in text
    assert "(0): Linear【" in annotated_repr(_records(SPEC), depth=1)  # the list's items are at depth 1


def test_tree_view_sums_containers_too() -> None:
    lines = render_tree(_records(SPEC)).split("\n")
    assert lines[0] == "Net (Net) fwd 9 ms bwd 4 ms (sum)"
    assert lines[2] == "├── layers (ModuleList) fwd 7 ms bwd 3 ms (sum)"
    assert lines[5] == "└── heads (ModuleDict) fwd — bwd —"


def test_a_root_called_past_by_the_user_totals_what_ran() -> None:
    model = MLP()
    with LayerProf(model) as prof:
        model.body(torch.randn(2, 8)).sum().backward()
    lines = prof.layerwise_summary(columns=("total", "time_percent")).split("\n")
    assert "summed over the top-level modules that ran" in lines[0]
    # The body is all that ran: 100 % of the step; the head did not run.
    assert lines[2].startswith("  (body): Sequential【Total Time: ") and lines[2].endswith("| Time: 100.0%】(")
    assert "(head): Linear【not run】" in "\n".join(lines)
    # the report: the root's cell is the body's total, the body 100 % of it, and the timeline starts at row 0
    data = report_data(prof.profile.tree)
    root, body = data["nodes"][0], next(n for n in data["nodes"] if n["name"] == "body")
    assert root["summed"] and root["values"]["total_ms"] == body["values"]["total_ms"] > 0
    assert body["values"]["time_percent"] == 100.0
    assert {s["depth"] for s in data["timeline"]["slices"] if s["name"] == "body"} == {0}


def _bert() -> tuple[nn.Module, dict[str, torch.Tensor]]:
    config = transformers.BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                                     intermediate_size=32)
    return transformers.BertModel(config), {"input_ids": torch.randint(0, 50, (2, 8))}


def _gpt2() -> tuple[nn.Module, dict[str, torch.Tensor]]:
    config = transformers.GPT2Config(vocab_size=50, n_embd=16, n_layer=2, n_head=2, n_positions=16)
    return transformers.GPT2LMHeadModel(config), {"input_ids": torch.randint(0, 50, (2, 8))}


def _profiled(build) -> LayerProf:
    torch.manual_seed(0)
    model, inputs = build()
    with LayerProf(model, metrics=("params", "flops")) as prof:
        for _ in range(2):
            model(**inputs)[0].float().sum().backward()
            prof.step()
    return prof


@pytest.fixture(scope="module", params=["bert", "gpt2"])
def transformer(request: pytest.FixtureRequest) -> tuple[str, LayerProf]:
    return request.param, _profiled(_bert if request.param == "bert" else _gpt2)


LAYERS = {"bert": "encoder.layer", "gpt2": "transformer.h"}


def test_transformer_layers_are_summed_alike_in_summary_report_and_plots(transformer: tuple[str, LayerProf],
                                                                        tmp_path) -> None:
    which, prof = transformer
    tree = prof.profile.tree
    container = prof.records[LAYERS[which]]
    assert container.calls == 0 and container.forward_ms is None  # iterated, never called
    layers = container.children
    expected = sum(layer.forward_ms + layer.backward_ms for layer in layers)
    flops = sum(layer.flops_forward + layer.flops_backward for layer in layers)
    # the report
    data = report_data(tree)
    node = next(n for n in data["nodes"] if n["name"] == container.name)
    assert node["summed"] and node["values"]["total_ms"] == pytest.approx(expected)
    assert node["values"]["flops"] == flops and node["values"]["params"] == container.params  # its own: kept
    # the plots
    for metric_name, total in (("total", expected), ("flops", flops)):
        metric, fields = resolve_metric(metric_name, tree)
        segment = next(s for s in layout_tree(tree, metric, fields).segments
                       if s.kind == "module" and s.record is container)
        assert segment.extent == pytest.approx(total)
    # the summary, also from the saved file
    path = tmp_path / "profile.json"
    prof.to_json(path)
    for source in (prof.profile, load(path)):
        text = source.layerwise_summary(columns=("total_ms",))
        line = next(line for line in text.split("\n") if line.lstrip().startswith(f"({container.short_name}): "))
        assert SUMMED_NOTE in line and "Total Time: —" not in line and "not run" not in line


def test_summary_depth_reaches_transformer_layers(transformer: tuple[str, LayerProf]) -> None:
    which, prof = transformer
    first = "(0): BertLayer【" if which == "bert" else "(0): GPT2Block【"
    # BertModel > encoder > layer[0] and GPT2LMHeadModel > transformer > h[0]: the layers are at depth 2, the
    # ModuleList taking no level (it used to, and depth 2 folded the layers away as "... 2 children").
    text = prof.layerwise_summary(depth=2)
    assert first in text and f"({LAYERS[which].rsplit('.', 1)[1]}): ModuleList【" in text
    assert "... 3 children" in text if which == "bert" else "... 4 children" in text  # the layers, folded
    assert first not in prof.layerwise_summary(depth=1)
    deeper = prof.layerwise_summary(depth=3)
    inside = "(attention): BertAttention【" if which == "bert" else "(attn): GPT2Attention【"
    assert inside in deeper and inside not in text
