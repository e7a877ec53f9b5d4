"""The command line: real runs in a subprocess (``python -m layerprof``), error cases through ``main(argv)``."""
from __future__ import annotations

import dataclasses
import io
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

import layerprof
from layerprof.cli import main
from layerprof.cli.errors import RunError
from layerprof.cli.inputs import InputSpec, make_inputs, parse_input
from layerprof.cli.parser import EPILOG
from layerprof.cli.run import loss_of, progress

ROOT = Path(__file__).resolve().parent.parent

MODELS = textwrap.dedent('''
    import torch
    from torch import nn

    CONSTANT = 3


    class TinyLM(nn.Module):
        """Token ids -> logits; refuses ids outside the vocabulary or of the wrong dtype, so a run proves both."""

        def __init__(self, vocab=100, width=8):
            super().__init__()
            self.vocab = vocab
            self.embed = nn.Embedding(vocab, width)
            self.mix = nn.Sequential(nn.Linear(width, width), nn.GELU())
            self.head = nn.Linear(width, vocab)

        def forward(self, ids):
            assert ids.dtype == torch.int64, ids.dtype
            assert 0 <= int(ids.min()) and int(ids.max()) < self.vocab, "id out of range"
            if not self.training:
                assert torch.is_inference_mode_enabled(), "--eval must run under inference_mode"
            return {"logits": self.head(self.mix(self.embed(ids))), "ids": ids}


    class Net(nn.Module):
        def __init__(self, width=20):
            super().__init__()
            self.fc = nn.Linear(width, 5)

        def forward(self, x):
            return self.fc(x)


    class ArgMax(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(4, 3)

        def forward(self, x):
            return self.fc(x).argmax(-1)


    INSTANCE = Net(width=4)


    def not_a_model():
        return CONSTANT


    def broken():
        raise ValueError("bad config\\nwith a second line")
''')


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("cli") / "models.py"
    path.write_text(MODELS)
    return path


def start_cli(*args: str) -> subprocess.Popen:
    # This checkout first, then the path this interpreter was given (where its packages may be: torch, torchvision).
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    env = {**os.environ, "PYTHONPATH": path, "PYTHONWARNINGS": "ignore"}
    return subprocess.Popen([sys.executable, "-m", "layerprof", *args, "--threads", "1"], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finish(process: subprocess.Popen) -> subprocess.CompletedProcess:
    stdout, stderr = process.communicate(timeout=180)
    return subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)


@pytest.fixture(scope="module")
def runs(models: Path):
    """The subprocess runs, started together so that their ~3 s imports of torch overlap."""
    started = {
        "resnet": start_cli("torchvision.models:resnet18", "--input", "1,3,64,64", "--steps", "2"),
        "file": start_cli(f"{models}:TinyLM", "--kwargs", '{"vocab": 50, "width": 16}', "--input", "2,8:int64",
                          "--vocab", "50", "--warmup", "0", "--steps", "2", "--depth", "all",
                          "--columns", "forward,backward,calls"),
        "eval": start_cli(f"{models}:TinyLM", "--input", "2,8:int64", "--eval", "--steps", "1", "--depth", "1"),
        "error": start_cli(f"{models}:Net", "--input", "1,10"),
    }
    yield {name: (lambda process=process: finish(process)) for name, process in started.items()}
    for process in started.values():
        if process.poll() is None:
            process.kill()
        process.communicate()


def annotated_lines(stdout: str) -> list[str]:
    return [line for line in stdout.splitlines() if "【" in line]


