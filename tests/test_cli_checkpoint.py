"""``layerprof SPEC --checkpoint-budget``: the plan printed and verified; the frontier plotted; bad input."""
from __future__ import annotations

from pathlib import Path

import pytest

from layerprof.cli.command import main

MODEL = '''
import torch
from torch import nn


def Net():
    torch.manual_seed(0)
    blocks = [nn.Sequential(nn.Linear(64, 64), nn.GELU(), nn.Linear(64, 64), nn.Tanh()) for _ in range(3)]
    return nn.Sequential(nn.Linear(16, 64), *blocks, nn.Linear(64, 1))
'''


@pytest.fixture
def spec(tmp_path: Path) -> str:
    path = tmp_path / "ckpt_models.py"
    path.write_text(MODEL)
    return f"{path}:Net"


def test_plan_is_printed_verified_and_plotted(spec: str, tmp_path: Path, capsys) -> None:
    plot = tmp_path / "frontier.png"
    argv = [spec, "-i", "32,16", "--steps", "1", "--warmup", "0", "--depth", "1", "--checkpoint-budget", "50%",
            "--plot", str(plot), "--plot-kind", "checkpoint"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "Checkpoint plan for Sequential: saved for backward" in out
    verified = next(line for line in out.splitlines() if line.startswith("verified:"))
    # The meter's figures add up exactly on this model: measured = predicted.
    assert "(+0.0%), budget met" in verified
    # Below it, each wrapped module or run (the plan's lines) with its recomputation measured against predicted.
    lines = out.splitlines()
    start, end = lines.index(next(line for line in lines if line.startswith("Checkpoint plan"))), lines.index(verified)
    wrapped = [line.split()[0] for line in lines[start + 1:end] if line.startswith("  ") and "excluded" not in line]
    timed = lines[end + 2:end + 2 + len(wrapped)]
    assert lines[end + 1] == "  recomputed per step, measured against predicted:" and wrapped
    assert [line.split()[0] for line in timed] == wrapped and all(" against " in line for line in timed)
    assert plot.read_bytes()[:4] == b"\x89PNG"


@pytest.mark.parametrize("extra, words", [
    (["--checkpoint-budget", "lots"], "--checkpoint-budget: cannot read budget 'lots'"),
    (["--checkpoint-budget", "50%", "--eval"], "plans a training step: drop --eval"),
    (["--plot", "x.png", "--plot-kind", "checkpoint"], "--plot-kind checkpoint draws the plans for a budget"),
])
def test_bad_options_fail_before_the_model_is_built(spec: str, extra: list[str], words: str, capsys) -> None:
    assert main([spec, "-i", "32,16", *extra]) == 2
    assert words in capsys.readouterr().err
