"""The annotated summary, the tree view, the time pool and unit formatting."""
from __future__ import annotations

import re

import pytest
import torch
from torch import nn

from layerprof import LayerProf
from layerprof.record.records import ModuleRecord
from layerprof.render.summary import annotated_repr
from layerprof.render.units import (format_bytes, format_count, format_flops, format_ms, format_percent,
                                    format_signed_field, format_signed_ms)

from .models import MLP

torchvision = pytest.importorskip("torchvision")
transformers = pytest.importorskip("transformers")

ANNOTATION = re.compile("【[^】]*】")


def _profile(model: nn.Module, *args: torch.Tensor, **kwargs: torch.Tensor) -> LayerProf:
    with LayerProf(model) as prof:
        out = model(*args, **kwargs)
        (out if isinstance(out, torch.Tensor) else out[0]).sum().backward()
    return prof


@pytest.mark.parametrize("which", ["resnet18", "bert"])
def test_summary_without_annotations_is_the_model_repr(which: str) -> None:
    if which == "resnet18":
        model = torchvision.models.resnet18(weights=None)
        prof = _profile(model, torch.randn(1, 3, 64, 64))
    else:
        config = transformers.BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                         intermediate_size=32)
        model = transformers.BertModel(config)
        prof = _profile(model, input_ids=torch.randint(0, 50, (1, 8)))
    header, body = prof.layerwise_summary().split("\n", 1)
    assert header.startswith("Step: forward ")
    assert ANNOTATION.sub("", body) == repr(model)
    # One annotation per module line, each with both times.
    annotations = ANNOTATION.findall(body)
    assert len(annotations) == len(list(model.modules()))
    assert all(a == "【not run】" or ("Forward Time: " in a and "Backward Time: " in a) for a in annotations)
    not_run = [name for name, record in prof.records.items() if not record.calls]
    # A ModuleList is iterated, never called: it shows the sum of its layers, marked, instead of 【not run】.
    summed = [a for a in annotations if a.endswith("| sum of its children: not called itself】")]
    assert annotations.count("【not run】") + len(summed) == len(not_run)
    if which == "resnet18":
        assert not not_run
    else:
        assert len(summed) == 1 and "encoder.layer" in not_run  # BERT's dropout in attention.self: not run


def test_summary_layout_matches_the_seed_tool() -> None:
    model = MLP()
    prof = _profile(model, torch.randn(2, 8))
    lines = prof.layerwise_summary().split("\n")
    assert re.fullmatch(r"MLP【Forward Time: .+ \(\d+\.\d%\) \| Backward Time: .+ \(\d+\.\d%\)】\(", lines[1])
    assert lines[2].startswith("  (body): Sequential【Forward Time: ")
    assert lines[3].startswith("    (0): Linear【") and lines[3].endswith("】(in_features=8, out_features=16, bias=True)")
    # Percentages are of the step: the root's forward and backward shares add up to 100 %.
    shares = [float(x) for x in re.findall(r"\((\d+\.\d)%\)", lines[1])]
    assert sum(shares) == pytest.approx(100.0, abs=0.11)


def test_summary_depth_and_columns() -> None:
    model = MLP()
    prof = _profile(model, torch.randn(2, 8))
    shallow = prof.layerwise_summary(depth=1)
    assert "(body): Sequential【" in shallow and "(0): Linear" not in shallow and "... 4 children" in shallow
    only_forward = prof.layerwise_summary(columns=("forward", "self_forward", "calls"))
    assert "Backward Time" not in only_forward and "Self Forward: " in only_forward and "Calls: 1" in only_forward
    with pytest.raises(ValueError, match="unknown column 'fwd'; choose from: .*forward"):
        prof.layerwise_summary(columns=("fwd",))
    with pytest.raises(ValueError, match="depth must be >= 0"):
        prof.layerwise_summary(depth=-1)


def test_summary_marks_modules_that_did_not_run() -> None:
    model = MLP()
    prof = _profile(model.body, torch.randn(2, 8))  # profile only the body; head never runs in it
    assert "【not run】" not in prof.layerwise_summary()
    with LayerProf(model) as prof:
        model.body(torch.randn(2, 8))
    text = prof.layerwise_summary()
    assert "(head): Linear【not run】(in_features=16" in text
    # The root was not called: it totals the body, the only top-level module that ran (tests/test_summed.py).
    assert text.split("\n")[1].startswith("MLP【Forward Time: ") and "not called itself】(" in text.split("\n")[1]


