"""Rendering and export sweep: what a profile's outputs show where a user's run is unusual (a module skipped in
the last step, a shared module, ...). Each test is one bug found by the sweep."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch
from torch import nn

import layerprof
from layerprof.cli import main


class _Aux(nn.Module):
    """A body run every step and an auxiliary head run only in some steps."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(8, 8), nn.ReLU())
        self.aux = nn.Linear(8, 1)

    def forward(self, x: torch.Tensor, with_aux: bool) -> torch.Tensor:
        h = self.body(x)
        return h.sum() + (self.aux(h).sum() if with_aux else 0)


def test_trace_holds_only_the_last_steps_calls_when_a_module_skipped_it() -> None:
    # Before: `aux` ran in step 0 only, and its record kept step 0's call as its `call_times` ("every call of the
    # module in the last recorded step"), so the trace and speedscope drew it 1 step early, outside every slice
    # of its parent (whose step-0 slice is not in the trace), and speedscope's timeline spanned two steps.
    torch.manual_seed(0)
    net = _Aux()
    x = torch.randn(4, 8)
    with layerprof.LayerProf(net) as prof:
        for step in range(2):
            net(x, with_aux=step == 0).backward()
            prof.step()
    assert prof.records["aux"].steps_run == 1
    assert prof.records["aux"].call_times == []
    events = [e for e in json.loads(prof.to_trace())["traceEvents"] if e["ph"] == "X"]
    assert {e["args"]["step"] for e in events} == {1}
    assert "aux" not in {e["args"]["module"] for e in events}
    frames = [frame["name"] for frame in json.loads(prof.to_speedscope())["shared"]["frames"]]
    timelines = json.loads(prof.to_speedscope())["profiles"][:2]
    opened = {frames[event["frame"]] for timeline in timelines for event in timeline["events"]}
    assert not any(name.startswith("aux") for name in opened)


