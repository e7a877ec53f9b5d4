"""Outputs opened the way users open them: module names that mean something to LaTeX, Markdown or matplotlib,
plots of such models, and the units of the tables."""
from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
from torch import nn

import layerprof
from layerprof.render.table import Table

matplotlib = pytest.importorskip("matplotlib")
matplotlib.use("Agg")

# Names matplotlib would read as mathtext: a formula it cannot parse, and one it would draw in italics.
DOLLAR_NAMES = ("$\\frac$", "a$x_1$b")


def _dollar_profile() -> layerprof.LayerProf:
    torch.manual_seed(0)
    net = type("Net$\\frac$", (nn.Sequential,), {})()  # a class name is drawn too: in the titles
    for name in DOLLAR_NAMES:
        net.add_module(name, nn.Linear(16, 16))
    with layerprof.LayerProf(net, metrics=("params", "flops"), peaks={"flops": 1e10, "bandwidth": 1e9}) as prof:
        for _ in range(2):
            net(torch.randn(64, 16)).sum().backward()
            prof.step()
    return prof


@pytest.mark.parametrize("kind", ["sunburst", "icicle", "top", "roofline"])
def test_plots_of_modules_named_with_dollar_signs_are_written(kind: str, tmp_path: Path) -> None:
    # Before: matplotlib parsed "$\frac$" as a formula and every plot (and to_report, which draws the roofline)
    # raised ValueError "Expected \frac{num}{den}".
    path = tmp_path / f"{kind}.png"
    _dollar_profile().plot(kind, path=path)
    assert path.stat().st_size > 0
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"{kind}.png"]


def test_the_checkpoint_plot_of_a_model_whose_class_has_dollar_signs(tmp_path: Path) -> None:
    # The frontier plot's title holds the model's class name: "Net$\frac$" raised as every other plot did.
    torch.manual_seed(0)
    net = type("Net$\\frac$", (nn.Sequential,), {})(nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 8))
    with layerprof.LayerProf(net, metrics=("memory",)) as prof:
        for _ in range(2):
            net(torch.randn(4, 8)).sum().backward()
            prof.step()
    path = tmp_path / "checkpoint.png"
    prof.plot("checkpoint", path=path)
    assert path.stat().st_size > 0


def test_plot_labels_show_dollar_signs_as_written() -> None:
    import matplotlib.pyplot as plt

    ax = layerprof.plot_top(_dollar_profile(), k=2, metric="params")
    labels = [label.get_text() for label in ax.get_yticklabels()]
    plt.close(ax.figure)
    # Each "$" escaped: matplotlib draws "\$" as "$" and opens no formula, so "a$x_1$b" is not italic "x" with a
    # subscript 1 (params: 16 * 16 + 16 = 272 each, a tie kept in named_modules() order).
    assert labels == ["\\$\\frac\\$ (Linear)", "a\\$x_1\\$b (Linear)"]


def test_report_of_modules_named_with_dollar_signs() -> None:
    page = _dollar_profile().to_report()
    assert "a$x_1$b" in page and 'id="roofline-section"' in page  # the roofline drawn, titled "Net$\frac$: ..."


def test_latex_escapes_characters_ot1_prints_as_others_and_line_breaks() -> None:
    table = Table([{"name": "a<b>|c", "type": "T"}, {"name": "two\n\nlines\r", "type": "T"}], columns=("name", "type"))
    # OT1 (LaTeX's default font encoding) prints < > | as ¡ ¿ —; a blank line inside a tabular cell is an error.
    assert table.to_latex() == (
        "\\begin{tabular}{ll}\n\\toprule\nName & Type \\\\\n\\midrule\n"
        "a\\textless{}b\\textgreater{}\\textbar{}c & T \\\\\n"
        "two  lines  & T \\\\\n"
        "\\bottomrule\n\\end{tabular}\n"
    )