def test_summary_from_records_alone() -> None:
    root = ModuleRecord("", "Net", "")
    child = ModuleRecord("fc", "Linear", "in_features=2, out_features=2, bias=True", parent=root)
    root.calls = child.calls = 1
    root.forward_ms, root.backward_ms = 3.0, 1.0
    child.forward_ms, child.backward_ms = 1.5, 0.5
    assert annotated_repr(root) == (
        "Step: forward 3 ms, backward 1 ms, total 4 ms; percentages are of the total (forward + backward of the model).\n"
        "Net【Forward Time: 3 ms (75.0%) | Backward Time: 1 ms (25.0%)】(\n"
        "  (fc): Linear【Forward Time: 1.5 ms (37.5%) | Backward Time: 500 µs (12.5%)】"
        "(in_features=2, out_features=2, bias=True)\n"
        ")"
    )


def test_timepool_and_render_tree() -> None:
    model = MLP()
    prof = _profile(model, torch.randn(2, 8))
    pool = prof.layerwise_timepool()
    assert list(pool) == ["MLP"]
    root = pool["MLP"]
    assert root["depth"] == 0 and list(root["children"]) == ["body", "head"]
    assert list(root["children"]["body"]["children"]) == ["0", "1", "2", "3"]
    assert root["forward_ms"] == prof.tree.forward_ms and root["backward_ms"] == prof.tree.backward_ms
    assert root["children"]["body"]["children"]["2"]["depth"] == 2
    lines = prof.render_tree().split("\n")
    assert len(lines) == len(prof.records)
    assert lines[0].startswith("MLP (MLP) fwd ") and lines[1].startswith("├── body (Sequential) fwd ")
    assert len(prof.render_tree(maxdepth=1).split("\n")) == 3


def test_units_are_formatted_in_one_place() -> None:
    assert format_ms(0.0123) == "12.3 µs"
    assert format_ms(1.234) == "1.23 ms"
    assert format_ms(123.4) == "123 ms"
    assert format_ms(1234.0) == "1.23 s"
    assert format_ms(None) == "—"
    # A time difference keeps its sign once: the CLI's verified line printed "+-229 ms" for a negative one.
    assert format_signed_ms(2.5) == "+2.5 ms" and format_signed_ms(-229.0) == "-229 ms"
    assert format_signed_ms(-0.4) == "-400 µs" and format_signed_ms(0.0) == "+0 ms"
    assert format_signed_field("total_ms", 0.376) == "+376 µs" and format_signed_field("flops", -2e9) == "-2 GFLOPs"
    assert format_count(11_689_512) == "11.7M"
    assert format_count(999) == "999"
    assert format_flops(3.6e9) == "3.6 GFLOPs"
    assert format_bytes(46_827_520) == "44.7 MiB"
    assert format_bytes(512) == "512 B"
    assert format_percent(1, 4) == "25.0%"
    assert format_percent(1, 0) == "—"


def test_values_that_round_up_take_the_next_unit_and_never_an_exponent() -> None:
    from layerprof.render.units import format_ratio

    # 999.6 µs printed as "1e+03 µs" in a BERT embedding's forward; 1,010 KiB as "1.01e+03 KiB".
    assert format_ms(0.9996) == "1 ms" and format_ms(-0.9996) == "-1 ms" and format_ms(0.9994) == "999 µs"
    assert format_ms(99.97) == "100 ms" and format_ms(999.7) == "1 s" and format_ms(1_234_567) == "1235 s"
    assert format_bytes(1010 * 1024) == "1010 KiB"  # below 1024 KiB: still KiB, written out
    assert format_bytes(1023.9 * 1024) == "1 MiB" and format_bytes(1023.9 * 2**20) == "1 GiB"
    assert format_flops(999.7e6) == "1 GFLOPs" and format_count(999_700) == "1M" and format_count(999.7) == "1000"
    assert format_ratio(1234.5) == "1234x" and format_ratio(0.5) == "0.5x"
    # A rate below 1 KiB (a checkpoint plan's bytes freed per ms) printed "50.5844 B"; counts keep every digit.
    assert format_bytes(96 / 1.8978) == "50.6 B" and format_bytes(1000) == "1000 B" and format_flops(999) == "999 FLOPs"
    texts = [f(v) for v in (0.9996, 999.6, 1023.9 * 1024, 1e15) for f in (format_ms, format_bytes, format_flops)]
    assert not any("e+" in text for text in texts), texts


