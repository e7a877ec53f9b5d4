"""The scripts in examples/ run as their docstrings say, and write only where they are told to."""
from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import matplotlib
import pytest
import torch
from torch import nn

import layerprof

matplotlib.use("Agg")

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"


def _example(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"example_{name}", EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# -- make_figures ---------------------------------------------------------------------------------------------------
def test_make_figures_writes_outside_the_repository_unless_told() -> None:
    make_figures = _example("make_figures")
    default = make_figures.parse_args([]).out
    try:
        assert default.is_dir() and not list(default.iterdir())  # a new, empty folder
        assert ROOT not in default.resolve().parents  # the tracked figures/ are left alone
    finally:
        default.rmdir()
    assert make_figures.parse_args(["--out", "figures"]).out == Path("figures")  # refreshing them is asked for
    assert "--out figures" in make_figures.__doc__


def test_make_figures_draws_four_pngs_into_the_folder_given(tmp_path: Path) -> None:
    make_figures = _example("make_figures")
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 2))
    with layerprof.LayerProf(model) as prof:
        model(torch.randn(4, 8)).sum().backward()
    before = {path: path.stat().st_mtime_ns for path in (ROOT / "figures").glob("*.png")}
    paths = make_figures.write_figures(prof.profile, "tiny", tmp_path / "out")
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == sorted(
        f"tiny_{kind}.png" for kind in ("sunburst", "icicle", "top", "top_types"))
    assert all(path.read_bytes()[:4] == b"\x89PNG" for path in paths)
    assert {path: path.stat().st_mtime_ns for path in (ROOT / "figures").glob("*.png")} == before
