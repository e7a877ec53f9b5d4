"""The command line used as its users use it: inputs that do not fit the model's ``forward``, the help's names,
and the saved profile's roofs. Each test failed before its fix."""
from __future__ import annotations

import io
import json
import sys
import textwrap
from pathlib import Path

import pytest

from layerprof.cli import main
from tests.test_gate import make_profile, write

MODELS = textwrap.dedent('''
    import torch
    from torch import nn


    class Two(nn.Module):
        """Two positional inputs and an optional keyword one."""

        def __init__(self):
            super().__init__()
            self.a = nn.Linear(8, 4)
            self.b = nn.Linear(6, 4)

        def forward(self, x, y, scale=None):
            out = self.a(x) + self.b(y)
            return out if scale is None else out * scale.mean()


    class Hooked(nn.Module):
        """Takes ``x`` and ``y``, but a forward pre-hook supplies ``y``: only a call can tell what it takes."""

        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(4, 2)
            self.register_forward_pre_hook(lambda module, args: (args[0], args[0]))

        def forward(self, x, y):
            return self.fc(x + y)


    class Small(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(4, 2)

        def forward(self, x):
            return self.fc(x)
''')


@pytest.fixture()
def models(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    path = tmp_path / "sweep_models.py"
    path.write_text(MODELS)
    return path


def _error(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err
    return err.strip().splitlines()[-1]


# -- inputs that forward cannot take: a usage error before any step, not "the model raised" ----------------------
@pytest.mark.parametrize(("inputs", "why"), [
    (["2,8"], "(2x8): missing a required argument: 'y'"),
    (["2,8", "2,6", "3", "4"], "(2x8, 2x6, 3, 4): too many positional arguments"),
    (["2,8", "2,6", "bogus=3"], "(2x8, 2x6, bogus=3): got an unexpected keyword argument 'bogus'"),
    (["x=2,8", "2,6"], "(x=2x8, 2x6): multiple values for argument 'x'"),
])
def test_inputs_that_forward_cannot_take_are_a_usage_error(models: Path, capsys, inputs: list[str],
                                                           why: str) -> None:
    # Before: exit status 5, "the model raised TypeError: Two.forward() missing 1 required positional argument"
    # after the model was built and moved, its headline printed, a warm-up step begun.
    argv = ["sweep_models.py:Two", *(arg for text in inputs for arg in ("--input", text))]
    assert main(argv) == 2
    assert _error(capsys) == (
        f"layerprof: error: --input: Two.forward(x, y, scale=None) cannot take the inputs given {why}; give one "
        "--input per positional argument of forward, NAME=SHAPE for a keyword")


def test_inputs_that_forward_takes_run(models: Path, capsys) -> None:
    argv = ["sweep_models.py:Two", "-i", "2,8", "-i", "y=2,6", "-i", "scale=3", "--depth", "0", "--steps", "1"]
    assert main(argv) == 0
    assert "input 2x8, y=2x6, scale=3 |" in capsys.readouterr().out


def test_a_forward_pre_hook_may_supply_the_arguments(models: Path, capsys) -> None:
    # The signature asks for y, the hook supplies it: the check stands aside rather than refuse a model that runs.
    assert main(["sweep_models.py:Hooked", "--input", "2,4", "--depth", "0", "--steps", "1"]) == 0


def test_a_keyword_input_given_twice_is_refused_before_the_model_is_built(models: Path, capsys) -> None:
    # Before: the second y= silently replaced the first (the headline showed both), and the run failed on its
    # shape with exit status 5.
    argv = ["sweep_models.py:Small", "-i", "2,4", "-i", "y=2,6", "-i", "y=2,7"]
    assert main(argv) == 2
    out, err = capsys.readouterr()
    assert err == "layerprof: error: --input y= is given twice; give each keyword input once\n"
    assert out == ""  # refused before the model was built: no headline


# -- the help names every column --columns accepts ---------------------------------------------------------------
def test_help_lists_the_bound_column_and_the_statistics_over_steps(capsys) -> None:
    # Before: `--columns bound` and `--columns forward_ms_median` worked (docs/roofline.md and docs/steps.md use
    # them) but the help, which says "all names listed below", listed neither.
    with pytest.raises(SystemExit):
        main(["--help"])
    names = capsys.readouterr().out.split("\nnames ")[1]
    flops = names[names.index("    flops:"):names.index("    steps:")]
    assert flops.split()[-1] == "bound"
    steps = " ".join(names[names.index("    steps:"):names.index("  --plot-metric")].split())
    assert steps == ("steps: forward_ms_median, forward_ms_std, forward_ms_min, forward_ms_max, forward_ms_p95, "
                     "backward_ms_median, backward_ms_std, backward_ms_min, backward_ms_max, backward_ms_p95, "
                     "steps, steps_run")
    plot = " ".join(names[names.index("  --plot-metric"):].split())
    assert plot.endswith("lost_ms, bound, and none of the steps group")


def test_every_listed_statistic_is_a_column_of_the_summary(models: Path, capsys) -> None:
    argv = ["sweep_models.py:Small", "-i", "2,4", "--steps", "2", "--warmup", "0", "--depth", "0", "--columns",
            "forward_ms_median,backward_ms_p95,steps,steps_run"]
    assert main(argv) == 0
    root = capsys.readouterr().out.splitlines()[2]
    assert "Forward median: " in root and "Backward p95: " in root and "Steps: 2 | Steps Run: 2" in root


# -- a saved profile with FLOPs holds the roofs of the machine it ran on ------------------------------------------
def test_json_of_a_flops_profile_holds_the_peaks_it_was_measured_against(models: Path, capsys) -> None:
    # Before: the peaks were measured only when a roofline figure was read, so `--metrics flops --json` saved
    # none, and `layerprof show` on another machine held the modules against that machine's roofs (or none: a
    # CUDA profile read without a GPU).
    argv = ["sweep_models.py:Small", "-i", "2,4", "--steps", "1", "--metrics", "flops", "--json", "p.json",
            "--threads", "1"]
    assert main(argv) == 0
    peaks = json.loads(Path("p.json").read_text())["meta"]["peaks"]
    assert peaks["source"] == "measured" and peaks["device"] == "cpu" and peaks["threads"] == 1
    assert peaks["flops"] > 0 and peaks["bandwidth"] > 0


# -- --steps N gives N timed steps, whatever the meters ----------------------------------------------------------
@pytest.mark.parametrize("steps", [1, 2])
def test_steps_without_warmup_are_all_timed_with_a_meter_that_slows_a_step(models: Path, capsys, recwarn,
                                                                           steps: int) -> None:
    # The flops meter counts in the first profiled step, which the profile leaves out of its times. Before, with
    # --warmup 0 that was one of the --steps: `--steps 2` recorded 1 step under a headline saying 2, and
    # `--steps 1` recorded the counting step, its times slowed by the meter (a RuntimeWarning telling a shell
    # user to "call prof.step()").
    argv = ["sweep_models.py:Small", "-i", "2,4", "--warmup", "0", "--steps", str(steps), "--metrics", "flops",
            "--columns", "steps,flops", "--depth", "0"]
    assert main(argv) == 0
    headline, _, root = capsys.readouterr().out.splitlines()[:3]
    shown = "1 step" if steps == 1 else f"{steps} steps"
    assert headline.endswith(f"| 0 warm-up + 1 step counting flops + {shown}, forward + backward")
    # Linear(4, 2) on a 2x4 batch: 2*2*4*2 = 32 FLOPs forward, 32 for the weight's gradient (x needs none).
    assert root.startswith(f"Small【Steps: {steps} | FLOPs: 64 FLOPs (100.0%)】")
    assert not [w for w in recwarn if "only one step was profiled" in str(w.message)]


def test_a_warmup_step_counts_the_meters(models: Path, capsys) -> None:
    argv = ["sweep_models.py:Small", "-i", "2,4", "--warmup", "1", "--steps", "2", "--metrics", "flops",
            "--columns", "steps", "--depth", "0"]
    assert main(argv) == 0
    headline, _, root = capsys.readouterr().out.splitlines()[:3]
    assert headline.endswith("| 1 warm-up + 2 steps, forward + backward") and root.startswith("Small【Steps: 2】")


# -- a reader that leaves early (`layerprof ... | head`) -----------------------------------------------------------
class _ClosedPipe(io.StringIO):
    """stdout after `head` has read its lines and gone: every write raises, as a closed pipe's does."""

    def write(self, text: str) -> int:
        raise BrokenPipeError(32, "Broken pipe")


def test_a_closed_stdout_does_not_stop_the_run_or_its_files(models: Path, monkeypatch, capsys) -> None:
    # Before: `layerprof SPEC --json p.json | head -1` ended as "internal error: BrokenPipeError" (exit 70) when
    # the summary was printed, before any file was written.
    monkeypatch.setattr(sys, "stdout", _ClosedPipe())
    argv = ["sweep_models.py:Small", "-i", "2,4", "--steps", "1", "--json", "p.json"]
    assert main(argv) == 0
    assert capsys.readouterr().err == "layerprof: wrote p.json\n"
    assert json.loads(Path("p.json").read_text())["records"][0]["type"] == "Small"


def test_a_closed_stdout_leaves_the_gate_its_exit_status(tmp_path: Path, monkeypatch, capsys) -> None:
    # The comparison table is printed before the gate decides: a closed pipe must not turn a FAIL into exit 70.
    slow, fast = [2.0, 2.1, 2.2, 2.1, 2.0], [1.0, 1.1, 1.0, 1.2, 1.1]
    a = write(tmp_path, "a.json", make_profile({"": ("Net", fast, fast)}))
    b = write(tmp_path, "b.json", make_profile({"": ("Net", slow, slow)}))
    monkeypatch.setattr(sys, "stdout", _ClosedPipe())
    assert main(["compare", a, b, "--fail-if-slower", "10"]) == 1
    assert capsys.readouterr().err.startswith("layerprof compare: FAIL: B is slower")
