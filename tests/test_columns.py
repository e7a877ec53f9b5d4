"""Columns at the boundary: names checked once against the field catalogue and the rows, short names accepted,
each quantity shown once and in its unit."""
from __future__ import annotations

import importlib.util
import io
import re
import warnings

import pytest
import torch
from torch import nn

from layerprof import LayerProf
from layerprof.record.fields import FIELDS
from layerprof.render.table import Table


@pytest.fixture(scope="module")
def prof() -> LayerProf:
    net = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
    with LayerProf(net) as prof:
        net(torch.randn(2, 4)).sum().backward()
    return prof


def test_a_string_of_columns_is_refused_not_read_as_letters(prof: LayerProf) -> None:
    with pytest.raises(TypeError, match=r"columns must be a list of field names, e.g. columns=\('forward',\)"):
        prof.layerwise_summary(columns="forward")
    with pytest.raises(TypeError, match=r"columns=\['forward'\], not a string"):
        prof.to_csv(columns="forward")


def test_unknown_columns_are_refused_by_every_table_export(prof: LayerProf) -> None:
    exports = [prof.to_csv, prof.to_markdown, prof.to_latex, prof.to_html]
    if importlib.util.find_spec("pandas") is not None:  # an optional package (the "examples" and "test" extras)
        exports.append(prof.to_dataframe)
    for export in exports:
        with pytest.raises(ValueError, match=r"unknown column 'nope': the rows hold name, type, depth"):
            export(columns=["nope"])
    with pytest.raises(ValueError, match=r"unknown column 'nope'; choose from: forward, backward, total"):
        prof.layerwise_summary(columns=["nope"])


def test_short_names_resolve_to_the_one_field_name(prof: LayerProf) -> None:
    header = prof.to_csv(columns=["name", "forward", "total"]).splitlines()[0]
    assert header == "name,forward_ms,total_ms"
    assert prof.layerwise_summary(columns=("forward",)) == prof.layerwise_summary(columns=("forward_ms",))


def test_calls_column_is_shown_once_and_no_columns_gives_the_plain_repr() -> None:
    cell = nn.Linear(4, 4)
    net = nn.Sequential(cell, nn.ReLU(), cell)
    with LayerProf(net) as prof:
        net(torch.randn(2, 4)).sum().backward()
    line = prof.layerwise_summary(columns=("forward", "calls")).splitlines()[2]
    assert "Calls: 2" in line and "2 calls" not in line
    assert "2 calls" in prof.layerwise_summary().splitlines()[2]
    plain = prof.layerwise_summary(columns=(), footer=False).split("\n", 1)[1]
    assert "【" not in plain and plain.startswith("Sequential(\n  (0): Linear(in_features=4, out_features=4")


def test_calls_that_vary_over_steps_print_as_a_short_mean() -> None:
    net = nn.Sequential(nn.Linear(4, 4))
    with LayerProf(net) as prof:
        for step in range(3):
            for _ in range(1 + (step == 0)):  # 2 calls, then 1, then 1: 4/3 per step
                net(torch.randn(2, 4)).sum().backward()
            prof.step()
    assert prof.records["0"].calls == pytest.approx(4 / 3)
    assert "1.33 calls" in prof.layerwise_summary() and "1.3333" not in prof.layerwise_summary()


# -- a selection that matches no module ---------------------------------------------------------------------------
def test_a_filter_that_matches_nothing_keeps_the_header(prof: LayerProf) -> None:
    header = prof.to_csv().splitlines()[0]
    assert header.startswith("name,type,depth,parent,calls,forward_ms,backward_ms,")
    assert prof.to_csv(type="Conv2d") == header + "\n"  # the columns of the unfiltered table, no rows
    assert prof.rows()[10:].to_csv() == header + "\n"  # an empty slice too
    assert prof.to_csv(type="Conv2d", columns=("name", "forward")) == "name,forward_ms\n"
    assert prof.to_markdown(type="Conv2d") == (
        "| Name | Type | Forward | Backward | Time % | Params |\n|:---|:---|:---|:---|:---|:---|\n")
    assert prof.to_markdown(type="Conv2d", columns=("name", "forward")) == "| Name | Forward |\n|:---|:---|\n"
    assert prof.to_latex(type="Conv2d").splitlines()[:3] == [
        "\\begin{tabular}{llllll}", "\\toprule", "Name & Type & Forward & Backward & Time \\% & Params \\\\"]
    assert prof.top(3, type="Conv2d").to_markdown() == "| Name | Type | Total |\n|:---|:---|:---|\n"
    # the columns of the whole tree's aggregate
    assert prof.aggregate(type="Conv2d").to_csv() == prof.aggregate().to_csv().splitlines()[0] + "\n"
    assert prof.aggregate(type="Conv2d").to_csv().startswith("type,modules,calls,forward_ms,backward_ms,")
    assert Table.by_type([]).to_markdown() == "| Type | Modules | Calls | Total |\n|:---|:---|:---|:---|\n"
    head = re.compile(r"<thead>.*</thead>\n<tbody>\n")
    assert head.search(prof.to_html(type="Conv2d")).group() == head.search(prof.to_html()).group()
    assert "<tbody>\n</tbody>" in prof.to_html(type="Conv2d")


