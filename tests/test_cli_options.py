"""Every option of every subcommand of ``layerprof``, run end to end through ``main(argv)`` with its effect checked.

The options are read from the parsers themselves: an option added without a case here fails
``test_every_option_has_an_end_to_end_test``.
"""
from __future__ import annotations

import json
import re
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import matplotlib
import pytest
import torch

import layerprof
from layerprof.cli import main
from layerprof.cli.parser import build_parser
from layerprof.cli.saved import _compare_parser, _show_parser
from tests.test_gate import make_profile

MODELS = textwrap.dedent('''
    import torch
    from torch import nn


    class Tagged(nn.Module):
        """Two layers; the repr shows the head's first weight, so the seed shows in the summary."""

        def __init__(self, width=8):
            super().__init__()
            self.body = nn.Sequential(nn.Linear(width, 4), nn.ReLU())
            self.head = nn.Linear(4, 2)

        def extra_repr(self):
            return f"w00={self.head.weight[0, 0].item():.6f}"

        def forward(self, x):
            if not self.training:
                assert torch.is_inference_mode_enabled(), "--eval must run under inference_mode"
            return self.head(self.body(x))


    class Explicit(nn.Module):
        """A layer and a buffer made in float32 whatever the default dtype."""

        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(8, 8, dtype=torch.float32)
            self.register_buffer("scale", torch.ones(8, dtype=torch.float32))

        def forward(self, x):
            return self.lin(x) * self.scale


    class Normed(nn.Module):
        """A BatchNorm between two Linears: in training, recomputing it would move its running statistics again."""

        def __init__(self):
            super().__init__()
            self.body = nn.Sequential(nn.Linear(8, 4), nn.BatchNorm1d(4), nn.Tanh())
            self.head = nn.Linear(4, 2)

        def forward(self, x):
            return self.head(self.body(x))


    class Tokens(nn.Module):
        """Token ids (positional, int64, below 7) and a boolean mask (keyword)."""

        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(100, 4)
            self.fc = nn.Linear(4, 2)

        def forward(self, ids, mask=None):
            assert ids.dtype == torch.int64, ids.dtype
            assert int(ids.max()) < 7, "an id >= 7"
            assert mask is not None and mask.dtype == torch.bool, "no boolean mask"
            return self.fc(self.embed(ids) * mask[..., None])


    class Broken(nn.Module):
        def forward(self, x):
            raise ValueError("boom")
''')

PARSERS = {"layerprof": build_parser("layerprof"), "show": _show_parser("layerprof"),
           "compare": _compare_parser("layerprof")}


def declared_options() -> set[tuple[str, str]]:
    """(subcommand, longest spelling) of every option the three parsers accept."""
    return {(command, max(action.option_strings, key=len)) for command, parser in PARSERS.items()
            for action in parser._actions if action.option_strings}


@dataclass
class Context:
    tmp: Path
    models: Path
    saved: Path
    capsys: pytest.CaptureFixture[str]
    monkeypatch: pytest.MonkeyPatch

    def run(self, *argv: str, model: str = "Tagged", shape: str = "2,8") -> tuple[int, str, str]:
        """``layerprof MODELS:model -i shape`` (1 step, no warm-up) with ``argv`` after it."""
        return self.main(f"{self.models}:{model}", "-i", shape, "--warmup", "0", "--steps", "1", *argv)

    def main(self, *argv: str) -> tuple[int, str, str]:
        self.capsys.readouterr()
        status = main(list(argv))
        captured = self.capsys.readouterr()
        return status, captured.out, captured.err

    def path(self, name: str) -> str:
        return str(self.tmp / name)

    def json_of(self, *argv: str) -> dict:
        status, _, err = self.run(*argv, "--json", self.path("p.json"))
        assert status == 0, err
        return json.loads((self.tmp / "p.json").read_text())

    def exits(self, *argv: str) -> str:
        """Run ``argv`` (help, version): argparse exits 0; what it printed."""
        self.capsys.readouterr()
        with pytest.raises(SystemExit) as info:
            main(list(argv))
        assert info.value.code == 0
        return self.capsys.readouterr().out


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    folder = tmp_path_factory.mktemp("options")
    models = folder / "models.py"
    models.write_text(MODELS)
    saved = folder / "saved.json"
    assert main([f"{models}:Tagged", "-i", "2,8", "--warmup", "0", "--steps", "2", "--metrics", "params,flops",
                 "--json", str(saved)]) == 0
    return models, saved