@pytest.mark.parametrize("mode", ["--no-backward", "--eval"])
@pytest.mark.parametrize("metric", ["backward", "flops_backward"])
def test_a_backward_plot_metric_of_a_forward_only_run_is_refused_before_the_model_is_built(
        mode: str, metric: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # Before: the model was built and profiled, then writing the plot raised ("no record of this profile holds
    # the field 'backward_ms'", exit 5) and every other output of the run (--json here) was lost with it.
    factory = tmp_path / "models.py"
    factory.write_text("def broken():\n    raise AssertionError('built: options must be checked first')\n")
    argv = [f"{factory}:broken", "-i", "2,8", mode, "--plot", str(tmp_path / "p.png"), "--plot-metric", metric,
            "--json", str(tmp_path / "p.json")]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert f"--plot-metric {metric}" in err and mode in err and "Traceback" not in err
    assert sorted(p.name for p in tmp_path.iterdir() if p.suffix != ".py") == []


class _Wrap(nn.Module):
    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.m = inner

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.m(x)


def test_a_module_whose_only_child_is_shared_lists_it_on_its_own_line() -> None:
    # Before: `b`, whose only submodule is the Linear that `a` holds too, printed the alias inside its own
    # parentheses, "(b): Wrap【...】((m): Linear【same module as 'a.m', counted there】())", unlike torch's repr.
    shared = nn.Linear(4, 4)
    net = nn.Sequential()
    net.add_module("a", _Wrap(shared))
    net.add_module("b", _Wrap(shared))
    with layerprof.LayerProf(net) as prof:
        net(torch.randn(2, 4)).sum().backward()
    for columns in (None, ()):
        lines = prof.layerwise_summary(columns=columns).split("\n")
        b = next(i for i, line in enumerate(lines) if line.startswith("  (b): _Wrap"))
        assert lines[b].endswith("("), lines[b]
        assert lines[b + 1].startswith("    (m): Linear") and "same module as 'a.m'" in lines[b + 1]
        assert lines[b + 2] == "  )"


@pytest.mark.filterwarnings("ignore:only one step was profiled")
def test_plotting_backward_flops_of_a_forward_only_profile_says_it_has_no_backward() -> None:
    # Before: "no record of this profile holds the field 'flops_backward'; run with LayerProf(model,
    # metrics=('flops',))", for a profile recorded with that very meter: its step had no backward pass.
    net = nn.Sequential(nn.Linear(4, 4), nn.ReLU())
    with layerprof.LayerProf(net, metrics=("flops",)) as prof:
        with torch.no_grad():
            net(torch.randn(2, 4))
    with pytest.raises(ValueError) as info:
        prof.plot("sunburst", metric="flops_backward")
    assert "metrics=('flops',)" not in str(info.value) and "no backward pass" in str(info.value)


@pytest.mark.parametrize("metric, field", [("memory", "saved_bytes"), ("saved_bytes", "saved_bytes")])
def test_a_saved_bytes_plot_of_an_eval_run_is_refused_before_the_model_is_built(
        metric: str, field: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # Before: the model was built and profiled under inference_mode, which saves nothing for backward, then writing
    # the plot raised ("nothing to plot: the model's saved_bytes (Saved) is 0", exit 5), losing --json with it.
    factory = tmp_path / "models.py"
    factory.write_text("def broken():\n    raise AssertionError('built: options must be checked first')\n")
    argv = [f"{factory}:broken", "-i", "2,8", "--eval", "--metrics", "memory", "--plot", str(tmp_path / "p.png"),
            "--plot-metric", metric, "--json", str(tmp_path / "p.json")]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert f"--plot-metric {metric}: a run with --eval" in err and "saves nothing for backward" in err
    assert f"so {field} is 0 on every module" in err
    assert "plot activation_bytes" in err and "Traceback" not in err
    assert sorted(p.name for p in tmp_path.iterdir() if p.suffix != ".py") == []


def test_a_saved_bytes_plot_of_a_run_without_backward_is_drawn(tmp_path: Path) -> None:
    # --no-backward keeps gradients on: autograd saves for a backward that never runs, and the meter counts it.
    factory = tmp_path / "models.py"
    factory.write_text("from torch import nn\n\n\ndef net():\n    return nn.Sequential(nn.Linear(8, 8), nn.ReLU())\n")
    argv = [f"{factory}:net", "-i", "2,8", "--no-backward", "--metrics", "memory", "--steps", "1", "--warmup", "0",
            "--plot", str(tmp_path / "p.png"), "--plot-metric", "saved_bytes"]
    assert main(argv) == 0 and (tmp_path / "p.png").stat().st_size > 0


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CUDA fields are read on a GPU")
@pytest.mark.filterwarnings("ignore:only one step was profiled")
def test_a_cuda_memory_figure_of_a_cpu_profile_says_it_needs_a_gpu_not_the_meter_that_ran() -> None:
    # Before: "no record of this profile holds the field 'cuda_forward_peak_bytes'; run with LayerProf(model,
    # metrics=('memory',))", for a profile recorded with that very meter: the CUDA figures are read on a GPU only.
    net = nn.Sequential(nn.Linear(4, 4), nn.ReLU())
    with layerprof.LayerProf(net, metrics=("memory",)) as prof:
        net(torch.randn(2, 4)).sum().backward()
    hint = "it is read from the CUDA allocator: run the model on a GPU with LayerProf(model, metrics=('memory',))"
    with pytest.raises(ValueError, match=re.escape(f"'cuda_forward_peak_bytes'; {hint}")):
        prof.plot("top", metric="cuda_forward_peak_bytes")
    with pytest.raises(ValueError, match=re.escape(f"so its columns would be empty; {hint}")):
        layerprof.compare(prof, prof, names=("x", "y"), module_fields=["cuda_backward_delta_bytes"])
    with pytest.raises(ValueError, match=re.escape("run with LayerProf(model, metrics=('fsdp_comm',)) on a model "
                                                   "whose units are sharded with torch.distributed.fsdp.fully_shard")):
        prof.plot("top", metric="comm_forward")
    with pytest.raises(ValueError, match=re.escape("it is measured on a GPU, where CUDA events time the forward")):
        layerprof.compare(prof, prof, names=("x", "y"), module_fields=["host_forward_ms"])
