"""Reports: exports equal the records, JSON round-trips, queries, trace nesting, compare ratios, notebook view."""
from __future__ import annotations

import csv
import io
import json
import math
import re
from html.parser import HTMLParser
from typing import Any

import pytest
import torch
from torch import nn

import layerprof
from layerprof import CallTiming, LayerProf, ModuleRecord, Profile
from layerprof.render import units
from layerprof.render.export import latex_escape

from .models import CheckpointedBody

torch.set_num_threads(1)


# -- models and profiles ----------------------------------------------------------------------------------------
class SharedNet(nn.Module):
    """``block`` is called 3 times per forward and is also reachable as ``alias``."""

    def __init__(self) -> None:
        super().__init__()
        self.block = nn.Linear(8, 8)
        self.alias = self.block
        self.head = nn.Linear(8, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for _ in range(3):
            x = torch.relu(self.block(x))
        return self.head(x)


@pytest.fixture(scope="module")
def resnet() -> LayerProf:
    torchvision = pytest.importorskip("torchvision")  # the tests on this profile only: the others run without it
    torch.manual_seed(0)
    model = torchvision.models.resnet18(weights=None)
    with LayerProf(model) as prof:
        model(torch.randn(1, 3, 64, 64)).sum().backward()
    return prof


@pytest.fixture(scope="module")
def shared() -> LayerProf:
    torch.manual_seed(0)
    model = SharedNet()
    with LayerProf(model) as prof:
        model(torch.randn(4, 8)).sum().backward()
    return prof


def hand_built(spec: list[tuple[str, str, dict[str, Any]]], meta: dict[str, Any] | None = None) -> Profile:
    """A Profile from ``(qualified name, type, fields)`` in pre-order; fields are set on the records by hand."""
    records: dict[str, ModuleRecord] = {}
    for name, type_name, values in spec:
        parent = None if name == "" else records[name.rsplit(".", 1)[0] if "." in name else ""]
        record = ModuleRecord(name, type_name, "", parent)
        record.calls = 1
        for key, value in values.items():
            setattr(record, key, value)
        records[name] = record
    return Profile(records[""], meta=meta)


TEACHER = [
    ("", "Net", dict(params=1000, param_bytes=4000, flops_forward=2_000_000, forward_ms=10.0, backward_ms=20.0,
                     cuda_forward_peak_bytes=1 << 20)),
    ("fc", "Linear", dict(params=600, forward_ms=4.0, backward_ms=8.0, cuda_forward_peak_bytes=1 << 19)),
    ("extra", "Linear", dict(params=400, forward_ms=5.0, backward_ms=10.0, cuda_forward_peak_bytes=1 << 18)),
]
STUDENT = [
    ("", "Net", dict(params=250, param_bytes=1000, flops_forward=1_000_000, forward_ms=4.0, backward_ms=6.0,
                     cuda_forward_peak_bytes=1 << 20)),
    ("fc", "Linear", dict(params=250, forward_ms=1.0, backward_ms=4.0)),
]


# -- canonical rows and machine-readable exports -----------------------------------------------------------------
def test_resnet18_has_one_row_per_module(resnet: LayerProf) -> None:
    # resnet18: root + conv1, bn1, relu, maxpool, 4 layers, avgpool, fc (10) + 8 BasicBlocks x (5 + 1 self)
    # + 3 downsample Sequentials x 3 (seq, conv, bn) = 1 + 10 + 48 + 9 = 68
    assert len(resnet.to_dict()) == 68


def _csv_value(cell: str, expected: Any) -> Any:
    if expected is None:
        return None if cell == "" else cell
    if isinstance(expected, (list, tuple, dict)):
        return json.loads(cell)
    if isinstance(expected, bool):
        return cell == "True"
    if isinstance(expected, int):
        return int(cell)
    if isinstance(expected, float):
        return float(cell)
    return cell


def test_csv_rows_equal_the_records(resnet: LayerProf, shared: LayerProf) -> None:
    for prof in (resnet, shared):
        rows = list(csv.DictReader(io.StringIO(prof.to_csv())))
        records = list(prof.to_dict().values())
        assert len(rows) == len(records)
        for row, record in zip(rows, records):
            assert set(row) == set(record) - {"call_times"}
            for key, cell in row.items():
                assert _csv_value(cell, record[key]) == record[key], (record["name"], key)
    block = next(r for r in csv.DictReader(io.StringIO(shared.to_csv())) if r["name"] == "block")
    assert json.loads(block["aliases"]) == ["alias"]


def test_csv_filters_and_writes_what_it_returns(resnet: LayerProf, tmp_path: Any) -> None:
    path = tmp_path / "convs.csv"
    text = resnet.to_csv(path, columns=["name", "forward_ms"], type="Conv2d")
    assert path.read_text() == text
    rows = list(csv.reader(io.StringIO(text)))
    assert rows[0] == ["name", "forward_ms"]
    assert len(rows) == 1 + 20  # resnet18 has 20 Conv2d (1 stem + 16 in blocks + 3 downsample)
    assert [float(r[1]) for r in rows[1:]] == [resnet.records[r[0]].forward_ms for r in rows[1:]]


def test_dataframe_rows_equal_the_records_and_columns_are_typed(resnet: LayerProf) -> None:
    pytest.importorskip("pandas")
    frame = resnet.to_dataframe()
    records = list(resnet.records.values())
    assert len(frame) == 68
    assert str(frame["calls"].dtype) == "Int64"
    assert str(frame["forward_ms"].dtype) == "float64"
    assert str(frame["recompute_ms"].dtype) == "float64"  # never measured: all NaN, still numeric
    assert str(frame["name"].dtype) == "string"
    assert "call_times" not in frame.columns
    for i, record in enumerate(records):
        assert frame["name"][i] == record.name
        assert frame["calls"][i] == record.calls
        assert frame["forward_ms"][i] == record.forward_ms
        assert frame["backward_ms"][i] == record.backward_ms
        assert math.isnan(frame["recompute_ms"][i])


def test_dataframe_keeps_meter_fields_with_nullable_ints() -> None:
    pytest.importorskip("pandas")
    frame = hand_built(TEACHER + [("extra.inner", "ReLU", {})]).to_dataframe()
    assert str(frame["params"].dtype) == "Int64"
    assert list(frame["params"][:3]) == [1000, 600, 400]
    assert frame["params"].isna().tolist() == [False, False, False, True]
    assert str(frame["cuda_forward_peak_bytes"].dtype) == "Int64"


# -- JSON round-trip ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("which", ["resnet", "shared"])
def test_json_round_trip_gives_the_same_tree_records_and_summary(which: str, request: Any, tmp_path: Any) -> None:
    prof = request.getfixturevalue(which)
    path = tmp_path / "profile.json"
    text = prof.to_json(path)
    assert path.read_text() == text
    document = json.loads(text)
    assert document["format"] == "layerprof.profile" and document["version"] == 1
    loaded = layerprof.load(path)
    assert loaded.to_dict() == prof.to_dict()  # every field of every row, call_times included
    assert [r.name for r in loaded.tree.descendants] == [r.name for r in prof.tree.descendants]
    assert all(isinstance(t, CallTiming) for r in loaded.records.values() for t in r.call_times)
    assert loaded.layerwise_summary() == prof.layerwise_summary()
    columns = ("forward", "backward", "time_percent", "self_total", "calls")
    assert loaded.layerwise_summary(columns=columns, depth=2) == prof.layerwise_summary(columns=columns, depth=2)
    assert loaded.render_tree() == prof.render_tree()


def test_json_round_trip_keeps_meter_fields_and_meta() -> None:
    spec = TEACHER + [("fc.act", "ReLU", dict(input_shapes=[[4, 8]], output_shapes=[[4, 8]], activation_bytes=128))]
    original = hand_built(spec, meta={"device": "cpu", "batch": 4})
    loaded = layerprof.loads(original.to_json())
    assert loaded.meta == {"device": "cpu", "batch": 4}
    assert loaded.to_dict() == original.to_dict()
    assert loaded.records["fc.act"].input_shapes == [[4, 8]]
    columns = ("params", "forward", "activation_bytes")
    assert loaded.layerwise_summary(columns=columns) == original.layerwise_summary(columns=columns)


def test_load_refuses_newer_versions_and_other_files() -> None:
    document = json.loads(hand_built(STUDENT).to_json())
    document["version"] = 99
    with pytest.raises(ValueError, match="upgrade layerprof"):
        layerprof.loads(json.dumps(document))
    with pytest.raises(ValueError, match="not a layerprof profile"):
        layerprof.loads('{"traceEvents": []}')


# -- human-readable tables ---------------------------------------------------------------------------------------
class _TableParser(HTMLParser):
    """Collects cells by row and checks that every non-void tag is closed in order."""

    VOID = {"meta", "br", "hr", "img", "link", "input"}

    def __init__(self) -> None:
        super().__init__()
        self.stack: list[str] = []
        self.rows: list[list[str]] = []
        self.cell: list[str] | None = None
        self.errors: list[str] = []

    def handle_starttag(self, tag: str, attrs: Any) -> None:
        if tag not in self.VOID:
            self.stack.append(tag)
        if tag == "tr":
            self.rows.append([])
        if tag in ("td", "th"):
            self.cell = []

    def handle_endtag(self, tag: str) -> None:
        if not self.stack or self.stack[-1] != tag:
            self.errors.append(f"</{tag}> closes {self.stack[-1:]}")
        else:
            self.stack.pop()
        if tag in ("td", "th") and self.cell is not None:
            self.rows[-1].append("".join(self.cell))
            self.cell = None

    def handle_data(self, data: str) -> None:
        if self.cell is not None:
            self.cell.append(data)


def _parse_html(text: str) -> _TableParser:
    parser = _TableParser()
    parser.feed(text)
    parser.close()
    assert parser.errors == [] and parser.stack == []
    return parser


def test_html_is_a_complete_page_whose_cells_are_the_records(resnet: LayerProf) -> None:
    text = resnet.to_html(max_depth=1)
    assert text.startswith("<!DOCTYPE html>") and "<script" not in text and "http" not in text
    parser = _parse_html(text)
    header, body = parser.rows[0], parser.rows[1:]
    assert header[:5] == ["Name", "Type", "Calls", "Forward", "Backward"]
    expected = [r for r in resnet.records.values() if r.depth <= 1]
    assert len(body) == len(expected) == 11  # root + 10 children
    assert body[0][0] == "(root)"
    for cells, record in zip(body[1:], expected[1:]):
        assert cells[0] == record.name and cells[1] == record.type
        assert cells[3] == units.format_ms(record.forward_ms)
        assert cells[4] == units.format_ms(record.backward_ms)
    time_percent = header.index("Time %")
    # layer4's share of the step: (forward + backward) / root total
    layer4 = resnet.records["layer4"]
    share = 100 * layer4.total_ms / resnet.tree.total_ms
    assert body[[c[0] for c in body].index("layer4")][time_percent] == f"{share:.1f}%"


def test_html_escapes_names() -> None:
    prof = hand_built([("", "Net<T>", dict(forward_ms=1.0)), ("a&b", "Linear", dict(forward_ms=0.5))])
    parser = _parse_html(prof.to_html())
    assert [row[:2] for row in parser.rows[1:]] == [["(root)", "Net<T>"], ["a&b", "Linear"]]


def _latex_rows(text: str) -> list[list[str]]:
    lines = text.strip().split("\n")
    begin, end = lines.index(next(l for l in lines if l.startswith("\\begin{tabular}"))), lines.index("\\end{tabular}")
    body = lines[begin + 1 : end]
    assert body[0] == "\\toprule" and body[2] == "\\midrule" and body[-1] == "\\bottomrule"
    rows = [body[1], *body[3:-1]]
    assert all(row.endswith(r" \\") for row in rows)
    return [re.split(r"(?<!\\)&", row[: -len(r" \\")]) for row in rows]


def test_latex_is_balanced_booktabs_with_escaped_cells() -> None:
    prof = hand_built([
        ("", "Net", dict(forward_ms=10.0, backward_ms=20.0, params=1000)),
        ("attn_proj", "Linear", dict(forward_ms=0.0125, backward_ms=2.0, params=600)),
    ])
    text = prof.to_latex(caption="Costs & shares", label="tab:costs")
    assert text.count("\\begin{table}") == text.count("\\end{table}") == 1
    assert text.count("\\begin{tabular}") == text.count("\\end{tabular}") == 1
    assert "\\caption{Costs \\& shares}" in text and "\\label{tab:costs}" in text
    unescaped = re.sub(r"\\[{}]", "", text)
    assert unescaped.count("{") == unescaped.count("}")
    rows = _latex_rows(text)
    header = [c.strip() for c in rows[0]]
    assert header == ["Name", "Type", "Forward", "Backward", "Time \\%", "Params"]  # a page's columns
    spec = re.search(r"\\begin\{tabular\}\{(\w+)\}", text).group(1)
    assert spec == "llrrrr" and all(len(row) == len(spec) for row in rows)
    child = [c.strip() for c in rows[2]]
    # 12.5 µs forward; total 2.0125 ms of a 30 ms step = 6.7%
    assert child == ["attn\\_proj", "Linear", "12.5 $\\mu$s", "2 ms", "6.7\\%", "600"]
    escaped = "a\\_b\\%c\\$d\\#e\\{f\\}\\textasciitilde{}\\textasciicircum{}\\textbackslash{}"
    assert latex_escape("a_b%c$d#e{f}~^\\") == escaped


def test_page_tables_default_to_a_few_columns_and_take_any() -> None:
    prof = hand_built([
        ("", "Net", dict(forward_ms=10.0, backward_ms=20.0, self_forward_ms=1.0, params=1000, trainable_params=1000,
                         flops_forward=3e6, flops_backward=6e6, activation_bytes=2048, saved_bytes=4096)),
        ("fc", "Linear", dict(forward_ms=9.0, backward_ms=18.0, self_forward_ms=9.0, params=1000,
                              trainable_params=1000, flops_forward=3e6, flops_backward=6e6, activation_bytes=2048,
                              saved_bytes=4096)),
    ])
    page = ["| Name | Type | Forward | Backward | Time % | Params | FLOPs | Saved bytes |",
            "|:---|:---|---:|---:|---:|---:|---:|---:|",
            "| (root) | Net | 10 ms | 20 ms | 100.0% | 1k | 9 MFLOPs | 4 KiB |",  # FLOPs: 3M forward + 6M backward
            "| fc | Linear | 9 ms | 18 ms | 90.0% | 1k | 9 MFLOPs | 4 KiB |"]  # 27 ms of a 30 ms step
    assert prof.to_markdown().splitlines() == page
    assert "\\begin{tabular}{llrrrrrr}" in prof.to_latex()  # the same 8 columns
    # columns= picks any field, the summed FLOPs too; text and HTML keep every field (the 8 and 5 more).
    assert prof.to_markdown(columns=["name", "calls", "self_forward", "flops"]).splitlines()[2] == (
        "| (root) | 1 | 1 ms | 9 MFLOPs |")
    assert len(str(prof.rows()).splitlines()[0].split("  ")) > 8
    assert "<th>Self forward</th>" in prof.to_html()
    assert prof.rows()[1:].to_markdown().splitlines()[2] == page[3]  # a slice is still a page table
    # A ranking leads with what it ranks by, then the page's columns.
    assert prof.top(1, by="self_forward").to_markdown().splitlines()[0] == (
        "| Name | Type | Self forward | Forward | Backward | Time % | Params | FLOPs | Saved bytes |")


def test_markdown_table_has_one_line_per_row_and_raw_numbers_on_request(resnet: LayerProf) -> None:
    text = resnet.to_markdown(depth=2, raw=True, columns=["name", "type", "forward_ms"])
    lines = text.strip().split("\n")
    depth2 = [r for r in resnet.records.values() if r.depth == 2]
    assert len(depth2) == 4 * 2  # 4 layers x 2 BasicBlocks (downsample Sequentials are at depth 3)
    assert len(lines) == 2 + len(depth2)
    assert lines[0] == "| name | type | forward_ms |" and lines[1] == "|:---|:---|---:|"
    for line, record in zip(lines[2:], depth2):
        assert line == f"| {record.name} | {record.type} | {record.forward_ms!r} |"


# -- queries -----------------------------------------------------------------------------------------------------
def test_select_by_depth_type_and_name(resnet: LayerProf) -> None:
    assert [r["name"] for r in resnet.rows(depth=1)] == [
        "conv1", "bn1", "relu", "maxpool", "layer1", "layer2", "layer3", "layer4", "avgpool", "fc"]
    assert len(resnet.rows(type="Conv2d")) == 20
    assert len(resnet.rows(type=("Conv2d", "BatchNorm2d"))) == 40
    # layer1: 2 BasicBlocks x (block + conv1, bn1, relu, conv2, bn2) = 12
    assert len(resnet.rows(name="layer1.*")) == 12
    assert [r["name"] for r in resnet.rows(name="layer*.0.downsample", max_depth=3)] == [
        "layer2.0.downsample", "layer3.0.downsample", "layer4.0.downsample"]


def test_aggregate_by_type_sums_the_records(resnet: LayerProf) -> None:
    table = {row["type"]: row for row in resnet.aggregate()}
    convs = [r for r in resnet.records.values() if r.type == "Conv2d"]
    assert table["Conv2d"]["modules"] == 20 and table["Conv2d"]["calls"] == 20
    assert table["Conv2d"]["forward_ms"] == pytest.approx(sum(r.forward_ms for r in convs), rel=1e-12)
    assert table["Conv2d"]["total_ms"] == pytest.approx(sum(r.total_ms for r in convs), rel=1e-12)
    # ReLU: one module in the stem + one per BasicBlock (8), called once in the stem and twice per block
    assert table["ReLU"]["modules"] == 9 and table["ReLU"]["calls"] == 1 + 8 * 2
    leaves = resnet.aggregate(leaves=True)
    leaf_types = {"Conv2d", "BatchNorm2d", "ReLU", "MaxPool2d", "AdaptiveAvgPool2d", "Linear"}
    assert {row["type"] for row in leaves} == leaf_types


def test_aggregate_takes_the_max_of_peaks() -> None:
    rows = {row["type"]: row for row in hand_built(TEACHER).aggregate()}
    assert rows["Linear"]["params"] == 600 + 400
    assert rows["Linear"]["cuda_forward_peak_bytes"] == 1 << 19  # max(2^19, 2^18), not their sum
    assert rows["Linear"]["total_ms"] == 12.0 + 15.0


def test_top_ranks_any_numeric_field(resnet: LayerProf) -> None:
    top = resnet.top(3, by="forward_ms", depth=2)
    expected = sorted((r for r in resnet.records.values() if r.depth == 2), key=lambda r: -r.forward_ms)[:3]
    assert [row["name"] for row in top] == [r.name for r in expected]
    assert top.columns[:4] == ["name", "type", "calls", "forward_ms"]
    by_total = resnet.top(2, by="total_ms", type="Conv2d")
    assert [row["total_ms"] for row in by_total] == sorted((r.total_ms for r in resnet.records.values()
                                                           if r.type == "Conv2d"), reverse=True)[:2]
    params = hand_built(TEACHER).top(2, by="params")
    assert [(row["name"], row["params"]) for row in params] == [("fc", 600), ("extra", 400)]  # not the root
    assert [row["name"] for row in hand_built(TEACHER).top(1, by="params", depth=0)] == [""]
    with pytest.raises(ValueError, match="cannot rank by 'flops'"):
        resnet.top(3, by="flops")
    lines = str(top).split("\n")
    assert lines[0].split()[:4] == ["Name", "Type", "Calls", "Forward"] and len(lines) == 2 + 3
    first_forward = units.format_ms(expected[0].forward_ms).split()[0]
    assert lines[2].split()[:4] == [expected[0].name, "BasicBlock", "1", first_forward]


# -- summary columns ---------------------------------------------------------------------------------------------
def test_summary_columns_time_share_self_time_and_meter_fields() -> None:
    prof = hand_built(TEACHER)
    prof.records["fc"].self_forward_ms, prof.records["fc"].self_backward_ms = 3.0, 6.0
    text = prof.layerwise_summary(columns=("time_percent", "self_total", "params", "param_bytes"))
    fc_line = next(line for line in text.split("\n") if line.strip().startswith("(fc)"))
    # fc: (4 + 8) / (10 + 20) = 40%; self 3 + 6 = 9 ms = 30%; 600 params; no param_bytes on fc
    assert "Time: 40.0%" in fc_line and "Self Time: 9 ms (30.0%)" in fc_line
    assert "Params: 600" in fc_line and "Param Size: —" in fc_line
    assert "Param Size: 3.91 KiB" in text.split("\n")[1]  # root: 4000 B
    with pytest.raises(ValueError, match="unknown column 'nonsense'"):
        prof.layerwise_summary(columns=("nonsense",))


def test_units_format_fields_by_their_names() -> None:
    assert units.format_field("forward_ms", 0.0123) == "12.3 µs"
    assert units.format_field("activation_bytes", 46_827_520) == "44.7 MiB"
    assert units.format_field("flops_forward", 3.6e9) == "3.6 GFLOPs"
    assert units.format_field("params", 11_689_512) == "11.7M"
    assert units.format_field("input_shapes", [[1, 3]]) == "[1, 3]"  # shapes print as the summary shows them
    assert units.field_label("cuda_forward_peak_bytes") == "CUDA forward peak bytes"
    # a statistic of a time names the statistic, its unit in the values: not "Forward ms p95"
    assert units.field_label("forward_ms_p95") == "Forward p95" and units.field_label("backward_ms_std") == "Backward std"
    # A model's whole run can pass the peta and tebi steps: exa and zetta FLOPs, pebi and exbi bytes
    assert units.format_flops(3e18) == "3 EFLOPs" and units.format_flops(1.5e21) == "1.5 ZFLOPs"
    assert units.format_bytes(3 * 2**50) == "3 PiB" and units.format_bytes(2**61) == "2 EiB"
    assert units.format_count(5e18) == "5E"


# -- trace -------------------------------------------------------------------------------------------------------
def _validate_trace(document: dict[str, Any]) -> dict[int, list[dict[str, Any]]]:
    """Check the trace-event format; return the X events by track with each event's enclosing event."""
    assert set(document) >= {"traceEvents", "displayTimeUnit"}
    events = document["traceEvents"]
    slices = [e for e in events if e["ph"] == "X"]
    assert {e["ph"] for e in events} == {"M", "X"}
    for event in events:
        assert {"name", "ph", "pid", "tid"} <= set(event)
    for event in slices:
        assert {"ts", "dur", "cat", "args"} <= set(event)
        assert event["cat"] in ("forward", "backward", "recompute") and event["dur"] >= 0
    stamps = [e["ts"] for e in slices]
    assert stamps == sorted(stamps)
    by_track: dict[int, list[dict[str, Any]]] = {}
    stacks: dict[int, list[dict[str, Any]]] = {}
    for event in slices:
        start, end = round(event["ts"] * 1000), round((event["ts"] + event["dur"]) * 1000)  # integer ns
        event["_span"] = (start, end)
        stack = stacks.setdefault(event["tid"], [])
        while stack and stack[-1]["_span"][1] <= start:
            stack.pop()
        if stack:
            assert end <= stack[-1]["_span"][1], f"{event['name']} overlaps {stack[-1]['name']}"
        event["_parent"] = stack[-1] if stack else None
        stack.append(event)
        by_track.setdefault(event["tid"], []).append(event)
    return by_track


def _track_names(document: dict[str, Any]) -> dict[int, str]:
    return {e["tid"]: e["args"]["name"] for e in document["traceEvents"] if e["name"] == "thread_name"}


def test_trace_of_resnet18_nests_every_call_like_the_module_tree(resnet: LayerProf, tmp_path: Any) -> None:
    path = tmp_path / "trace.json"
    document = json.loads(resnet.to_trace(path))
    assert json.loads(path.read_text()) == document
    by_track = _validate_trace(document)
    names = _track_names(document)
    assert sorted(names.values()) == ["backward", "forward"]
    forward = by_track[next(t for t, n in names.items() if n == "forward")]
    backward = by_track[next(t for t, n in names.items() if n == "backward")]
    calls = sum(len(r.call_times) for r in resnet.records.values())
    assert calls == 68 - 9 + 17  # ReLU modules: 9 modules, 17 calls
    assert len(forward) == calls and len(backward) == calls  # every call of resnet18 runs a backward
    records = resnet.records
    for event in forward:
        record = records[event["args"]["module"]]
        parent = event["_parent"]
        # in the forward, the enclosing slice is the parent module's call
        assert (parent["args"]["module"] if parent else None) == (record.parent.name if record.parent else None)
        # within 2 ns: times round to whole ns, then to 2**-10 µs at each end (test below)
        assert event["dur"] == pytest.approx(record.call_times[event["args"]["call"]].forward_ms * 1000, abs=2e-3)
    for event in backward:
        record = records[event["args"]["module"]]
        if event["_parent"] is not None:
            # in the backward, the enclosing slice is an ancestor module's backward
            assert records[event["_parent"]["args"]["module"]] in record.ancestors
        else:
            assert record is resnet.tree


def test_trace_of_a_module_called_three_times(shared: LayerProf) -> None:
    document = json.loads(shared.to_trace())
    by_track = _validate_trace(document)
    names = _track_names(document)
    forward = by_track[next(t for t, n in names.items() if n == "forward")]
    backward = by_track[next(t for t, n in names.items() if n == "backward")]
    block_forward = [e for e in forward if e["args"]["module"] == "block"]
    block_backward = [e for e in backward if e["args"]["module"] == "block"]
    assert [e["args"]["call"] for e in block_forward] == [0, 1, 2]
    assert [e["args"]["call"] for e in block_backward] == [2, 1, 0]  # the last call's gradient comes first
    assert all(e["_parent"]["args"]["module"] == "" for e in block_forward + block_backward)
    # the three calls are disjoint siblings
    for first, second in zip(block_forward, block_forward[1:]):
        assert first["_span"][1] <= second["_span"][0]
    assert len(forward) == len(backward) == 1 + 3 + 1  # root, block x3, head


def test_trace_puts_recomputed_forward_on_its_own_track() -> None:
    model = CheckpointedBody()
    with LayerProf(model) as prof:
        model(torch.randn(4, 8, requires_grad=True)).sum().backward()
    recomputed = sum(t.recompute for r in prof.records.values() for t in r.call_times)
    document = json.loads(prof.to_trace())
    by_track = _validate_trace(document)
    names = _track_names(document)
    assert recomputed > 0 and "recompute" in names.values()
    track = next(t for t, n in names.items() if n == "recompute")
    assert len(by_track[track]) == recomputed


def test_trace_moves_overlapping_slices_to_an_extra_track() -> None:
    # Two siblings whose intervals overlap without nesting (as clocks of two devices could produce).
    prof = hand_built([("", "Net", dict(forward_ms=10.0)), ("a", "Linear", {}), ("b", "Linear", {})])
    prof.tree.call_times = [CallTiming(0.0, 10.0)]
    prof.records["a"].call_times = [CallTiming(1.0, 4.0)]
    prof.records["b"].call_times = [CallTiming(3.0, 4.0)]
    document = json.loads(prof.to_trace())
    by_track = _validate_trace(document)
    assert sorted(_track_names(document).values()) == ["forward", "forward (2)"]
    assert [[e["name"] for e in events] for events in by_track.values()] == [["Net", "a"], ["b"]]


# -- compare -----------------------------------------------------------------------------------------------------
def test_compare_model_level_ratios_on_known_profiles() -> None:
    result = layerprof.compare(hand_built(TEACHER), hand_built(STUDENT), names=("teacher", "student"))
    rows = {row["metric"]: row for row in result.model}
    assert list(rows) == ["modules", "params", "param_bytes", "flops_forward", "forward_ms", "backward_ms",
                          "total_ms", "cuda_forward_peak_bytes"]
    assert (rows["modules"]["a"], rows["modules"]["b"], rows["modules"]["diff"]) == (3, 2, -1)
    assert rows["params"]["ratio"] == 0.25 and rows["params"]["rel_diff"] == -0.75  # 250 / 1000
    assert rows["param_bytes"]["diff"] == -3000
    assert rows["flops_forward"]["ratio"] == 0.5  # 1e6 / 2e6
    assert rows["forward_ms"]["ratio"] == pytest.approx(0.4)  # 4 / 10
    assert rows["backward_ms"]["ratio"] == pytest.approx(0.3)  # 6 / 20
    assert rows["total_ms"]["ratio"] == pytest.approx(1 / 3)  # 10 / 30
    assert rows["params"]["better"] == "student"
    assert rows["cuda_forward_peak_bytes"]["better"] == "same" and rows["cuda_forward_peak_bytes"]["ratio"] == 1.0
    pytest.importorskip("pandas")
    frame = result.to_dataframe()
    assert list(frame.columns) == ["metric", "teacher", "student", "diff", "rel_diff", "ratio", "better"]
    assert frame.set_index("metric").loc["params", "ratio"] == 0.25


def test_compare_per_module_diff_and_text() -> None:
    result = layerprof.compare(hand_built(TEACHER), hand_built(STUDENT), names=("teacher", "student"))
    assert result.matched == ["", "fc"] and result.only_a == ["extra"] and result.only_b == []
    fc = next(row for row in result.modules if row["name"] == "fc")
    assert fc["forward_ms_ratio"] == 0.25  # 1 / 4
    assert fc["total_ms_a"] == 12.0 and fc["total_ms_b"] == 5.0 and fc["total_ms_diff"] == -7.0
    assert fc["params_ratio"] == pytest.approx(250 / 600)
    text = str(result)
    params_line = next(line for line in text.split("\n") if line.startswith("params"))
    assert params_line.split() == ["params", "1k", "250", "-75.0%", "0.25x", "student"]
    assert text.split("\n")[3].split() == ["modules", "3", "2", "-33.3%", "0.667x", "student"]
    assert "Only in teacher: 1 module;" in text
    pytest.importorskip("pandas")
    modules = result.to_dataframe("modules")
    assert list(modules["name"]) == ["", "fc"] and modules["total_ms_ratio"][1] == pytest.approx(5 / 12)


def test_compare_module_differences_carry_their_sign_both_ways() -> None:
    # Before: a module 376 µs slower showed "376 µs" beside another's "-1.71 ms": a rise read as a size.
    before = [("", "Net", dict(forward_ms=10.0)), ("fast", "Linear", dict(forward_ms=2.0)),
              ("slow", "Linear", dict(forward_ms=1.0))]
    after = [("", "Net", dict(forward_ms=10.0)), ("fast", "Linear", dict(forward_ms=0.29)),
             ("slow", "Linear", dict(forward_ms=1.376))]
    lines = str(layerprof.compare(hand_built(before), hand_built(after))).split("\n")
    start = next(i for i, line in enumerate(lines) if line.startswith("Modules with the largest change in total_ms"))
    assert [line.split() for line in lines[start + 3:start + 5]] == [
        ["fast", "2", "ms", "290", "µs", "-1.71", "ms", "0.145x"],  # 0.29 - 2
        ["slow", "1", "ms", "1.38", "ms", "+376", "µs", "1.38x"],  # 1.376 - 1
    ]


def test_compare_says_when_the_two_were_measured_otherwise() -> None:
    teacher, student = hand_built(TEACHER), hand_built(STUDENT)
    alike = {"device": "cpu", "dtype": "float32", "threads": 8, "cpu": "AMD EPYC 7B13", "torch": "2.14.1"}
    teacher.meta["environment"] = dict(alike, host="a")
    student.meta["environment"] = dict(alike, host="b")
    assert "Measured otherwise" not in str(layerprof.compare(teacher, student))  # hosts are not compared
    student.meta["environment"].update(threads=1, cpu="Intel Xeon 8480")
    lines = str(layerprof.compare(teacher, student, names=("teacher", "student"))).split("\n")
    assert "Measured otherwise: teacher ran with 8 threads and student with 1 thread: the times compare that too." in lines
    assert ("Measured otherwise: teacher ran CPU 'AMD EPYC 7B13' and student CPU 'Intel Xeon 8480': the times "
            "compare that too.") in lines


def test_compare_matches_modules_by_name_and_type() -> None:
    # A teacher whose block '1' is a Sequential, a student whose '1' is one Linear: the same name, not the same
    # module. Only the roots match whatever their types: they are the two models.
    teacher = hand_built([("", "Net", dict(forward_ms=9.0)), ("0", "Linear", dict(forward_ms=1.0)),
                          ("1", "Sequential", dict(forward_ms=6.0)), ("1.0", "Linear", dict(forward_ms=3.0))])
    student = hand_built([("", "Small", dict(forward_ms=3.0)), ("0", "Linear", dict(forward_ms=1.0)),
                          ("1", "Linear", dict(forward_ms=1.5))])
    result = layerprof.compare(teacher, student, names=("teacher", "student"))
    assert result.matched == ["", "0"] and result.retyped == ["1"]
    assert result.only_a == ["1", "1.0"] and result.only_b == ["1"]
    assert [row["name"] for row in result.modules] == ["", "0"]
    assert str(result).endswith("Only in teacher: 2 modules; only in student: 1 (1 name in both with another type "
                                "each, such as '1': Sequential and Linear).")
    for names in (("only-one",), "ab", ("a", "b", "c")):
        with pytest.raises(ValueError, match=r"names must be two labels, one per profile"):
            layerprof.compare(teacher, student, names=names)
    # A label that is one of the tables' columns took its place (two "diff" columns, both B's values): refused.
    for names in (("baseline", "diff"), ("metric", "new")):
        with pytest.raises(ValueError, match=rf"names: {names[0] if names[0] == 'metric' else names[1]!r} is a "
                                             r"column of the comparison's tables"):
            layerprof.compare(teacher, student, names=names)
    assert list(layerprof.compare(teacher, student, names=("b", "a")).to_dataframe().columns[:3]) == ["metric", "b",
                                                                                                      "a"]


class _CallsItsNet(nn.Module):
    """A trainer's module whose step calls ``self.net(x)``: the root itself is never called."""

    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 1))