def test_counts_are_singular_for_one() -> None:
    from layerprof.render.units import format_counted

    assert [format_counted(n, "child", "children") for n in (0, 1, 2)] == ["0 children", "1 child", "2 children"]
    assert format_counted(1, "call", shown="1") == "1 call" and format_counted(1500, "call", shown="1.5k") == "1.5k calls"
    # One child under a cut-off container, one module in the model, one row, one step, one rank: said in the singular.
    model = nn.Sequential(nn.Sequential(nn.Linear(4, 4)), nn.Sequential(nn.Linear(4, 4), nn.ReLU()))
    prof = _profile(model, torch.randn(2, 4))
    shallow = prof.layerwise_summary(depth=1)
    assert shallow.count("... 1 child\n") == 1 and shallow.count("... 2 children\n") == 1
    assert "1 children" not in shallow
    single = _profile(nn.Linear(4, 4), torch.randn(2, 4)).profile
    assert repr(single).startswith("<Profile Linear: 1 module, ")
    assert repr(single.rows()).startswith("<Table: 1 row; ")
    assert "<caption>Linear: 1 module</caption>" in single._repr_html_()
    from layerprof.render.report import report_data

    assert report_data(single.tree, single.meta)["subtitle"] == "1 module, 1 profiled step"
    from layerprof.distributed.table import rank_table

    assert rank_table(prof.gather()).startswith("Across 1 rank, per step")  # one process: a one-rank view


# -- Markdown cells ----------------------------------------------------------------------------------------------
class _Keyed(nn.Module):
    """Modules under keys a Markdown renderer would read as HTML, emphasis, code, links or table syntax."""

    KEYS = ["<b>", "*x*", "_y_", "a_b", "`c`", "[l](u)", "p|q", "~~s~~", "a&amp;", "back\\slash"]

    def __init__(self) -> None:
        super().__init__()
        self.d = nn.ModuleDict({key: nn.Identity() for key in self.KEYS})

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for module in self.d.values():
            x = module(x)
        return x


def test_markdown_cells_show_module_names_as_written() -> None:
    prof = _profile(_Keyed(), torch.randn(2, 4, requires_grad=True))
    lines = prof.to_markdown(columns=("name", "type")).splitlines()
    # HTML as entities, Markdown punctuation backslash-escaped; an ``_`` inside a word (a_b) is inert and kept.
    assert lines[4:] == [
        "| d.&lt;b&gt; | Identity |", "| d.\\*x\\* | Identity |", "| d.\\_y\\_ | Identity |",
        "| d.a_b | Identity |", "| d.\\`c\\` | Identity |", "| d.\\[l\\](u) | Identity |",
        "| d.p\\|q | Identity |", "| d.\\~\\~s\\~\\~ | Identity |", "| d.a&amp;amp; | Identity |",
        "| d.back\\\\slash | Identity |"]
    assert prof.to_markdown(columns=("name", "forward_ms"), raw=True).splitlines()[0] == "| name | forward_ms |"
    markdown_it = pytest.importorskip("markdown_it")
    import html

    rendered = markdown_it.MarkdownIt("commonmark").enable(["table", "strikethrough"]).render("\n".join(lines))
    cells = re.findall(r"<td[^>]*>(.*?)</td>", rendered)[0::2]  # the name column
    assert [html.unescape(cell) for cell in cells] == ["(root)", "d", *(f"d.{key}" for key in _Keyed.KEYS)]


def test_a_table_of_rows_taken_back_from_a_dataframe_prints_their_missing_values() -> None:
    # pandas puts NaN where a profile has None (a module that never ran): every readable form of a Table of those
    # rows raised "cannot convert float NaN to integer"; they print as missing, as None does.
    pytest.importorskip("pandas")
    import layerprof

    model = nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 1))
    with LayerProf(model) as prof:
        model[0](torch.randn(4, 8)).sum().backward()  # model[1] never runs
    frame = prof.to_dataframe(columns=("name", "forward_ms", "backward_ms"))
    table = layerprof.Table(frame.to_dict("records"))
    last = [line for line in str(table).splitlines() if line.startswith("1 ")]
    assert last and last[0].split()[1:] == ["—", "—"]
    for text in (table.to_markdown(), table.to_latex(), table.to_html()):
        assert "nan" not in text.lower().replace("name", "")
