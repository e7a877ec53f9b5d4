"""The Python API used the way people use it, mistakes included: each wrong argument refused at once, with a
TypeError for a wrong type and a ValueError for a bad value, naming the argument and what to write instead."""
from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import layerprof
from layerprof import LayerProf, Table


def _net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))


@pytest.fixture(scope="module")
def prof() -> LayerProf:
    net = _net()
    with LayerProf(net) as prof:
        for _ in range(3):
            net(torch.randn(2, 4)).sum().backward()
            prof.step()
    return prof


# -- table exports ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("call, error, message", [
    # Before: raw="yes" or raw=1 printed raw numbers; caption=3 was "'int' object is not iterable"; label=["x"]
    # wrote \label{['x']}; title=3 was an AttributeError of str.replace.
    (lambda p: p.to_markdown(raw="yes"), TypeError, "raw must be True or False, got 'yes' (str)"),
    (lambda p: p.to_html(raw=1), TypeError, "raw must be True or False, got 1 (int)"),
    (lambda p: p.to_latex(caption=3), TypeError, "caption must be a string or None, got 3 (int)"),
    (lambda p: p.to_latex(label=["x"]), TypeError, "label must be a string or None, got ['x'] (list)"),
    (lambda p: p.to_html(title=3), TypeError, "title must be a string or None, got 3 (int)"),
    (lambda p: p.rows().to_html(title=3), TypeError, "title must be a string, got 3"),
    # Before: 'int' object is not iterable, and a None among the names was "unknown column None" (a ValueError).
    (lambda p: p.to_csv(columns=3), TypeError,
     "columns must be a sequence of names such as ['name', 'forward'], got 3 (int)"),
    (lambda p: p.to_csv(columns=[None]), TypeError,
     "columns must hold names (strings) such as ['name', 'forward'], got None (NoneType) among them"),
])
def test_table_export_options_are_checked(prof: LayerProf, call: Any, error: type, message: str) -> None:
    with pytest.raises(error, match=f"^{re.escape(message)}$"):
        call(prof)


