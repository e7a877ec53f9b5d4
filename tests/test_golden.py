"""Golden output: the summary, tables and exports of one fixed, hand-built profile, compared character for
character with files in tests/golden/. A change in rendering shows up as a diff to review; regenerate the files
on purpose only, with ``python -m pytest tests/test_golden.py --regenerate-golden``."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Callable

import pytest

from layerprof import Profile
from layerprof.record.records import CallTiming, ModuleRecord

GOLDEN = Path(__file__).parent / "golden"


def fixed_profile() -> Profile:
    """A 2-block model whose every number is chosen by hand: a shared module, a module called twice, a module
    that did not run, parameters, FLOPs, memory and shapes, statistics over 4 steps."""
    spec = [
        ("", "Net", "", dict(calls=1, forward_ms=12.0, backward_ms=28.0, self_forward_ms=1.0, self_backward_ms=2.0,
                             params=1_230, trainable_params=1_190, buffer_bytes=0, param_bytes=4_920, flops_forward=3_000_000, flops_backward=6_000_000,
                             activation_bytes=65_536, saved_bytes=131_072)),
        ("embed", "Embedding", "100, 8", dict(calls=1, forward_ms=0.5, backward_ms=1.5, self_forward_ms=0.5,
                                              self_backward_ms=1.5, params=800, param_bytes=3_200,
                                              flops_forward=0, flops_backward=0, activation_bytes=8_192,
                                              saved_bytes=0, input_shapes=[[4, 16]], output_shapes=[[4, 16, 8]])),
        ("blocks", "Sequential", "", dict(calls=1, forward_ms=10.5, backward_ms=24.5, self_forward_ms=0.25,
                                          self_backward_ms=0.5, params=430, param_bytes=1_720,
                                          flops_forward=3_000_000, flops_backward=6_000_000,
                                          activation_bytes=57_344, saved_bytes=131_072)),
        ("blocks.0", "Linear", "in_features=8, out_features=40, bias=True",
         dict(calls=2, forward_ms=6.25, backward_ms=16.0, self_forward_ms=6.25, self_backward_ms=16.0, params=360,
              param_bytes=1_440, flops_forward=2_560_000, flops_backward=5_120_000, activation_bytes=40_960,
              saved_bytes=98_304, input_shapes=[[4, 16, 8]], output_shapes=[[4, 16, 40]])),
        ("blocks.1", "ReLU", "inplace=True", dict(calls=1, forward_ms=0.125, backward_ms=0.375,
                                                  self_forward_ms=0.125, self_backward_ms=0.375, params=0,
                                                  param_bytes=0, flops_forward=0, flops_backward=0,
                                                  activation_bytes=0, saved_bytes=16_384)),
        ("blocks.2", "Linear", "in_features=40, out_features=1, bias=True",
         dict(calls=1, forward_ms=3.875, backward_ms=7.625, self_forward_ms=3.875, self_backward_ms=7.625,
              params=41, param_bytes=164, flops_forward=440_000, flops_backward=880_000, activation_bytes=16_384,
              saved_bytes=16_384)),
        ("head", "Dropout", "p=0.1, inplace=False", dict(calls=0)),
    ]
    records: dict[str, ModuleRecord] = {}
    for name, type_name, extra, values in spec:
        parent = None if name == "" else records[name.rpartition(".")[0]]
        record = ModuleRecord(name, type_name, extra, parent)
        record.steps = 4
        record.steps_run = 4 if values.get("calls") else 0
        for key, value in values.items():
            setattr(record, key, value)
        if record.forward_ms is not None:
            record.forward_ms_median, record.forward_ms_p95 = record.forward_ms, record.forward_ms * 1.5
            record.call_times = [CallTiming(forward_start_ms=1.0, forward_ms=record.forward_ms,
                                            backward_start_ms=20.0, backward_ms=record.backward_ms, step=3)]
        records[name] = record
    records["blocks"].aliases.append("shortcut")
    return Profile(records[""], meta={"steps": 4, "clock": ["wall"], "environment": {"torch": "fixed"}})


RENDERINGS: dict[str, Callable[[Profile], str]] = {
    "summary.txt": lambda p: p.layerwise_summary(),
    "summary_columns.txt": lambda p: p.layerwise_summary(
        columns=("total", "self_total_ms", "calls", "params", "flops", "saved_bytes", "input_shapes"), depth=1),
    "summary_percent.txt": lambda p: p.layerwise_summary(
        columns=("time_percent", "forward_percent", "backward_percent", "forward_per_call_ms"), footer=True),
    "render_tree.txt": lambda p: p.render_tree(),
    "rows.txt": lambda p: str(p.rows()),
    "aggregate.txt": lambda p: str(p.aggregate()),
    "top.txt": lambda p: str(p.top(3, by="flops")),
    "table.md": lambda p: p.to_markdown(),
    "table.tex": lambda p: p.to_latex(caption="Costs", label="tab:costs"),
    "table.html": lambda p: p.to_html(),
    "table.csv": lambda p: p.to_csv(),
    "profile.json": lambda p: p.to_json(),
    "trace.json": lambda p: json.dumps(json.loads(p.to_trace()), indent=1, sort_keys=True),
    "timepool.json": lambda p: json.dumps(p.layerwise_timepool(), indent=1),
}


@pytest.mark.parametrize("name", sorted(RENDERINGS))
def test_rendering_matches_golden_file(name: str, request: pytest.FixtureRequest) -> None:
    text = RENDERINGS[name](fixed_profile())
    path = GOLDEN / name
    if request.config.getoption("--regenerate-golden"):
        GOLDEN.mkdir(exist_ok=True)
        path.write_text(text, encoding="utf-8")
    assert path.is_file(), f"{path} is missing: run pytest {__file__} --regenerate-golden once, and review it"
    assert text == path.read_text(encoding="utf-8")


def test_a_loaded_profile_renders_identically() -> None:
    from layerprof import loads

    profile = fixed_profile()
    again = loads(profile.to_json())
    for name, render in RENDERINGS.items():
        assert render(again) == render(profile), name