def test_compare_of_roots_never_called_reads_their_top_level_modules() -> None:
    # As the summary and the gate do: before, the model table had no forward, backward or FLOPs row at all.
    def profiled(batch: int) -> Any:
        torch.manual_seed(0)
        wrapper = _CallsItsNet()
        with LayerProf(wrapper, metrics=("flops",)) as prof:
            for _ in range(2):
                wrapper.net(torch.randn(batch, 8)).sum().backward()
                prof.step()
        return prof.profile

    a, b = profiled(4), profiled(8)
    rows = {row["metric"]: row for row in layerprof.compare(a, b).model}
    for metric in ("forward_ms", "backward_ms", "flops_forward"):
        assert rows[metric]["a"] == getattr(a.records["net"], metric), metric
        assert rows[metric]["b"] == getattr(b.records["net"], metric), metric
    assert rows["total_ms"]["a"] == a.records["net"].forward_ms + a.records["net"].backward_ms
    # 2 * batch * (8*8 + 8*1) multiply-adds: 576 FLOPs forward at batch 4, 1,152 at batch 8
    assert (rows["flops_forward"]["a"], rows["flops_forward"]["b"]) == (2 * 4 * 72, 2 * 8 * 72)


def test_compare_real_runs_and_saved_files(resnet: LayerProf, tmp_path: Any) -> None:
    path = tmp_path / "resnet.json"
    resnet.to_json(path)
    result = layerprof.compare(resnet, str(path))
    rows = {row["metric"]: row for row in result.model}
    # No self times at model level; params come from the default "params" metric.
    assert list(rows) == ["modules", "params", "trainable_params", "param_bytes", "buffer_bytes", "forward_ms",
                          "backward_ms", "total_ms", "shared_params", "buffers"]
    assert rows["params"]["a"] == 11_689_512  # resnet18
    assert rows["forward_ms"]["ratio"] == 1.0 and rows["forward_ms"]["better"] == "same"
    assert len(result.matched) == 68 and all(row["total_ms_diff"] == 0 for row in result.modules)
    with pytest.raises(TypeError, match="expected a Profile"):
        layerprof.compare(resnet, 3)


