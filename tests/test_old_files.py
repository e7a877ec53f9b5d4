"""Profiles saved by older layerprof versions, read by this one (tests/golden/old/, each named by the commit that
wrote it, with the old code on the path): every field reads as the old code showed it, or is refused clearly."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

import layerprof
from layerprof.cli import main

OLD = Path(__file__).parent / "golden" / "old"
FILES = sorted(OLD.glob("*.json"))


def rows_of(path: Path) -> dict[str, dict]:
    return {row["name"]: row for row in json.loads(path.read_text())["records"]}


@pytest.mark.parametrize("path", FILES, ids=lambda path: path.stem)
def test_old_file_reads_as_saved(path):
    saved = rows_of(path)
    now = layerprof.load(path).to_dict()
    assert list(now) == list(saved)
    for name, row in saved.items():
        for key in ("calls", "steps", "forward_ms", "backward_ms", "self_forward_ms", "params", "flops"):
            if key in row:
                assert now[name][key] == row[key], (name, key)


@pytest.mark.parametrize("path", FILES, ids=lambda path: path.stem)
def test_old_file_renders_and_gates_against_itself(path, capsys):
    profile = layerprof.load(path)
    assert profile.layerwise_summary().startswith("Step: forward ")
    assert profile.to_csv().count("\n") == len(rows_of(path)) + 1
    resaved = layerprof.loads(profile.to_json())
    assert resaved.to_dict() == profile.to_dict()
    assert main(["compare", str(path), str(path), "--fail-if-slower", "10"]) == 0
    assert "layerprof compare: ok" in "".join(capsys.readouterr())


@pytest.mark.parametrize("stem", ["6d11ffc-cnn_1step", "3d68ff1-cnn_1step", "3d68ff1-cnn_steps",
                                  "6d11ffc-cnn_steps"])
def test_steps_run_of_a_file_saved_before_it_existed(stem):
    # Rows written before steps_run have none; each module of these ran in every recorded step (1 or 4), which
    # read as 0, "ran in no step", in to_dict, the CSV and the DataFrame.
    path = OLD / f"{stem}.json"
    assert all("steps_run" not in row for row in rows_of(path).values())
    steps = 1 if "1step" in stem else 4
    now = layerprof.load(path).to_dict()
    assert {name: (row["steps"], row["steps_run"]) for name, row in now.items()} == {
        name: (steps, steps) for name in ("", "0", "1", "2", "3", "4")}
    assert layerprof.loads(layerprof.load(path).to_json()).to_dict() == now


def test_steps_run_of_an_old_module_never_called_is_0():
    doc = json.loads((OLD / "3d68ff1-cnn_steps.json").read_text())
    for row in doc["records"][1:]:
        if row["name"] == "3":
            row["calls"] = 0
            row["forward_ms"] = row["backward_ms"] = row["self_forward_ms"] = row["self_backward_ms"] = None
            row["call_times"] = []
    now = layerprof.loads(json.dumps(doc)).to_dict()
    assert [now[name]["steps_run"] for name in ("", "0", "1", "2", "3", "4")] == [4, 4, 4, 4, 0, 4]


def test_gather_of_old_per_rank_files(capsys):
    # Files saved before meta['distributed'] name no rank: the shell's refusal says how to give them (it showed only
    # the Python form, gather_saved({0: ...})), and given so they gather.
    a, b = str(OLD / "6d11ffc-cnn_steps.json"), str(OLD / "3d68ff1-cnn_steps.json")
    assert main(["gather", a, b]) == 2
    assert "layerprof gather 0=rank0.json 1=rank1.json" in capsys.readouterr().err
    assert main(["gather", f"0={a}", f"1={b}"]) == 0
    assert capsys.readouterr().out.startswith("Across 2 ranks")
