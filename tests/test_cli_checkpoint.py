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


def Wide():
    # A wide output, as a language model's logits: held through backward by the step, it is part of the peak.
    torch.manual_seed(0)
    blocks = [nn.Sequential(nn.Linear(64, 64), nn.GELU(), nn.Linear(64, 64), nn.Tanh()) for _ in range(3)]
    return nn.Sequential(nn.Linear(16, 64), *blocks, nn.Linear(64, 2048))


def Normed():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 64), nn.BatchNorm1d(64), nn.Tanh(), nn.Linear(64, 64), nn.BatchNorm1d(64))
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
    assert not any(line.startswith("step peak") for line in lines)  # on the CPU with live_memory only (below)
    assert plot.read_bytes()[:4] == b"\x89PNG"


def test_live_memory_predicts_and_measures_the_step_peak(spec: str, capsys) -> None:
    argv = [spec, "-i", "32,16", "--steps", "2", "--depth", "1", "--checkpoint-budget", "50%", "--metrics", "live_memory"]
    assert main(argv) == 0
    lines = capsys.readouterr().out.splitlines()
    assert any(line.startswith("step peak: ") and " predicted (" in line for line in lines)
    assert lines[-1].startswith("step peak (live tensor bytes): ") and " predicted (" in lines[-1]


def test_the_step_verified_is_the_step_profiled(spec: str, capsys) -> None:
    # The verification ran ``loss_of(model(x)).backward()``, which lets go of the output before backward, while the
    # profiled steps hold it through backward: the exact prediction read as the output's bytes off (-16 % on a
    # small GPT-2's logits). Both now run the command's one training step (``run.training_step``).
    argv = [spec.replace(":Net", ":Wide"), "-i", "32,16", "--steps", "2", "--depth", "0", "--checkpoint-budget",
            "50%", "--metrics", "live_memory"]
    assert main(argv) == 0
    last = capsys.readouterr().out.splitlines()[-1]
    assert last.startswith("step peak (live tensor bytes): ") and " predicted (+0.0% off)" in last, last


def test_a_peak_budget_is_planned_on_live_bytes_and_verified(spec: str, capsys) -> None:
    # At batch 32 the parameters' gradients hold the step's peak and no plan lowers it; at 1024 the activations do.
    argv = [spec, "-i", "1024,16", "--steps", "2", "--depth", "0", "--checkpoint-peak", "80%"]
    assert main(argv) == 0
    captured = capsys.readouterr()
    assert "--checkpoint-peak profiles with --metrics live_memory" in captured.err  # turned on, and said so
    lines = captured.out.splitlines()
    header = next(line for line in lines if line.startswith("Checkpoint plan for Sequential:"))
    assert ", peak budget " in header and " budget met" not in header
    assert any(line.startswith("step peak: ") and "within the peak budget of" in line for line in lines)
    verified = next(line for line in lines if line.startswith("verified:"))
    assert "budget" not in verified  # a peak budget is met or not on the peak's line
    assert lines[-1].startswith("step peak (live tensor bytes): ") and lines[-1].endswith(" met")
    assert " predicted (" in lines[-1] and "NOT" not in lines[-1]


@pytest.mark.parametrize("extra, words", [
    (["--checkpoint-budget", "lots"], "--checkpoint-budget: cannot read budget 'lots'"),
    (["--checkpoint-peak", "lots"], "--checkpoint-peak: cannot read peak 'lots'"),
    (["--checkpoint-peak", "50%", "--checkpoint-budget", "50%"], "--checkpoint-budget and --checkpoint-peak: give one"),
    (["--checkpoint-peak", "50%", "--no-backward"], "--checkpoint-peak plans a training step"),
    (["--checkpoint-budget", "50%", "--eval"], "plans a training step: drop --eval"),
    (["--plot", "x.png", "--plot-kind", "checkpoint"], "--plot-kind checkpoint draws the plans for a budget"),
    (["--allow-side-effects"], "--allow-side-effects is for a checkpoint plan: add --checkpoint-budget"),
])
def test_bad_options_fail_before_the_model_is_built(spec: str, extra: list[str], words: str, capsys) -> None:
    assert main([spec, "-i", "32,16", *extra]) == 2
    assert words in capsys.readouterr().err


def test_side_effects_are_allowed_by_a_flag(spec: str, capsys) -> None:
    # Every module holding a BatchNorm is excluded by default, and 25 % is then out of reach; the note says what
    # allowing them reaches (wrapping the whole model keeps only its input, 32 x 16 x 4 B = 2 KiB), and the flag
    # does it.
    argv = [spec.replace(":Net", ":Normed"), "-i", "32,16", "--steps", "1", "--warmup", "0", "--depth", "0",
            "--checkpoint-budget", "25%"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "0 modules wrapped" in out and "with allow_side_effects=True (3 modules excluded" in out
    assert "(--allow-side-effects lets the plan recompute them)" in out and "verified:" not in out
    assert main([*argv, "--allow-side-effects"]) == 0
    out = capsys.readouterr().out
    assert "allow_side_effects" not in out and "verified:" in out and "budget met" in out
