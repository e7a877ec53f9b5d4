"""The scripts in examples/ run as their docstrings say, and write only where they are told to."""
from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
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


# -- distributed_train ----------------------------------------------------------------------------------------------
def test_distributed_train_starts_its_own_two_ranks_without_torchrun(tmp_path: Path) -> None:
    if not torch.distributed.is_available() or not torch.distributed.is_gloo_available():
        pytest.skip("needs torch.distributed with gloo")
    environment = {key: value for key, value in os.environ.items()
                   if key not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")}
    environment["PYTHONPATH"] = os.pathsep.join([str(ROOT), environment.get("PYTHONPATH", "")])
    # Plain python, as a reader would start it: it spawns 2 gloo processes on a free port (no torchrun).
    result = subprocess.run([sys.executable, str(EXAMPLES / "distributed_train.py"), "--steps", "4", "--slow", "1"],
                            cwd=tmp_path, env=environment, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    out = result.stdout
    assert out.count("Across 2 ranks, per step") == 1  # printed by rank 0 only
    assert "Step (DistributedDataParallel)" in out and "DDP gradient all-reduce" in out
    (slowdown,) = [line.split() for line in out.splitlines() if " Slowdown " in line]
    # rank 1 sleeps 20 ms in module 2.1 each step, rank 0 not at all: it is the slowest, and a straggler
    assert slowdown[-2:] == ["1", "1"]
    assert list(tmp_path.iterdir()) == []  # nothing written