# -- real runs, in a subprocess ----------------------------------------------------------------------------------
def test_resnet18_prints_every_top_level_child(runs) -> None:
    pytest.importorskip("torchvision")
    result = runs["resnet"]()  # torchvision.models:resnet18 --input 1,3,64,64 --steps 2
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""  # piped: no progress bar, no chatter
    out = result.stdout
    assert out.startswith("ResNet from torchvision.models:resnet18: 11.7M parameters | cpu, float32 | "
                          "input 1x3x64x64 | 1 warm-up + 2 steps, forward + backward\nStep: forward ")
    children = {"conv1": "Conv2d", "bn1": "BatchNorm2d", "relu": "ReLU", "maxpool": "MaxPool2d",
                "layer1": "Sequential", "layer2": "Sequential", "layer3": "Sequential", "layer4": "Sequential",
                "avgpool": "AdaptiveAvgPool2d", "fc": "Linear"}
    for name, kind in children.items():
        line = re.search(rf"^  \({name}\): {kind}【Forward Time: ([^|]+) \| Backward Time: ([^】]+)】", out, re.M)
        assert line is not None, name
        assert "—" not in line.group(1) + line.group(2), line.group(0)  # both passes measured
    # default --depth 2: the BasicBlocks (depth 2) are shown collapsed; a block has conv1, bn1, relu, conv2, bn2
    # (5 children), plus downsample (6) in the first block of layer2..layer4
    assert out.count("... 5 children") == 5 and out.count("... 6 children") == 3
    assert len(annotated_lines(out)) == 1 + 10 + 8  # root + top-level children + 2 blocks in each of 4 layers


def test_file_spec_with_kwargs_and_token_ids(runs, models: Path) -> None:
    result = runs["file"]()
    assert result.returncode == 0, result.stderr
    out = result.stdout
    # 50 x 16 embedding + (16 x 16 + 16) + (16 x 50 + 50) = 800 + 272 + 850 = 1922 parameters
    assert out.startswith(f"TinyLM from {models}:TinyLM: 1.92k parameters | cpu, float32 | input 2x8 int64 | "
                          "0 warm-up + 2 steps, forward + backward\n")
    assert "(embed): Embedding【" in out and "】(50, 16)" in out  # --kwargs reached the constructor
    assert "(1): GELU【" in out  # --depth all expands the Sequential
    lines = annotated_lines(out)
    assert len(lines) == 6  # TinyLM, embed, mix, mix.0, mix.1, head
    assert all("| Calls: 1】" in line for line in lines)
    # the embedding's weight gets a gradient, so its backward is measured even though its input is integer
    assert re.search(r"Embedding【Forward Time: [^|—]+ \| Backward Time: [^|—]+ \|", out)


def test_eval_runs_forward_only_under_inference_mode(runs) -> None:
    result = runs["eval"]()  # TinyLM --input 2,8:int64 --eval --steps 1 --depth 1
    assert result.returncode == 0, result.stderr
    assert "1 warm-up + 1 step, inference (eval)" in result.stdout
    assert "Step: forward " in result.stdout and ", backward —, " in result.stdout
    lines = annotated_lines(result.stdout)
    assert len(lines) == 4  # TinyLM, embed, mix, head
    assert all("Backward Time: —】" in line and "Forward Time: —" not in line for line in lines)


def test_model_error_is_one_line_naming_the_module(runs) -> None:
    result = runs["error"]()  # Net (a Linear(20, 5)) --input 1,10
    assert result.returncode == 5  # the run failed (errors.EXIT_RUN)
    with pytest.raises(RuntimeError) as raised:  # torch's own words (torch 2.15 put "addmm: " before them)
        torch.nn.Linear(20, 5)(torch.randn(1, 10))
    assert "(1x10 and 20x5)" in str(raised.value)
    assert result.stderr.strip().splitlines() == [
        f"python -m layerprof: error: the model raised RuntimeError: {raised.value} "
        "[raised inside module 'fc' (Linear)]"
    ]


