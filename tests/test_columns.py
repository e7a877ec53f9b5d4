"""Columns at the boundary: names checked once against the field catalogue and the rows, short names accepted,
each quantity shown once and in its unit."""
from __future__ import annotations

import importlib.util

import pytest
import torch
from torch import nn

from layerprof import LayerProf


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