# -- notebook and repr -------------------------------------------------------------------------------------------
def test_notebook_html_and_short_repr(resnet: LayerProf) -> None:
    html = resnet._repr_html_()
    assert html == resnet.profile._repr_html_()
    parser = _parse_html(html)
    assert len(parser.rows) == 1 + 68
    assert [row[0] for row in parser.rows[1:4]] == ["(root)", "conv1", "bn1"]
    assert 'style="padding-left: 2.9em"' in html  # depth 2 rows are indented 2 x 1.2em + 0.5em
    text = repr(resnet.profile)
    assert "\n" not in text and len(text) < 100 and text.startswith("<Profile ResNet: 68 modules")
    with LayerProf(nn.Linear(2, 2)) as live:
        assert live._repr_html_() is None
        live.model(torch.randn(1, 2))


def test_trace_times_nest_exactly_as_a_reader_adds_them(resnet: LayerProf) -> None:
    """A reader (speedscope's Chrome importer, Perfetto) ends a slice at ``ts + dur`` in doubles: a child that
    ends at its parent's instant must not end 6e-11 µs after it, or the reader closes the parent first."""
    document = json.loads(resnet.to_trace())
    slices = [e for e in document["traceEvents"] if e["ph"] == "X"]
    stacks: dict[int, list[tuple[float, float]]] = {}
    nested = shared_end = 0
    for event in slices:
        start, end = event["ts"], event["ts"] + event["dur"]  # float arithmetic, as JavaScript does it
        stack = stacks.setdefault(event["tid"], [])
        while stack and stack[-1][1] <= start:
            stack.pop()
        if stack:
            assert stack[0][0] <= start and end <= stack[-1][1], event["name"]
            nested += 1
            shared_end += end == stack[-1][1]
        stack.append((start, end))
    assert nested == len(slices) - 2  # everything but the root's forward and backward sits inside a parent
    assert shared_end > 0  # children that end at their parent's instant (ResNet's last ReLU in each block ...)