def test_debug_shows_the_traceback(models: Path, capsys) -> None:
    assert main(["layerprof.nosuch:Net", "--input", "1,10", "--debug"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("Traceback") and "ModuleNotFoundError: No module named 'layerprof.nosuch'" in err
    assert err.strip().splitlines()[-1] == (
        "layerprof: error: no module named 'layerprof.nosuch' (from the spec's module part 'layerprof.nosuch')")
    assert main([f"{models}:Net", "--input", "1,10", "--debug"]) == 5
    err = capsys.readouterr().err
    assert err.startswith("Traceback") and "mat1 and mat2 shapes cannot be multiplied" in err
    assert err.strip().splitlines()[-1].endswith("[raised inside module 'fc' (Linear)]")


# -- exports ---------------------------------------------------------------------------------------------------------
EXPORTS = {"csv": "to_csv", "json": "to_json", "html": "to_html", "trace": "to_trace", "plot": "plot"}


def test_writes_every_available_export(models: Path, tmp_path: Path) -> None:
    args = [f"{models}:Net", "--input", "2,20", "--steps", "1"]
    paths = {flag: tmp_path / f"profile.{'png' if flag == 'plot' else flag}" for flag in EXPORTS}
    for flag, path in paths.items():
        args += [f"--{flag}", str(path)]
    if "plot" in paths:
        args += ["--plot-kind", "icicle", "--plot-metric", "total"]
    result = finish(start_cli(*args))
    assert result.returncode == 0, result.stderr
    for flag, path in paths.items():
        assert path.is_file() and path.stat().st_size > 0, flag
        assert f"layerprof: wrote {path}" in result.stderr
    if "json" in paths:
        assert '"fc"' in paths["json"].read_text()
    if "csv" in paths:
        assert "fc" in paths["csv"].read_text()


def test_exports_call_the_profile_methods(models: Path, tmp_path: Path, monkeypatch, capsys) -> None:
    calls = []
    for flag, method in EXPORTS.items():
        monkeypatch.setattr(layerprof.Profile, method,
                            lambda self, *args, _m=method: calls.append((_m, len(self.records), *args)), raising=False)
    argv = [f"{models}:Net", "-i", "2,20", "--steps", "1", "--plot-kind", "top", "--plot-metric", "forward"]
    names = {flag: f"out.{'png' if flag == 'plot' else flag}" for flag in EXPORTS}
    for flag in EXPORTS:
        argv += [f"--{flag}", str(tmp_path / names[flag])]
    assert main(argv) == 0
    # Net has 2 modules (the root and fc); the plot gets kind, metric and path. Each method writes a temporary
    # file beside its output (same suffix), renamed into place once all are written.
    assert [call[:-1] for call in calls] == [("to_csv", 2), ("to_json", 2), ("to_html", 2), ("to_trace", 2),
                                             ("plot", 2, "top", "forward")]
    for call, name in zip(calls, names.values()):
        written = Path(call[-1])
        assert written.parent == tmp_path and written.name.startswith(".out.") and written.suffix == Path(name).suffix
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(names.values())
    assert capsys.readouterr().err.count("layerprof: wrote ") == 5
    # a missing folder fails before the model is built or run
    assert main([f"{models}:broken", "-i", "2", "--json", str(tmp_path / "no" / "p.json")]) == 2
    assert capsys.readouterr().err.strip() == (
        f"layerprof: error: --json {str(tmp_path / 'no' / 'p.json')!r}: folder {str(tmp_path / 'no')!r} does not exist")
    assert len(calls) == 5


# -- bad input, in process: exit status, one line naming the problem, no traceback ---------------------------------
BAD = [
    # (arguments, exit status, what the one line must say); {m} is the models file
    (["layerprof.nosuch:Net", "-i", "2"], 2, "no module named 'layerprof.nosuch'"),
    (["{m}:Nett", "-i", "2"], 2, "has no attribute 'Nett'; did you mean Net"),
    (["torch.nn:Linearr", "-i", "2"], 2, "'torch.nn' has no attribute 'Linearr'; did you mean Linear"),
    (["torch.nn:Linear.nope", "-i", "2"], 2, "'torch.nn.Linear' has no attribute 'nope'"),
    # A model factory one package down (timm and torchvision keep theirs in .models): the spec that names it.
    (["torchvision:resnet18", "-i", "2"], 2,
     "'torchvision' has no attribute 'resnet18'; did you mean torchvision.models:resnet18?"),
    (["torch.nn.Linear", "-i", "2"], 2, "needs the form package.module:callable"),
    (["{m}x:Net", "-i", "2"], 2, "not found"),
    (["{m}:not_a_model", "-i", "2"], 2, ":not_a_model' returned builtins.int, not a torch.nn.Module"),
    (["{m}:CONSTANT", "-i", "2"], 2, ":CONSTANT' is not callable (it is of type int)"),
    (["{m}:broken", "-i", "2"], 5, "calling broken() raised ValueError: bad config"),
    (["{m}:Net", "--kwargs", '{"widht": 3}', "-i", "2"], 5, "calling Net(widht=3) raised TypeError"),
    (["{m}:Net", "--kwargs", "{width: 3}", "-i", "2"], 2, "--kwargs is not valid JSON"),
    (["{m}:Net", "--kwargs", "[3]", "-i", "2"], 2, "--kwargs must be a JSON object"),
    (["{m}:INSTANCE", "--kwargs", '{"width": 3}', "-i", "2"], 2, "is already a module instance: it takes no"),
    (["{m}:Net", "-i", "2,x"], 2, "--input '2,x' is not a shape"),
    (["{m}:Net", "-i", "2,0"], 2, "--input '2,0' is not a shape"),
    (["{m}:Net", "-i", "2,20:float33"], 2, "unknown input dtype 'float33'"),
    (["{m}:Net", "-i", "2-x=2,20"], 2, "'2-x' is not a keyword argument name"),
    (["{m}:Net"], 2, "give the model's input shape"),
    (["{m}:Net", "-i", "2,20", "--dtype", "int8"], 2, "must be a floating type"),
    # float8 is a storage format: a model cast to it cannot run its matmuls (the run failed making the input, with
    # torch's "normal_kernel_cpu not implemented for 'Float8_e4m3fn'", exit 5)
    (["{m}:Net", "-i", "2,20", "--dtype", "float8_e4m3fn"], 2, "--dtype float8_e4m3fn: a model cannot compute in"),
    (["{m}:Net", "-i", "2,20", "--steps", "0"], 2, "argument --steps: expected an integer >= 1, got 0"),
    (["{m}:Net", "-i", "2,20", "--metrics", "nosuchmetric"], 2, "unknown metric 'nosuchmetric'; choose from"),
    (["{m}:Net", "-i", "2,20", "--columns", "forward,nope"], 2, "unknown column 'nope'; choose from"),
    (["{m}:Net", "-i", "2,20", "--device", "nonsense"], 2, "--device 'nonsense' is not a device"),
    (["{m}:Net", "-i", "1,10"], 5, "shapes cannot be multiplied (1x10 and 20x5) [raised inside module 'fc' (Linear)]"),
    (["{m}:Net", "-i", "1,20:int64"], 5, "[raised inside module 'fc' (Linear)]"),
    (["{m}:ArgMax", "-i", "2,4"], 5, "nothing to backpropagate: profile the forward pass only with --no-backward"),
]


@pytest.mark.parametrize("argv, status, message", BAD, ids=[" ".join(case[0]) for case in BAD])
def test_bad_input_is_one_line_and_an_exit_status(argv: list[str], status: int, message: str, models: Path,
                                                   capsys) -> None:
    if any(arg.startswith("torchvision") for arg in argv):
        pytest.importorskip("torchvision")
    assert main([arg.replace("{m}", str(models)) for arg in argv]) == status
    captured = capsys.readouterr()
    err = captured.err.strip()
    assert "\n" not in err and "Traceback" not in err, err
    assert err.startswith("layerprof: error: ") and message in err, err


def test_cuda_requested_without_cuda(models: Path, capsys) -> None:
    if torch.cuda.is_available():
        pytest.skip("CUDA is available here")
    assert main([f"{models}:Net", "-i", "2,20", "--device", "cuda"]) == 2
    assert "--device cuda: CUDA is not available here" in capsys.readouterr().err


def test_no_backward_runs_forward_only(models: Path, capsys) -> None:
    # ArgMax's output has no grad, so a training step fails (see BAD) but a forward-only one works
    assert main([f"{models}:ArgMax", "-i", "2,4", "--no-backward", "--steps", "1", "--depth", "0"]) == 0
    out = capsys.readouterr().out
    assert "1 warm-up + 1 step, forward only" in out
    assert re.search(r"^ArgMax【Forward Time: [^—|]+ \| Backward Time: —】\(\n  \.\.\. 1 child\n\)$", out, re.M)


def test_module_instance_spec(models: Path, capsys) -> None:
    assert main([f"{models}:INSTANCE", "-i", "3,4", "--warmup", "0", "--steps", "1", "--columns", "calls"]) == 0
    out = capsys.readouterr().out
    # Net(width=4): 4 x 5 + 5 = 25 parameters
    assert out.startswith(f"Net from {models}:INSTANCE: 25 parameters | cpu, float32 | input 3x4 | "
                          "0 warm-up + 1 step, forward + backward\n")
    assert "(fc): Linear【Calls: 1】(in_features=4, out_features=5, bias=True)" in out


def test_help_has_three_examples(capsys) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["--help"])
    assert exit_.value.code == 0
    out = capsys.readouterr().out
    assert EPILOG in out
    assert [line.split()[1] for line in EPILOG.splitlines() if line.startswith("  layerprof ")] == [
        "torchvision.models:resnet18", "torchvision.models:vit_b_16", "my_models.py:TinyLM", "show", "compare",
        "gather"]


def test_help_shows_the_subcommands_and_every_name(capsys, monkeypatch) -> None:
    from layerprof.metrics import METERS
    from layerprof.record.fields import FIELDS, Field
    from layerprof.render.columns import column_names

    # A meter and a field registered now are listed: the help reads the registries, it holds no copy of them.
    monkeypatch.setitem(METERS, "zz_meter", METERS["params"])
    monkeypatch.setitem(FIELDS, "zz_field_bytes", Field("zz_field_bytes", "bytes", "ZZ", meter="zz_meter"))
    with pytest.raises(SystemExit):
        main(["--help"])
    out = capsys.readouterr().out
    usage = out.split("\n\n")[0].splitlines()
    assert usage == ["usage: layerprof SPEC --input SHAPE [options]", "       layerprof show PROFILE.json [options]",
                     "       layerprof compare A.json B.json [options]",
                     "       layerprof gather RANK_FILE [RANK_FILE ...] [options]"]
    names = out[out.index("\nnames ") + 1:]
    metrics = names.splitlines()[1].split()
    assert metrics[0] == "--metrics" and [name.rstrip(",") for name in metrics[1:]] == sorted(METERS)
    assert "zz_meter" in metrics[-1] and "zz_field_bytes" in names
    listed = {word.rstrip(",") for line in names.splitlines() for word in line.split()}
    assert set(column_names()) <= listed and {"forward", "memory", "flops", "saved_bytes", "time_percent"} <= listed
    assert "    zz_meter:  zz_field_bytes" in names  # grouped under the meter that records it
    # no plot of a self field (a plot draws the self part) nor of a share
    assert "any column above but self_forward, self_backward, self_total, mean_forward, self_forward_ms," in names
    assert "forward_per_call_ms, time_percent, self_percent," in names


def test_console_script_points_at_main() -> None:
    text = (ROOT / "pyproject.toml").read_text()
    assert 'layerprof = "layerprof.cli:main"' in text
    assert (ROOT / "layerprof" / "__main__.py").read_text().count("main(prog=") == 1


# -- the pieces -----------------------------------------------------------------------------------------------------
def test_parse_input_and_make_inputs() -> None:
    assert parse_input("2,3,224,224") == InputSpec((2, 3, 224, 224))
    assert parse_input(" 2, 32 :int64") == InputSpec((2, 32), torch.int64)
    assert parse_input("mask=2,32:bool") == InputSpec((2, 32), torch.bool, "mask")
    assert parse_input("2:bf16").dtype is torch.bfloat16 and parse_input("2:long").dtype is torch.int64
    torch.manual_seed(0)
    args, kwargs = make_inputs([parse_input("2,3"), parse_input("64:int32"), parse_input("mask=4:bool")],
                               float_dtype=torch.float16, vocab=7)
    assert [(tuple(t.shape), t.dtype) for t in args] == [((2, 3), torch.float16), ((64,), torch.int32)]
    assert 0 <= int(args[1].min()) and int(args[1].max()) <= 6  # vocab 7: ids in [0, 7)
    assert len(set(args[1].tolist())) > 1  # random, not constant
    assert list(kwargs) == ["mask"] and kwargs["mask"].dtype == torch.bool



def test_float8_inputs_are_drawn_in_float32_and_cast() -> None:
    # randn has no float8 kernel: '--input 2,8:float8_e4m3fn', for a model that upcasts its input, failed with
    # "cannot make the input 2x8 float8_e4m3fn (16 B): NotImplementedError".
    torch.manual_seed(0)
    (x,), _ = make_inputs([parse_input("2,8:float8_e4m3fn")])
    assert x.dtype == torch.float8_e4m3fn and tuple(x.shape) == (2, 8)
    torch.manual_seed(0)
    assert torch.equal(x.float(), torch.randn(2, 8).to(torch.float8_e4m3fn).float())


@dataclasses.dataclass
class _Out:
    logits: torch.Tensor
    extra: tuple


class _WithLoss(dict):
    @property
    def loss(self) -> torch.Tensor:
        return self["loss"]


def test_loss_of_sums_floating_outputs_that_require_grad() -> None:
    w = torch.ones(3, requires_grad=True)
    a, b = w * 2, w * 3  # sums 6 and 9
    frozen = torch.ones(3)  # needs no grad: left out
    ids = torch.arange(3)   # integer: left out
    loss = loss_of(_Out(a, ({"b": b, "frozen": frozen}, ids)))
    assert loss.item() == 15.0
    loss.backward()
    assert w.grad.tolist() == [5.0, 5.0, 5.0]  # d(2w + 3w)/dw
    hf = _WithLoss(loss=(w * 7).sum(), logits=w * 100)
    assert loss_of(hf).item() == 21.0  # the model's own loss, not the logits
    with pytest.raises(RunError, match="nothing to backpropagate"):
        loss_of((ids, frozen))


def test_progress_bar_only_when_asked_or_on_a_terminal(monkeypatch) -> None:
    pytest.importorskip("tqdm")
    stream = io.StringIO()
    monkeypatch.setattr(sys, "stderr", stream)
    assert list(progress(range(3), 3, enabled=False)) == [0, 1, 2] and stream.getvalue() == ""
    assert list(progress(range(3), 3)) == [0, 1, 2] and stream.getvalue() == ""  # StringIO is no terminal
    assert list(progress(range(3), 3, enabled=True)) == [0, 1, 2]
    assert stream.getvalue().startswith("\rlayerprof:   0%|") and "| 0/3 [" in stream.getvalue()


def test_a_typeerror_of_a_bug_in_layerprof_is_an_internal_error(tmp_path: Path, capsys, monkeypatch) -> None:
    """Only LayerProf's refusals of a model (``RefusedModel``, a TypeError) are the spec's fault: any other
    TypeError raised while making the LayerProf is a bug of layerprof, and was reported as a usage error (exit 2),
    pointing the user at their own command line."""
    import layerprof.cli.run as run

    def broken(*args, **kwargs):
        raise TypeError("unsupported operand type(s) for +: 'int' and 'NoneType'")

    monkeypatch.setattr(run, "LayerProf", broken)
    assert main(["torch.nn:Linear", "--kwargs", '{"in_features": 8, "out_features": 8}', "-i", "2,8",
                 "--warmup", "0", "--steps", "1"]) == 70
    assert "internal error: TypeError: unsupported operand" in capsys.readouterr().err


def test_a_compiled_model_is_a_usage_error_not_an_internal_one(tmp_path: Path, capsys) -> None:
    """A factory returning a torch.compile'd module: LayerProf refuses it, and the command says so as a usage error
    (exit 2), not as a bug of layerprof (70)."""
    spec = tmp_path / "compiled_models.py"
    spec.write_text(textwrap.dedent('''
        import torch
        from torch import nn


        def compiled():
            return torch.compile(nn.Sequential(nn.Linear(8, 8), nn.ReLU()), backend="eager")
    '''))
    assert main([f"{spec}:compiled", "-i", "2,8", "--warmup", "0", "--steps", "1"]) == 2
    err = capsys.readouterr().err
    assert "error: LayerProf cannot see inside a torch.compile'd module" in err and "internal error" not in err