@pytest.fixture
def ctx(files: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> Context:
    monkeypatch.setitem(matplotlib.rcParams, "svg.fonttype", "none")  # SVG text stays text: titles can be read
    return Context(tmp_path, files[0], files[1], capsys, monkeypatch)


# -- layerprof SPEC ----------------------------------------------------------------------------------------------
def spec_kwargs(ctx: Context) -> None:
    status, out, _ = ctx.run("--kwargs", '{"width": 6}', shape="2,6")
    assert status == 0 and "in_features=6, out_features=4" in out


def spec_input(ctx: Context) -> None:
    status, out, err = ctx.main(f"{ctx.models}:Tokens", "--input", "2,8:int64", "-i", "mask=2,8:bool",
                                "--vocab", "7", "--steps", "1")
    assert status == 0, err
    assert "input 2x8 int64, mask=2x8 bool" in out.splitlines()[0]


def spec_vocab(ctx: Context) -> None:
    argv = (f"{ctx.models}:Tokens", "-i", "2,8:int64", "-i", "mask=2,8:bool", "--steps", "1")
    assert ctx.main(*argv, "--vocab", "7")[0] == 0
    status, _, err = ctx.main(*argv)  # ids drawn from [0, 100): 16 of them all below 7 has odds 0.07^16
    assert status == 5 and "an id >= 7" in err


def spec_warmup(ctx: Context) -> None:
    assert ctx.json_of("--warmup", "2")["meta"]["warmup"] == 2


def spec_steps(ctx: Context) -> None:
    meta = ctx.json_of("--steps", "3")["meta"]
    assert meta["steps"] == 3 and len(meta["step_ms"]["forward"]) == len(meta["step_ms"]["backward"]) == 3


def spec_no_backward(ctx: Context) -> None:
    root = ctx.json_of("--no-backward")["records"][0]
    assert root["forward_ms"] > 0 and root["backward_ms"] is None
    assert "forward only" in ctx.run("--no-backward")[1].splitlines()[0]


def spec_eval(ctx: Context) -> None:
    root = ctx.json_of("--eval")["records"][0]  # Tagged asserts inference_mode when not training
    assert root["forward_ms"] > 0 and root["backward_ms"] is None
    assert "inference (eval)" in ctx.run("--eval")[1].splitlines()[0]


def spec_device(ctx: Context) -> None:
    status, out, _ = ctx.run("--device", "cpu")
    assert status == 0 and "| cpu, float32 |" in out.splitlines()[0]
    if not torch.cuda.is_available():
        status, _, err = ctx.run("--device", "cuda")
        assert status == 2 and "CUDA is not available here" in err


def spec_fake(ctx: Context) -> None:
    # Normed on fake tensors: one step counted, nothing timed. body.0: x [2, 8] @ w [8, 4] = 2 * 2 * 8 * 4 FLOPs.
    path = ctx.path("fake.json")
    status, out, err = ctx.main(f"{ctx.models}:Normed", "-i", "2,8", "--fake", "--metrics", "flops", "--json", path)
    assert status == 0, err
    assert "1 step counted, not timed (fake tensors)" in out.splitlines()[0]
    assert out.splitlines()[1].startswith("No times: the step ran on fake tensors")
    doc = json.loads(Path(path).read_text())
    assert doc["meta"]["untimed"] == "fake" and doc["meta"]["steps"] == 1 and "step_ms" not in doc["meta"]
    body = next(row for row in doc["records"] if row["name"] == "body.0")
    assert body["flops_forward"] == 2 * 2 * 8 * 4 and body["forward_ms"] is None and body["call_times"] == []
    status, _, err = ctx.run("--fake", "--device", "meta")
    assert status == 2 and "--fake with --device meta" in err
    # Without --metrics a counting run counts FLOPs, parameters and saved bytes (timing alone would show none).
    status, out, err = ctx.main(f"{ctx.models}:Normed", "-i", "2,8", "--fake", "--json", path)
    assert status == 0, err
    doc = json.loads(Path(path).read_text())
    body = next(row for row in doc["records"] if row["name"] == "body.0")
    assert body["flops_forward"] == 2 * 2 * 8 * 4 and body["params"] == 8 * 4 + 4 and body["saved_bytes"] == 2 * 8 * 4
    assert "FLOPs:" in out and "Params:" in out and "Saved:" in out
    # --dtype casts what the model made in an explicit dtype too, as Module.to does off fake tensors: 72 parameters
    # (8 * 8 + 8) in bfloat16 are 144 bytes, and the float32 buffer is cast (the step's output would say if not).
    status, out, err = ctx.main(f"{ctx.models}:Explicit", "-i", "2,8", "--fake", "--dtype", "bfloat16", "--json", path)
    assert status == 0, err
    doc = json.loads(Path(path).read_text())
    root = next(row for row in doc["records"] if row["name"] == "")
    assert root["param_bytes"] == 72 * 2 and root["buffer_bytes"] == 8 * 2


def spec_dtype(ctx: Context) -> None:
    doc = ctx.json_of("--dtype", "bfloat16")
    assert doc["meta"]["environment"]["dtype"] == doc["meta"]["environment"]["input_dtype"] == "bfloat16"


def spec_autocast(ctx: Context) -> None:
    doc = ctx.json_of("--autocast", "bfloat16", "--metrics", "shapes")
    environment = doc["meta"]["environment"]
    assert (environment["dtype"], environment["autocast_dtype"]) == ("float32", "bfloat16")
    rows = {row["name"]: row for row in doc["records"]}
    assert rows["body.0"]["input_dtypes"] == ["float32"] and rows["body.0"]["output_dtypes"] == ["bfloat16"]


def spec_threads(ctx: Context) -> None:
    before = torch.get_num_threads()
    try:
        assert ctx.json_of("--threads", "1")["meta"]["environment"]["threads"] == 1
    finally:
        torch.set_num_threads(before)


def _weight(out: str) -> str:
    return re.search(r"w00=(-?[0-9.]+)", out).group(1)


def spec_seed(ctx: Context) -> None:
    first, again, other = (_weight(ctx.run("--seed", seed)[1]) for seed in ("3", "3", "4"))
    assert first == again != other


def spec_metrics(ctx: Context) -> None:
    root = ctx.json_of("--metrics", "flops,params", "--steps", "2")["records"][0]
    # 2 FLOPs per multiply-add: 2 x (2 x 8 x 4) + 2 x (2 x 4 x 2) = 128 + 32
    assert root["flops_forward"] == 160
    assert root["params"] == 8 * 4 + 4 + 4 * 2 + 2


def spec_sync(ctx: Context) -> None:
    seen = []

    class Recording(layerprof.LayerProf):
        def __init__(self, *args, **kwargs) -> None:
            seen.append(kwargs["sync"])
            super().__init__(*args, **kwargs)

    ctx.monkeypatch.setattr("layerprof.cli.run.LayerProf", Recording)
    assert ctx.run("--sync")[0] == 0 and ctx.run()[0] == 0
    assert seen == [True, False]


def spec_depth(ctx: Context) -> None:
    assert "... 2 children" in ctx.run("--depth", "0")[1]
    assert "(0): Linear【" in ctx.run("--depth", "all")[1]  # body's first layer, at depth 2
    assert "(0): Linear【" not in ctx.run("--depth", "1")[1]


def spec_checkpoint_budget(ctx: Context) -> None:
    status, out, err = ctx.run("--checkpoint-budget", "70%")
    assert status == 0, err
    # Saved for backward (float32, batch 2): body.0 keeps its input x for the weight's gradient, 2 x 8 x 4 B = 64 B;
    # the ReLU its output, 2 x 4 x 4 B = 32 B, which is also the head's input (one storage, counted once): 96 B.
    # Any wrapped region still keeps x: 64 B is the least reachable; 70 % of 96 B is 67 B, 50 % (48 B) is out of reach.
    assert "saved for backward 96 B -> 64 B (66.7%), budget 67 B" in out
    assert "verified: saved 64 B measured against 64 B predicted (+0.0%), budget met" in out
    status, out, err = ctx.run("--checkpoint-budget", "50%")
    assert status == 0 and "the budget (48 bytes) cannot be met: the least saved memory any plan reaches is 64" in out


def spec_checkpoint_peak(ctx: Context) -> None:
    status, out, err = ctx.run("--checkpoint-peak", "100%")
    assert status == 0, err
    assert "--checkpoint-peak profiles with --metrics live_memory" in err  # turned on for the step's peak, and said
    # The step's live tensor bytes peak at 240 B (batch 2) in body.0's backward: a budget of all of it wraps nothing.
    assert "peak budget 240 B, +0 ms per step, 0 modules wrapped" in out
    assert "note: the peak budget (240 bytes) is not below the profiled step's peak (240 bytes): nothing to wrap" in out
    status, out, err = ctx.run("--checkpoint-peak", "1")
    assert status == 0 and "note: the peak budget (1 bytes) cannot be met: none of the 2 plans weighed lowers the " \
        "step's peak below today's (240 bytes)" in out, err
    assert "OVER the peak budget of 1 B" in out and "verified:" not in out


def spec_allow_side_effects(ctx: Context) -> None:
    status, _, err = ctx.run("--allow-side-effects")
    assert status == 2 and "--allow-side-effects is for a checkpoint plan: add --checkpoint-budget" in err
    # Saved for backward (float32, batch 2): x for body.0's weight gradient, 2 x 8 x 4 B = 64 B, and 2 x 4 x 4 B = 32 B
    # each for the BatchNorm's input and for the Tanh's output (the head's input), and the BatchNorm's mean and
    # inverse std, 2 x 4 x 4 B: 160 B. Every module holding the BatchNorm is excluded, so 50 % (80 B) is out of
    # reach; allowed, wrapping the whole model keeps only x, 64 B.
    status, out, err = ctx.run("--checkpoint-budget", "50%", model="Normed")
    assert status == 0 and "saved for backward 160 B -> 160 B (100.0%), budget 80 B" in out, err
    assert "0 modules wrapped" in out and "a plan reaches 64 bytes" in out
    assert "(--allow-side-effects lets the plan recompute them)" in out and "verified:" not in out
    status, out, err = ctx.run("--checkpoint-budget", "50%", "--allow-side-effects", model="Normed")
    assert status == 0 and "budget met" in out and "allow_side_effects" not in out, err


def spec_wrap_cost(ctx: Context) -> None:
    status, _, err = ctx.run("--wrap-cost", "0.4,0.012")
    assert status == 2 and "--wrap-cost is for a checkpoint plan: add --checkpoint-budget" in err
    status, _, err = ctx.run("--checkpoint-budget", "70%", "--wrap-cost", "0.4")
    assert status == 2 and "argument --wrap-cost: expected MS_CALL,MS_TENSOR in milliseconds" in err
    # The plan of spec_checkpoint_budget, priced at the given wrapper: its line reads that price beside its
    # recomputation, 0.4 ms for the one wrapped call + 4 tensors saved inside at 0.012 ms: 448 µs.
    status, out, err = ctx.run("--checkpoint-budget", "70%", "--wrap-cost", "0.4,0.012")
    assert status == 0 and "saved for backward 96 B -> 64 B (66.7%), budget 67 B" in out, err
    assert re.search(r"wrapper +448 µs", out), out


def spec_columns(ctx: Context) -> None:
    out = ctx.run("--columns", "calls,params")[1]
    assert "(head): Linear【Calls: 1 | Params: 10 (21.7%)】" in out  # 4 x 2 + 2 of 46


def _check_output(flag: str, path: Path) -> None:
    text = path.read_bytes()
    checks: dict[str, Callable[[bytes], bool]] = {
        "csv": lambda b: b.decode().splitlines()[0].startswith("name,"),
        "json": lambda b: json.loads(b)["format"] == "layerprof.profile",
        "html": lambda b: b"<table" in b,
        "trace": lambda b: "traceEvents" in json.loads(b),
        "speedscope": lambda b: json.loads(b)["$schema"].startswith("https://www.speedscope.app/"),
        "report": lambda b: b.startswith(b"<!DOCTYPE html>"),
        "plot": lambda b: b.startswith(b"\x89PNG\r\n\x1a\n"),
    }
    assert checks[flag](text), (flag, text[:200])


def writes(flag: str, command: str) -> Callable[[Context], None]:
    def case(ctx: Context) -> None:
        path = ctx.tmp / f"out.{'png' if flag == 'plot' else flag}"
        argv = (f"--{flag}", str(path))
        status, _, err = ctx.run(*argv) if command == "layerprof" else ctx.main("show", str(ctx.saved), *argv)
        assert status == 0, err
        assert f"layerprof: wrote {path}" in err
        _check_output(flag, path)
    return case


def _svg(ctx: Context, command: str, *argv: str) -> str:
    path = ctx.tmp / "plot.svg"
    status, _, err = (ctx.run("--plot", str(path), *argv) if command == "layerprof"
                      else ctx.main("show", str(ctx.saved), "--plot", str(path), *argv))
    assert status == 0, err
    return path.read_text()


def plot_kind(command: str) -> Callable[[Context], None]:
    def case(ctx: Context) -> None:
        sunburst, icicle, top = (_svg(ctx, command, "--plot-kind", kind) for kind in ("sunburst", "icicle", "top"))
        assert 'id="module:body"' in sunburst and 'id="xtick_1"' not in sunburst  # wedges, no value axis
        assert 'id="module:body"' in icicle and 'id="xtick_1"' in icicle  # bars along a time axis
        assert 'id="top:body.0"' in top and 'id="module:' not in top
    return case


def plot_metric(command: str) -> Callable[[Context], None]:
    def case(ctx: Context) -> None:
        assert "Tagged: Total Time, total" in _svg(ctx, command)  # the default
        assert "Tagged: Forward Time, total" in _svg(ctx, command, "--plot-metric", "forward")
        flops = ("--plot-metric", "flops") + (("--metrics", "flops", "--steps", "2") if command == "layerprof" else ())
        # forward 160 (see spec_metrics) + backward: weight gradients 128 + 32, head's input gradient 32
        assert "Tagged: FLOPs, total 352 FLOPs" in _svg(ctx, command, *flops)
    return case


def debug(command: str) -> Callable[[Context], None]:
    def case(ctx: Context) -> None:
        argv = {"layerprof": (f"{ctx.models}:Broken", "-i", "2,8"),
                "show": ("show", str(ctx.tmp / "missing.json")),
                "compare": ("compare", str(ctx.saved), str(ctx.tmp / "missing.json"))}[command]
        expected = 5 if command == "layerprof" else 3  # the model raised; a profile is missing
        status, _, err = ctx.main(*argv)
        assert status == expected and "Traceback" not in err
        status, _, err = ctx.main(*argv, "--debug")
        assert status == expected and "Traceback (most recent call last)" in err
        assert err.rstrip().splitlines()[-1].startswith("layerprof: error:")
    return case


def version(command: str) -> Callable[[Context], None]:
    def case(ctx: Context) -> None:
        prefix = () if command == "layerprof" else (command,)
        assert ctx.exits(*prefix, "--version") == f"layerprof {layerprof.__version__}\n"
    return case


def help_(command: str) -> Callable[[Context], None]:
    def case(ctx: Context) -> None:
        prefix = () if command == "layerprof" else (command,)
        shown = ctx.exits(*prefix, "--help")
        assert shown.startswith(f"usage: layerprof{' ' + command if prefix else ''} ")
        for option in sorted(o for c, o in declared_options() if c == command):
            assert option in shown, option
        if command == "compare":
            assert "exit status:" in shown and "4 the two profiles are of" in shown
    return case


# -- show ---------------------------------------------------------------------------------------------------------
def show_depth(ctx: Context) -> None:
    assert "... 2 children" in ctx.main("show", str(ctx.saved), "--depth", "0")[1]
    assert "(0): Linear【" in ctx.main("show", str(ctx.saved), "--depth", "all")[1]


def _normed_profile(ctx: Context) -> str:
    path = ctx.path("normed.json")
    status, _, err = ctx.run("--metrics", "memory", "--json", path, model="Normed")
    assert status == 0, err
    return path


def show_checkpoint_peak(ctx: Context) -> None:
    # A profile saved with the plain memory meter on the CPU has no step peak at every boundary: refused, saying
    # what to record; saved from a live_memory run, the file keeps the step's tables and plans by its peak.
    status, _, err = ctx.main("show", _normed_profile(ctx), "--checkpoint-peak", "90%")
    assert status == 2 and "no reader for the step's device" in err
    assert "layerprof SPEC --metrics live_memory --json PATH" in err
    path = ctx.path("live.json")
    status, _, err = ctx.run("--metrics", "live_memory", "--json", path)
    assert status == 0, err
    status, out, err = ctx.main("show", path, "--depth", "0", "--checkpoint-peak", "100%")
    assert status == 0 and "nothing to wrap" in out and "step peak: " in out and "verified:" not in out, err


def show_checkpoint_budget(ctx: Context) -> None:
    # The saved profile of the fixture has no memory figures: refused, saying how to make one that has.
    status, _, err = ctx.main("show", str(ctx.saved), "--checkpoint-budget", "50%")
    assert status == 2 and "no memory figures" in err and "layerprof SPEC --metrics memory --json PATH" in err
    status, _, err = ctx.main("show", str(ctx.saved), "--checkpoint-budget", "lots")
    assert status == 2 and "--checkpoint-budget: cannot read budget 'lots'" in err
    # Normed's saved bytes, as in spec_allow_side_effects: 160 B, 50 % out of reach with its BatchNorm excluded.
    status, out, err = ctx.main("show", _normed_profile(ctx), "--checkpoint-budget", "50%")
    assert status == 0 and "saved for backward 160 B -> 160 B (100.0%), budget 80 B" in out, err
    assert "a plan reaches 64 bytes" in out and "verified:" not in out  # no model to verify it on


def show_wrap_cost(ctx: Context) -> None:
    # A memory profile from another host: the plan warned with the Python API's advice (wrap_cost=...), which the
    # shell cannot follow; now a note naming --wrap-cost, and with it none.
    doc = json.loads(Path(_normed_profile(ctx)).read_text())
    doc["meta"]["environment"]["host"] = "gpu-node-17"
    other = ctx.tmp / "normed_other.json"
    other.write_text(json.dumps(doc))
    status, out, err = ctx.main("show", str(other), "--checkpoint-budget", "50%", "--allow-side-effects")
    # As in show_allow_side_effects: the whole model wrapped keeps only x (2 x 8 x 4 B).
    assert status == 0 and "saved for backward 160 B -> 64 B" in out, (out, err)
    assert ("layerprof: note: this profile was measured on another machine (host 'gpu-node-17'), and the plan's "
            "extra time holds this machine's checkpoint-wrapper price: give that machine's with --wrap-cost "
            "MS_CALL,MS_TENSOR") in err and "wrap_cost=(" not in err
    status, out, err = ctx.main("show", str(other), "--checkpoint-budget", "50%", "--allow-side-effects",
                                "--wrap-cost", "0.4,0.012")
    # 0.4 ms for the one wrapped call + 10 saved tensors inside it at 0.012 ms: 520 µs.
    assert status == 0 and "note:" not in err and re.search(r"wrapper +520 µs", out), (out, err)


def show_allow_side_effects(ctx: Context) -> None:
    path = _normed_profile(ctx)
    status, _, err = ctx.main("show", path, "--allow-side-effects")
    assert status == 2 and "--allow-side-effects is for a checkpoint plan: add --checkpoint-budget" in err
    # Allowed, the whole model is wrapped and keeps only x (2 x 8 x 4 B); the frontier marks the same plan.
    status, out, err = ctx.main("show", path, "--checkpoint-budget", "50%", "--allow-side-effects",
                                "--plot", ctx.path("f.svg"), "--plot-kind", "checkpoint")
    assert status == 0 and "saved for backward 160 B -> 64 B (40.0%), budget 80 B" in out, err
    assert "plan: 64 B" in (ctx.tmp / "f.svg").read_text()


def show_columns(ctx: Context) -> None:
    out = ctx.main("show", str(ctx.saved), "--columns", "flops_forward")[1]
    assert "(head): Linear【Forward FLOPs: 32 FLOPs (9.1%)】" in out  # 2 x (2 x 4 x 2), of 352


def show_peaks(ctx: Context) -> None:
    # The fixture's file holds this machine's roofs; given ones take their place: against roofs of 1e30 FLOP/s
    # and bytes/s, every module's own time is far more than 10x its attainable time (overhead-bound).
    out = ctx.main("show", str(ctx.saved), "--columns", "bound", "--peaks", "1e30,1e30")[1]
    # (5 modules: the root, body, its Linear and ReLU, head)
    assert out.count("Bound: overhead") == 5 and "Bound: compute" not in out and "Bound: memory" not in out
    # A file from another host without its roofs: refused for a roofline column, taken with --peaks.
    doc = json.loads(ctx.saved.read_text())
    del doc["meta"]["peaks"]
    doc["meta"]["environment"]["host"] = "gpu-node-17"
    other = ctx.tmp / "other.json"
    other.write_text(json.dumps(doc))
    status, _, err = ctx.main("show", str(other), "--columns", "bound")
    assert status == 2 and "another machine (host 'gpu-node-17')" in err and "--peaks FLOPS,BANDWIDTH" in err
    status, out, err = ctx.main("show", str(other), "--columns", "bound", "--peaks", "1e30,1e30")
    assert status == 0 and out.count("Bound: overhead") == 5, err
    status, _, err = ctx.main("show", str(other), "--peaks", "1e30")
    assert status == 2 and "argument --peaks: expected FLOPS,BANDWIDTH" in err


# -- compare ------------------------------------------------------------------------------------------------------
def _pair(ctx: Context, factor_forward: float, factor_backward: float, module: float = 1.0) -> tuple[str, str]:
    """A and B of 12 steps: A's steps scaled, forward and backward separately; module ``fc`` by ``module``."""
    def profile(f: float, b: float, m: float) -> layerprof.Profile:
        return make_profile({"": ("Net", [10 * f, 10.1 * f, 10.2 * f] * 4, [20 * b, 20.1 * b, 20.2 * b] * 4),
                             "fc": ("Linear", [2 * m] * 12, None)})
    a, b = ctx.tmp / "a.json", ctx.tmp / "b.json"
    profile(1, 1, 1).to_json(a)
    profile(factor_forward, factor_backward, module).to_json(b)
    return str(a), str(b)


def compare_by(ctx: Context) -> None:
    a, b = _pair(ctx, 1.0, 1.5)  # backward +50 %, total (10.1 + 30.15) / 30.2 = +33.3 %
    assert ctx.main("compare", a, b, "--fail-if-slower", "40", "--by", "backward")[0] == 1
    assert ctx.main("compare", a, b, "--fail-if-slower", "40", "--by", "total")[0] == 0
    assert ctx.main("compare", a, b, "--fail-if-slower", "0", "--by", "forward")[0] == 0


def compare_fail_if_slower(ctx: Context) -> None:
    a, b = _pair(ctx, 1.25, 1.25)
    status, out, err = ctx.main("compare", a, b, "--fail-if-slower", "20")
    assert status == 1 and "Comparison A (Net) vs B (Net)" in out
    assert "FAIL: B is slower: total time per step (median) 30.2 ms -> 37.8 ms (+25.0 %), limit +20 %" in err
    assert ctx.main("compare", a, b, "--fail-if-slower", "30")[0] == 0
    assert ctx.main("compare", a, b)[0] == 0  # no limit, no gate


def compare_per_module(ctx: Context) -> None:
    a, b = _pair(ctx, 1.0, 1.0, module=1.5)  # only fc: 2 -> 3 ms
    assert ctx.main("compare", a, b, "--fail-if-slower", "10")[0] == 0
    status, _, err = ctx.main("compare", a, b, "--fail-if-slower", "10", "--per-module")
    # against the rest of the model: 2 / (30.2 - 2) -> 3 / (30.2 - 3), +55.5 %
    assert status == 1 and err.strip().endswith("slower (against the rest of the model): fc 2 ms -> 3 ms (+55.5 %)")


def compare_tables(flag: str, line: str) -> Callable[[Context], None]:
    def case(ctx: Context) -> None:
        a, b = _pair(ctx, 1.25, 1.25)  # total per step 30.2 -> 37.75 ms (the medians), +25 %
        status, _, err = ctx.main("compare", a, b, "--fail-if-slower", "20", f"--{flag}", ctx.path("t"))
        # written before the gate's verdict, which fails
        assert status == 1 and f"wrote {ctx.path('t')}" in err and line in (ctx.tmp / "t").read_text().splitlines()
    return case


CASES: dict[tuple[str, str], Callable[[Context], None]] = {
    ("layerprof", "--kwargs"): spec_kwargs,
    ("layerprof", "--input"): spec_input,
    ("layerprof", "--vocab"): spec_vocab,
    ("layerprof", "--warmup"): spec_warmup,
    ("layerprof", "--steps"): spec_steps,
    ("layerprof", "--no-backward"): spec_no_backward,
    ("layerprof", "--eval"): spec_eval,
    ("layerprof", "--device"): spec_device,
    ("layerprof", "--fake"): spec_fake,
    ("layerprof", "--dtype"): spec_dtype,
    ("layerprof", "--autocast"): spec_autocast,
    ("layerprof", "--threads"): spec_threads,
    ("layerprof", "--seed"): spec_seed,
    ("layerprof", "--metrics"): spec_metrics,
    ("layerprof", "--sync"): spec_sync,
    ("layerprof", "--depth"): spec_depth,
    ("layerprof", "--columns"): spec_columns,
    ("layerprof", "--checkpoint-budget"): spec_checkpoint_budget,
    ("layerprof", "--checkpoint-peak"): spec_checkpoint_peak,
    ("layerprof", "--allow-side-effects"): spec_allow_side_effects,
    ("layerprof", "--wrap-cost"): spec_wrap_cost,
    ("show", "--depth"): show_depth,
    ("show", "--columns"): show_columns,
    ("show", "--peaks"): show_peaks,
    ("show", "--checkpoint-budget"): show_checkpoint_budget,
    ("show", "--checkpoint-peak"): show_checkpoint_peak,
    ("show", "--allow-side-effects"): show_allow_side_effects,
    ("show", "--wrap-cost"): show_wrap_cost,
    ("compare", "--by"): compare_by,
    ("compare", "--fail-if-slower"): compare_fail_if_slower,
    ("compare", "--per-module"): compare_per_module,
    ("compare", "--csv"): compare_tables(
        "csv", "total_ms,30.199999999999996,37.75,7.550000000000004,0.25000000000000017,1.2500000000000002,A"),
    ("compare", "--markdown"): compare_tables("markdown", "| Total | 30.2 ms | 37.8 ms | +25.0% | 1.25x | A |"),
    ("compare", "--latex"): compare_tables("latex", "Total & 30.2 ms & 37.8 ms & +25.0\\% & 1.25x & A \\\\"),
}
for _command in ("layerprof", "show"):
    for _flag in ("csv", "json", "html", "trace", "speedscope", "report", "plot"):
        CASES[(_command, f"--{_flag}")] = writes(_flag, _command)
    CASES[(_command, "--plot-kind")] = plot_kind(_command)
    CASES[(_command, "--plot-metric")] = plot_metric(_command)
for _command in PARSERS:
    CASES[(_command, "--debug")] = debug(_command)
    CASES[(_command, "--version")] = version(_command)
    CASES[(_command, "--help")] = help_(_command)


def test_every_option_has_an_end_to_end_test() -> None:
    declared = declared_options()
    assert not declared - set(CASES), f"options without a test: {sorted(declared - set(CASES))}"
    assert not set(CASES) - declared, f"tests of options that no longer exist: {sorted(set(CASES) - declared)}"


@pytest.mark.parametrize("command, option", sorted(CASES), ids=[" ".join(key) for key in sorted(CASES)])
def test_option(command: str, option: str, ctx: Context) -> None:
    CASES[(command, option)](ctx)