def test_an_empty_aggregate_given_its_tree_has_the_tree_aggregates_columns(prof: LayerProf) -> None:
    everything = Table.by_type(prof.records.values()).to_csv().splitlines()[0]
    assert everything.startswith("type,modules,calls,forward_ms,backward_ms,")
    assert Table.by_type([], root=prof.tree).to_csv() == everything + "\n"


def test_an_empty_selection_reads_back_as_a_frame_with_its_columns(prof: LayerProf) -> None:
    pandas = pytest.importorskip("pandas")
    frame = pandas.read_csv(io.StringIO(prof.to_csv(type="Conv2d")))  # EmptyDataError without a header
    assert list(frame.columns) == prof.to_csv().splitlines()[0].split(",") and len(frame) == 0
    empty = prof.to_dataframe(type="Conv2d")
    assert list(empty.columns) == list(prof.to_dataframe().columns) and len(empty) == 0


def test_an_empty_column_selection_is_refused_by_every_table_export(prof: LayerProf) -> None:
    exports = [prof.to_csv, prof.to_markdown, prof.to_latex, prof.to_html]
    if importlib.util.find_spec("pandas") is not None:
        exports.append(prof.to_dataframe)
    for export in exports:
        with pytest.raises(ValueError, match=r"^columns is empty: name at least one column, e\.g\. columns=\('name', "):
            export(columns=())


# -- derived fields, computed when asked for by name ------------------------------------------------------------
@pytest.fixture(scope="module")
def metered() -> LayerProf:
    net = nn.Sequential(nn.Linear(8, 16), nn.BatchNorm1d(16), nn.Linear(16, 1))
    net[2].requires_grad_(False)
    with LayerProf(net, metrics=("params", "flops")) as prof, torch.no_grad():
        for _ in range(2):  # FLOPs counted in the first step, times from the second
            net(torch.randn(4, 8))
            prof.step()
    return prof


def test_derived_fields_are_columns_of_every_table(metered: LayerProf) -> None:
    # size = param + buffer bytes: Linear(8, 16) (8*16+16)*4 = 576; BatchNorm1d(16) 32*4 params + 2*16*4
    # running stats + 8 (num_batches_tracked, int64) = 264; Linear(16, 1) 17*4 = 68; all 908.
    # frozen_params: the last Linear's 17. macs = flops / 2: 2*4*8*16 / 2 = 512 and 2*4*16 / 2 = 64 (forward only).
    assert metered.to_csv(columns=("name", "size", "frozen_params", "macs")) == (
        "name,size,frozen_params,macs\n,908,17,576\n0,576,0,512\n1,264,0,0\n2,68,17,64\n")  # counts, as ints
    assert metered.to_markdown(columns=("name", "size", "macs"), leaves=True).splitlines()[2:] == [
        "| 0 | 576 B | 512 MACs |", "| 1 | 264 B | 0 MACs |", "| 2 | 68 B | 64 MACs |"]
    # flops_per_s = flops / total time; forward_percent: a share of the root's forward (the root's own: 100).
    row = metered.rows(name="0").to_dataframe(columns=("flops_per_s", "forward_ms")).iloc[0]
    assert row["flops_per_s"] == pytest.approx(1024 / (row["forward_ms"] / 1000))
    assert metered.to_csv(columns=("name", "forward_percent"), depth=0) == "name,forward_percent\n,100.0\n"
    # An aggregate computes them from its summed rows: the two Linears' 576 + 68 bytes and 512 + 64 MACs.
    assert metered.aggregate().to_csv(columns=("type", "modules", "size", "macs")) == (
        "type,modules,size,macs\nSequential,1,908,576\nLinear,2,644,576\nBatchNorm1d,1,264,0\n")
    # Computed, never stored: the rows and the records keep the stored fields only.
    assert "macs" not in metered.to_csv().splitlines()[0].split(",")
    assert not hasattr(metered.records["0"], "macs")