def test_markdown_row_survives_a_carriage_return_in_a_name() -> None:
    # CommonMark ends a line at \r as at \n: the row would be cut in two.
    table = Table([{"name": "a\rb\r\nc", "type": "T"}], columns=("name", "type"))
    assert table.to_markdown() == "| Name | Type |\n|:---|:---|\n| a b  c | T |\n"



@pytest.mark.parametrize("indent, error", [("\t", TypeError), (2.5, TypeError), (True, TypeError), (-1, ValueError)])
def test_to_json_refuses_an_indent_that_is_not_a_count_of_spaces(indent: object, error: type) -> None:
    net = nn.Sequential(nn.Linear(4, 4))
    with layerprof.LayerProf(net) as prof:
        net(torch.randn(2, 4)).sum().backward()
    # Before: "can't multiply sequence by non-int of type 'str'", or True taken as 1 and -1 as 0.
    with pytest.raises(error, match=r"^indent must be (an int )?>= 0 or None, got "):
        prof.to_json(indent=indent)


def _small_profile() -> layerprof.LayerProf:
    net = nn.Sequential(nn.Linear(4, 4), nn.ReLU())
    with layerprof.LayerProf(net) as prof:
        net(torch.randn(2, 4)).sum().backward()
    return prof


@pytest.mark.parametrize("kind, options, error, message", [
    ("sunburst", {"depth": -1}, ValueError, "depth must be >= 0 or None, got -1"),
    ("icicle", {"depth": "2"}, TypeError, "depth must be an int >= 0 or None, got '2' (str)"),
    ("icicle", {"min_share": 1.5}, ValueError,
     "min_share must be a share of the total, at least 0 and below 1 (such as 0.004), got 1.5"),
    ("sunburst", {"min_share": "0.01"}, TypeError,
     "min_share must be a share of the total, at least 0 and below 1 (such as 0.004), got '0.01' (str)"),
    ("top", {"k": 2.5}, TypeError, "k must be an int >= 1, got 2.5 (float)"),
    ("top", {"k": True}, TypeError, "k must be an int >= 1, got True (bool)"),
])
def test_plot_options_are_checked_before_drawing(kind: str, options: dict, error: type, message: str) -> None:
    import matplotlib.pyplot as plt

    before = plt.get_fignums()
    with pytest.raises(error) as raised:
        _small_profile().plot(kind, **options)
    assert str(raised.value) == message
    assert plt.get_fignums() == before  # refused before a figure was made


def test_plotting_recompute_time_without_checkpointing_says_how_to_get_it() -> None:
    # Before: "call the model (and .backward() for backward time) inside the `with LayerProf(model)` block", which
    # the profile had done.
    with pytest.raises(ValueError) as raised:
        _small_profile().plot("top", metric="recompute")
    assert str(raised.value) == (
        "cannot plot metric 'recompute': no record of this profile holds the field 'recompute_ms'; it is measured "
        "where modules run under activation checkpointing: wrap some in torch.utils.checkpoint, or apply a plan "
        "(prof.checkpoint_plan(budget).applied(model))")


def test_a_plot_kind_that_is_no_name_is_a_type_error() -> None:
    with pytest.raises(TypeError, match="kind must be a plot kind's name, one of: sunburst, "):
        _dollar_profile().plot(None)  # (a ValueError "unknown plot kind None" before)


class Trainer(nn.Module):
    """A step that calls ``model.net(x)``: the root is never called itself."""

    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 4))