@pytest.mark.parametrize("method", ["to_csv", "to_markdown", "to_latex", "to_html"])
def test_columns_given_where_the_path_goes_are_named(prof: LayerProf, method: str, tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    # Before: Python's "expected str, bytes or os.PathLike object, not list", from deep in the file writing.
    monkeypatch.chdir(tmp_path)
    message = ("path must be a file path (a str or a Path) or None, got ['name', 'forward'] (list); to choose "
               "columns, write columns=['name', 'forward']")
    with pytest.raises(TypeError, match=f"^{re.escape(message)}$"):
        getattr(prof, method)(["name", "forward"])
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("method", ["to_json", "to_trace", "to_speedscope", "to_report"])
def test_a_path_that_is_no_path_is_refused_before_anything_is_measured(prof: LayerProf, method: str) -> None:
    with pytest.raises(TypeError, match=r"^path must be a file path \(a str or a Path\) or None, got 3 \(int\)$"):
        getattr(prof, method)(3)


@pytest.mark.parametrize("kwargs, error, message", [
    # Before: a string of columns was split into one column per letter ("N  A  M  E").
    (dict(rows=[{"name": "fc"}], columns="name"), TypeError,
     "columns must be a list of names, e.g. columns=['name'], not a string"),
    # Before: AttributeError 'str' object has no attribute 'items', and "argument of type 'int' is not iterable".
    (dict(rows="fc"), TypeError, "rows must be a list of dicts (one per row), got str"),
    (dict(rows=None), TypeError, "rows must be a list of dicts (one per row), got NoneType"),
    (dict(rows=[1, 2]), TypeError, "rows must be a list of dicts (one per row), got an item of type int"),
    # Before: accepted, then "unsupported operand type(s) for /" when printed.
    (dict(rows=[{"name": "fc", "forward_ms": 1.0}], step_ms="2"), TypeError,
     "step_ms must be a number of milliseconds or None, got '2'"),
])
def test_a_hand_made_table_is_checked_as_it_is_made(kwargs: dict, error: type, message: str) -> None:
    with pytest.raises(error, match=f"^{re.escape(message)}$"):
        Table(**kwargs)


def test_a_hand_made_table_takes_any_iterable_of_rows() -> None:
    table = Table(({"name": n, "forward_ms": 1.0} for n in ("a", "b")), columns=("name", "forward_ms"))
    assert [row["name"] for row in table] == ["a", "b"] and table.columns == ["name", "forward_ms"]


# -- summary and top --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("footer", ["yes", None, 1])
def test_summary_footer_must_be_a_bool(prof: LayerProf, footer: Any) -> None:
    # Before: footer="yes" and footer=1 added the footer, footer=None left it out, silently.
    with pytest.raises(TypeError, match=f"^footer must be True or False, got {re.escape(repr(footer))} "):
        prof.layerwise_summary(footer=footer)


@pytest.mark.parametrize("by", [None, ["forward_ms"], 1])
def test_top_by_must_be_one_field_name(prof: LayerProf, by: Any) -> None:
    # Before: by=["forward_ms"] was "unhashable type: 'list'"; by=None a ValueError listing the fields.
    message = f"by must be the name of one numeric field, such as by='forward_ms', got {by!r}"
    with pytest.raises(TypeError, match=f"^{re.escape(message)}$"):
        prof.top(2, by=by)


def test_top_ranks_by_a_statistic_over_steps(prof: LayerProf) -> None:
    # Before: "cannot rank by 'forward_ms_p95'", though columns= and the summary show it when asked by name.
    table = prof.top(2, by="forward_ms_p95")
    ranked = sorted((r for r in prof.records.values() if r.name), key=lambda r: -r.forward_ms_p95)[:2]
    assert [row["name"] for row in table] == [record.name for record in ranked]
    assert table.columns[:4] == ["name", "type", "calls", "forward_ms_p95"]


def test_top_by_calls_shows_calls_once(prof: LayerProf) -> None:
    # Before: the columns were name, type, calls, calls, ...
    table = prof.top(2, by="calls")
    assert table.columns.count("calls") == 1
    assert str(table).splitlines()[0].split().count("Calls") == 1


# -- load -------------------------------------------------------------------------------------------------------
def test_load_of_json_text_says_to_use_loads(prof: LayerProf) -> None:
    # Before: OSError "File name too long" with the whole text in it.
    with pytest.raises(ValueError, match=r"^load takes a path or an open file, and this is JSON text: read it with "
                                         r"layerprof\.loads\(text\)$"):
        layerprof.load(prof.to_json(indent=None))
    assert layerprof.loads(prof.to_json()).to_dict() == prof.to_dict()


# -- benchmark --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("kwargs, error, message", [
    # Before: "'<' not supported between instances of 'str' and 'int'", "'float' object cannot be interpreted
    # as an integer", and iters=True ran one iteration printed as "True iteration".
    (dict(iters="5"), TypeError, "iters must be an int, got '5' (str)"),
    (dict(iters=2.0), TypeError, "iters must be an int, got 2.0 (float)"),
    (dict(iters=True), TypeError, "iters must be an int, got True (bool)"),
    (dict(iters=0), ValueError, "need iters >= 1 and warmup >= 0, got iters=0, warmup=0"),
    (dict(warmup=None), TypeError, "warmup must be an int, got None (NoneType)"),
    (dict(warmup=1.5), TypeError, "warmup must be an int, got 1.5 (float)"),
    # Before: backward="no" ran the backward, per_module="no" profiled.
    (dict(backward="no"), TypeError, "backward must be True or False, got 'no' (str)"),
    (dict(per_module="no"), TypeError, "per_module must be True or False, got 'no' (str)"),
    (dict(progress="no"), TypeError,
     "progress must be True, False or None (a bar for long runs on a terminal), got 'no'"),
])
def test_benchmark_options_are_checked_before_running(kwargs: dict, error: type, message: str) -> None:
    net = _net()
    calls = []
    net.register_forward_hook(lambda *_: calls.append(1))
    with pytest.raises(error, match=f"^{re.escape(message)}$"):
        layerprof.benchmark(net, torch.randn(2, 4), **{"iters": 2, "warmup": 0, **kwargs})
    assert calls == []


@pytest.mark.parametrize("model, shown", [(None, "builtins.NoneType"),
                                          (torch.tanh, "builtins.builtin_function_or_method")])
def test_benchmark_of_no_module_is_refused_before_running(model: Any, shown: str) -> None:
    # Before: a function ran every iteration, then failed on "'function' object has no attribute '_parameters'".
    with pytest.raises(TypeError, match=f"^benchmark times a torch.nn.Module, got {re.escape(shown)}$"):
        layerprof.benchmark(model, torch.randn(2, 4), iters=2, warmup=0)


