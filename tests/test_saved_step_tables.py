"""A saved profile keeps the step's storage tables and memory timeline (``layerprof.record.step_tables``): loaded, it
plans checkpoints as the live profile did, by saved bytes and by the step's peak, and the plan holds as measured on
the model; damaged tables are refused whole, naming the part; ``layerprof show`` plans a saved profile by its peak.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from layerprof import loads
from layerprof.cli.command import main
from layerprof.record.step_tables import STORAGES_ATTRIBUTE, TIMELINE_ATTRIBUTE

from .test_peak_prediction import TOLERANCE, _live_peak, _zoo, profiled_model

WRAP = (0.25, 0.02)  # a given wrapper price: the plans compared do not hang on a measurement


def _same_plan(a, b) -> None:
    assert a.to_dict() == b.to_dict()
    assert (a.modules, a.saved_bytes_after, a.predicted_peak_bytes, a.plans_weighed) == \
           (b.modules, b.saved_bytes_after, b.predicted_peak_bytes, b.plans_weighed)


@pytest.fixture(scope="module")
def gpt2():
    return profiled_model(_zoo("gpt2", "tiny"))


def test_a_loaded_profile_plans_as_the_live_one_and_the_plan_holds(gpt2) -> None:
    model, step, profile, profiled = gpt2
    loaded = loads(profile.to_json())
    tree = profile.tree.__dict__
    assert loaded.tree.__dict__[STORAGES_ATTRIBUTE] == tree[STORAGES_ATTRIBUTE]
    assert loaded.tree.__dict__[TIMELINE_ATTRIBUTE] == tree[TIMELINE_ATTRIBUTE]
    for kwargs in ({"budget": "50%"}, {"budget": 0.25, "runs": False}, {"peak": "75%"}, {"peak": 0.6}):
        live, saved = profile.checkpoint_plan(wrap_cost=WRAP, **kwargs), loaded.checkpoint_plan(wrap_cost=WRAP, **kwargs)
        _same_plan(live, saved)
    # The loaded profile's peak plan, applied to the model: the step's peak as predicted (live tensor bytes).
    plan = loaded.checkpoint_plan(peak="75%", wrap_cost=WRAP)
    assert plan.feasible and plan.modules and plan.profiled_peak_bytes == profiled
    with plan.applied(model):
        measured = _live_peak(step)
    assert measured <= plan.peak_budget_bytes
    assert abs(measured - plan.predicted_peak_bytes) <= TOLERANCE * measured, plan.modules
    # Saved again, the same document.
    assert json.loads(loaded.to_json())["step_tables"] == json.loads(profile.to_json())["step_tables"]


def test_a_file_without_the_tables_plans_by_saved_bytes_only(gpt2) -> None:
    _, _, profile, _ = gpt2
    doc = json.loads(profile.to_json())
    del doc["step_tables"]  # as layerprof wrote files before it saved them
    old = loads(json.dumps(doc))
    assert old.checkpoint_plan("50%", wrap_cost=WRAP).modules  # the additive figure, modules only
    with pytest.raises(ValueError, match="no storage table .* one saved by an older layerprof has none"):
        old.checkpoint_plan(peak="75%", wrap_cost=WRAP)


def _damaged(profile, change) -> str:
    doc = json.loads(profile.to_json())
    change(doc["step_tables"])
    return json.dumps(doc)


def _set(path: tuple, value):
    def change(tables):
        found = tables
        for key in path[:-1]:
            found = found[key]
        found[path[-1]] = value
    return change


@pytest.mark.parametrize("change, message", [
    (_set(("storages",), []), "'step_tables' must be an object with a non-empty list 'storages'"),
    (_set(("storages", 0, "names", 1), "no.such.module"), r"'step_tables.storages\[0\].names' must list modules"),
    (_set(("storages", 0, "parents", 0), 3), r"'step_tables.storages\[0\].parents' must give each call's parent"),
    (_set(("storages", 0, "sizes", 0), -8), r"'step_tables.storages\[0\].sizes' must be a list of integers from 0"),
    (_set(("storages", 0, "savers", 0), [10 ** 6]),
     r"'step_tables.storages\[0\].savers\[0\]' must be a list of integers from 0 to \d+"),
    (_set(("storages", 0, "inputs"), []), r"'step_tables.storages\[0\].inputs' must be a list per storage"),
    (_set(("storages", 0, "bounds", 0), [1, 2, 3]), r"'step_tables.storages\[0\].bounds\[0\]' must hold four marks"),
    (_set(("storages", 0, "bounds", 0), [1, 2, 3, 10 ** 9]),
     r"'step_tables.storages\[0\].bounds\[0\]' must be a list of integers from 0 to \d+"),
    (_set(("storages", 0, "bounds"), None), r"'step_tables.storages\[0\].bounds' must hold four marks per call"),
    (_set(("storages", 0, "sizes", 0), 2 ** 63), r"'step_tables.storages\[0\].sizes' must be a list of integers from 0"),
    (_set(("timeline", "levels", 0), 2 ** 64), r"'step_tables.timeline.levels' must be a list of integers from 0"),
    (_set(("timeline", "peaks"), [0]), r"'step_tables.timeline': 1 peaks for \d+ levels"),
    (_set(("timeline", "device"), None), "'step_tables.timeline' must be an object with a 'device' string"),
])
def test_damaged_tables_are_refused_naming_the_part(gpt2, change, message) -> None:
    _, _, profile, _ = gpt2
    with pytest.raises(ValueError, match="cannot load the profile text: " + message):
        loads(_damaged(profile, change))


def test_show_plans_a_saved_profile_by_its_peak(gpt2, tmp_path: Path, capsys) -> None:
    _, _, profile, _ = gpt2
    path = tmp_path / "gpt2.json"
    profile.to_json(path)
    assert main(["show", str(path), "--depth", "0", "--checkpoint-peak", "75%"]) == 0
    out = capsys.readouterr().out
    # The plan printed is the loaded file's (the wrapper price measured once a process: the same here).
    plan = loads(path.read_text()).checkpoint_plan(peak="75%")
    assert plan.feasible and plan.modules and str(plan) in out
    assert f"step peak: " in out and "within the peak budget" in out
    # A profile saved without the live reader has no timeline to predict a peak from: a usage error that says what
    # to record.
    doc = json.loads(profile.to_json())
    del doc["step_tables"]["timeline"]
    path.write_text(json.dumps(doc))
    assert main(["show", str(path), "--checkpoint-peak", "75%"]) == 2
    err = capsys.readouterr().err
    assert "--checkpoint-peak: ValueError: peak: checkpoint_plan(peak=...) needs the step's memory" in err
    assert "layerprof SPEC --metrics live_memory --json PATH" in err