def test_shares_of_a_root_never_called_are_of_its_top_level_modules_in_every_table(tmp_path: Path) -> None:
    # The summary, compare() and the gate sum the top-level modules of a root never called; the tables, the
    # DataFrame and TensorBoard had no share (NaN, "—") and no time scalar for the model.
    pytest.importorskip("pandas")
    trainer = Trainer()
    with layerprof.LayerProf(trainer) as prof:
        trainer.net(torch.randn(8, 16)).sum().backward()
    net = prof.records["net"]
    frame = prof.to_dataframe(columns=("name", "total_ms", "time_percent"))
    shares = dict(zip(frame["name"], frame["time_percent"]))
    assert shares["net"] == pytest.approx(100.0)  # (the top-level module: the whole)
    assert shares["net.0"] == pytest.approx(100.0 * prof.records["net.0"].total_ms / net.total_ms)
    markdown = prof.top(2).to_markdown(columns=("name", "total", "time_percent"))
    assert "| — |" not in markdown and "%" in markdown.splitlines()[2]
    tensorboard = pytest.importorskip("torch.utils.tensorboard")
    tags = prof.to_tensorboard(str(tmp_path / "tb"))
    assert "layerprof/total_ms/Trainer" in tags and "layerprof/forward_ms/Trainer" in tags
    assert tensorboard is not None


def test_the_roofline_table_computes_a_column_asked_for_from_its_records() -> None:
    # prof.roofline().to_markdown(columns=("flops", "bytes", ...)) printed "—" for every module: its rows were built
    # without records, so a derived column computed from the row dicts, which lack the stored fields.
    net = nn.Sequential(nn.Linear(512, 2048), nn.ReLU())
    with layerprof.LayerProf(net, metrics=("flops",), peaks={"flops": 1e11, "bandwidth": 1e10}) as prof:
        net(torch.randn(8, 512)).sum().backward()
        prof.step()
        net(torch.randn(8, 512)).sum().backward()
    pytest.importorskip("pandas")
    frame = prof.roofline().to_dataframe(columns=("name", "flops", "intensity"))
    row = frame[frame["name"] == "0"].iloc[0]
    record = prof.records["0"]
    assert row["flops"] == record.flops_forward + record.flops_backward and row["intensity"] > 0
    assert "| — |" not in prof.roofline().to_markdown(columns=("name", "flops", "bytes", "intensity"))


def test_an_empty_dataframe_has_the_types_of_a_full_one() -> None:
    pytest.importorskip("pandas")
    net = nn.Sequential(nn.Linear(8, 8), nn.ReLU())
    with layerprof.LayerProf(net) as prof:
        net(torch.randn(2, 8)).sum().backward()
    full, empty = prof.to_dataframe(), prof.to_dataframe(type="Conv2d")
    assert len(empty) == 0
    for column in ("name", "type", "parent", "calls"):
        assert empty[column].dtype == full[column].dtype, column


@pytest.mark.parametrize("option, error, message", [
    ({"top": 0}, ValueError, "top must be >= 1 or None, got 0"),
    ({"depth": 0}, ValueError, "depth must be >= 1 or None, got 0"),
    ({"top": -1}, ValueError, "top must be >= 1 or None, got -1"),
    # a wrong type: ValueErrors before; and a step of "x" was tensorboard's "invalid literal for int() with base
    # 10: 'x'", once the log folder and its event file were made (1.5 was written as step 1)
    ({"depth": True}, TypeError, "depth must be an int >= 1 or None, got True (bool)"),
    ({"top": "3"}, TypeError, "top must be an int >= 1 or None, got '3' (str)"),
    ({"step": "x"}, TypeError, "step must be an int or None, got 'x' (str)"),
    ({"step": 1.5}, TypeError, "step must be an int or None, got 1.5 (float)"),
])
def test_tensorboard_refuses_a_top_depth_or_step_it_would_not_honour(option: dict, error: type, message: str,
                                                                      tmp_path: Path) -> None:
    # top=0 wrote the model's scalars and a 10-row table; depth=0 an empty table beside plots of the whole tree.
    pytest.importorskip("torch.utils.tensorboard")
    net = nn.Sequential(nn.Linear(8, 8), nn.ReLU())
    with layerprof.LayerProf(net) as prof:
        net(torch.randn(2, 8)).sum().backward()
    with pytest.raises(error, match=f"^{re.escape(message)}$"):
        prof.to_tensorboard(str(tmp_path / "tb"), **option)
    assert not (tmp_path / "tb").exists()  # (refused before a writer was made)