def test_benchmark_progress_bar_counts_every_iteration(monkeypatch: pytest.MonkeyPatch) -> None:
    # Before: per_module with a warm-up made one more step than the bar's total (101 of 100).
    bench = sys.modules["layerprof.benchmark"]  # (the package's name ``benchmark`` is the function)
    bars = []

    class Bar:
        def __init__(self, total: int) -> None:
            self.total, self.done = total, 0
            bars.append(self)

        def update(self, n: int) -> None:
            self.done += n

        def close(self) -> None:
            pass

    monkeypatch.setattr(bench, "progress_bar", lambda total, *args, **kwargs: Bar(total))
    layerprof.benchmark(_net(), torch.randn(2, 4), iters=3, warmup=2, backward=True, per_module=True, progress=True)
    assert [(bar.total, bar.done) for bar in bars] == [(2 + 3 + 3 + 1, 2 + 3 + 3 + 1)]


# -- filters ----------------------------------------------------------------------------------------------------
def test_several_types_in_one_string_say_how_to_write_them(prof: LayerProf) -> None:
    # Before: matched no module (no class is named "Linear,ReLU"), an empty table without a word.
    message = "type= takes a class name or several in a tuple: write type=('Linear', 'ReLU'), not 'Linear, ReLU'"
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        prof.rows(type="Linear, ReLU")
    assert [record.name for record in prof.select(type=("Linear", "ReLU"))] == ["0", "1", "2"]


def test_compare_module_fields_are_field_names(prof: LayerProf) -> None:
    # A string compared its letters ('f', 'o', 'r', 'w'...); an unknown name gave a column of None; short names
    # were not resolved.
    with pytest.raises(TypeError, match=re.escape("module_fields must be a sequence of names, not a string: write "
                                                  "module_fields=('forward_ms',)")):
        layerprof.compare(prof.profile, prof.profile, module_fields="forward_ms")
    with pytest.raises(ValueError, match=re.escape("module_fields: unknown field(s) 'forwrd'; give field names such "
                                                   "as 'forward_ms'")):
        layerprof.compare(prof.profile, prof.profile, module_fields=["forwrd"])
    compared = layerprof.compare(prof.profile, prof.profile, module_fields=["forward", "params"])
    assert compared.module_fields == ["forward_ms", "params"]
    assert compared.modules[0]["params_a"] == compared.modules[0]["params_b"] == 4 * 8 + 8 + 8 * 1 + 1  # 49


@pytest.mark.filterwarnings("ignore:only one step was profiled")
def test_compare_module_fields_that_a_profile_did_not_record_are_refused(prof: LayerProf) -> None:
    # Before: module_fields=("flops",) of profiles without FLOPs gave columns of None on every module, without a word.
    net = _net()
    with LayerProf(net, metrics=("flops",)) as counted:
        net(torch.randn(2, 4)).sum().backward()
    with pytest.raises(ValueError, match=re.escape("module_fields: 'flops' was recorded by neither profile ('a' nor "
                                                   "'b'), so its columns would be empty; run with LayerProf(model, "
                                                   "metrics=('flops',))")):
        layerprof.compare(prof.profile, prof.profile, module_fields=("flops",))
    with pytest.raises(ValueError, match=re.escape("module_fields: 'flops' was recorded by profile 'before' but not by "
                                                   "'after', so nothing of it compares; for 'after', run with "
                                                   "LayerProf(model, metrics=('flops',))")):
        layerprof.compare(counted, prof.profile, names=("before", "after"), module_fields=("flops",))
    compared = layerprof.compare(counted, counted, module_fields=("flops",))
    assert compared.modules[1]["flops_a"] == compared.modules[1]["flops_b"] > 0


def test_a_meter_named_twice_is_refused() -> None:
    # It ran twice, and timing_distorted_by listed ['flops', 'flops'].
    with pytest.raises(ValueError, match=re.escape("metrics: 'flops' is given twice; give each meter once")):
        LayerProf(_net(), metrics=["flops", "flops"])


@pytest.mark.parametrize("kwargs, error, message", [
    ({"margin": "0.2"}, TypeError, "margin must be a fraction such as 0.2, got '0.2' (str)"),
    ({"margin": -1}, ValueError, "margin must be a fraction such as 0.2 (at least 0), got -1"),
    ({"min_ms": "1"}, TypeError, "min_ms must be milliseconds such as 1.0, or None, got '1' (str)"),
    ({"dst": "0"}, TypeError, "dst must be an int >= 0, got '0' (str)"),
])
def test_gather_checks_its_arguments_before_the_collective(prof: LayerProf, kwargs: dict[str, Any],
                                                           error: type, message: str) -> None:
    # margin="0.2" failed comparing a str with a number, after the ranks had gathered; min_ms="1" printed "1 ms".
    with pytest.raises(error, match=re.escape(message)):
        prof.gather(**kwargs)