def test_every_field_has_its_own_label(prof: LayerProf) -> None:
    # Before: self_total_ms and self_percent were both "Self Time" in the summary's header, so a summary of the two
    # read "Self Time: 1 ms (7.5%) | Self Time: 7.5%". A share is labelled as the other shares are: "Forward" for
    # forward_percent, "Time" for time_percent, "Self" for self_percent.
    labels: dict[str, str] = {}
    for field in FIELDS.values():
        assert labels.setdefault(field.label, field.name) == field.name, (field.label, labels[field.label])
    line = prof.layerwise_summary(columns=("self_total", "self_percent")).split("\n")[1]
    assert "【Self Time: " in line and " | Self: " in line, line


@pytest.mark.parametrize("export", ["to_csv", "to_markdown", "to_dataframe", "to_html", "to_latex"])
@pytest.mark.parametrize("column, meter", [("saved_bytes", "memory"), ("flops_forward", "flops"), ("flops", "flops")])
def test_a_column_of_a_meter_that_did_not_run_says_which_to_run(prof: LayerProf, export: str, column: str,
                                                                 meter: str) -> None:
    # Before: a stored field read "unknown column 'saved_bytes'" (it is a field: the meter did not run), and a
    # derived one ('flops') wrote a column of blanks for every module.
    if export == "to_dataframe" and importlib.util.find_spec("pandas") is None:
        pytest.skip("needs pandas")
    with pytest.raises(ValueError, match=re.escape(f"column {column!r}: no module of this profile holds it; run "
                                                   f"with LayerProf(model, metrics=({meter!r},))")):
        getattr(prof, export)(columns=[column])


def test_a_column_some_module_holds_stays_a_column_of_a_selection_without_it() -> None:
    net = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (one step with a meter that slows it)
        with LayerProf(net, metrics=("flops",)) as metered:
            net[0](torch.randn(2, 4)).sum().backward()  # the others never run: no figures of theirs
    assert metered.to_csv(columns=["name", "flops"], name="2") == "name,flops\n2,\n"


@pytest.mark.parametrize("column, hint", [
    ("flops", "run with LayerProf(model, metrics=('flops',))"),
    ("saved_bytes", "run with LayerProf(model, metrics=('memory',))"),
])
def test_a_summary_column_no_module_holds_is_refused_with_how_to_record_it(prof: LayerProf, column: str,
                                                                          hint: str) -> None:
    # Before: the summary printed "FLOPs: —" on every line, where the command line, plot and compare refuse it.
    with pytest.raises(ValueError, match=re.escape(f"column {column!r}: no module of this profile holds it; {hint}")):
        prof.layerwise_summary(columns=["forward", column])
    assert "Forward Time" in prof.layerwise_summary(columns=["forward"])


def test_a_backward_summary_column_of_a_forward_only_profile_says_it_has_no_backward() -> None:
    net = nn.Sequential(nn.Linear(4, 8), nn.ReLU())
    with LayerProf(net) as forward_only:
        net(torch.randn(2, 4))
    with pytest.raises(ValueError, match=re.escape("column 'backward_ms': no module of this profile holds it; "
                                                   "this profile has no backward pass")):
        forward_only.layerwise_summary(columns=["backward"])
    assert "Backward Time: —" in forward_only.layerwise_summary()  # the default columns, not asked for: shown


def test_a_summary_column_the_model_gave_no_value_of_still_shows(prof: LayerProf) -> None:
    # A script that asks the same columns of every model: recompute where nothing was checkpointed, a CUDA figure
    # of a CPU run whose memory meter ran, print "—" as before.
    assert "Recompute: —" in prof.layerwise_summary(columns=["forward", "recompute"])
