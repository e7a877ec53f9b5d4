"""``layerprof show`` and ``layerprof compare`` on saved profiles, through ``main(argv)``."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from torch import nn

from layerprof import LayerProf
from layerprof.cli import main


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A profile of 3 steps (3.0, 3.06, 3.03 ms) and a copy of it made 30 % slower in every time of every step."""
    folder = tmp_path_factory.mktemp("saved")
    net = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
    with LayerProf(net) as prof:
        for step in range(3):
            net(torch.randn(2, 4)).sum().backward()
            if step < 2:
                prof.step()
    a, b = folder / "a.json", folder / "b.json"
    # Fixed per-step times: the gate reads these, and steps timed on a busy machine would make the test flaky.
    prof.meta["step_ms"] = {"forward": [1.0, 1.02, 1.01], "backward": [2.0, 2.04, 2.02]}
    prof.to_json(a)
    doc = json.loads(a.read_text())
    for row in doc["records"]:
        for key in [key for key in row if key.startswith(("forward_ms", "backward_ms")) and not key.endswith("_std")]:
            row[key] *= 1.3
    doc["meta"]["step_ms"] = {key: [v * 1.3 for v in values] for key, values in doc["meta"]["step_ms"].items()}
    b.write_text(json.dumps(doc))
    return a, b


def test_show_prints_the_summary_and_writes_files(saved, tmp_path, capsys) -> None:
    a, _ = saved
    report, speedscope = tmp_path / "r.html", tmp_path / "s.json"
    assert main(["show", str(a), "--depth", "1", "--report", str(report), "--speedscope", str(speedscope)]) == 0
    out = capsys.readouterr().out
    assert "(0): Linear【Forward Time:" in out and "(2): Linear" in out
    assert report.read_text().startswith("<!DOCTYPE html>")
    assert json.loads(speedscope.read_text())["shared"]["frames"][1]["name"] == "0 (Linear)"


def test_compare_exit_codes(saved, capsys) -> None:
    a, b = saved
    assert main(["compare", str(a), str(b)]) == 0  # no gate: prints only
    assert "total_ms" in capsys.readouterr().out
    assert main(["compare", str(a), str(b), "--fail-if-slower", "10"]) == 1  # 30 % > 10 %, every step slower
    assert "FAIL: B is slower" in capsys.readouterr().err
    assert main(["compare", str(a), str(b), "--fail-if-slower", "40"]) == 0  # 30 % <= 40 %
    assert main(["compare", str(a), str(b), "--by", "backward", "--fail-if-slower", "29"]) == 1
    assert main(["compare", str(b), str(a), "--fail-if-slower", "0"]) == 0  # faster passes


def test_errors_have_their_own_exit_status(saved, tmp_path, capsys) -> None:
    a, _ = saved
    assert main(["show", str(tmp_path / "missing.json")]) == 3  # unreadable input
    assert main(["compare", str(a)]) == 2  # usage
    assert main(["compare", str(a), str(a), "--by", "sideways"]) == 2
    bad = tmp_path / "bad.json"
    bad.write_text('{"format": "something else"}')
    assert main(["show", str(bad)]) == 3
    assert "not a layerprof profile" in capsys.readouterr().err
    capsys.readouterr()
    assert main(["compare", str(a), str(tmp_path)]) == 3  # a folder is not a profile
    assert capsys.readouterr().err.strip().endswith(f"B '{tmp_path}' is a folder, not a profile file")
    # An output over the profile it reads would leave a file that no longer loads
    before = a.read_text()
    capsys.readouterr()
    assert main(["show", str(a), "--csv", str(a)]) == 2
    assert capsys.readouterr().err.strip() == (f"layerprof: error: --csv '{a}' is the profile this command reads; "
                                               "give the output another path")
    assert a.read_text() == before


def test_spec_run_writes_report_and_speedscope(tmp_path, capsys) -> None:
    report, speedscope = tmp_path / "r.html", tmp_path / "s.json"
    status = main(["torch.nn:Linear", "--kwargs", '{"in_features": 8, "out_features": 4}', "--input", "2,8",
                   "--warmup", "0", "--steps", "1", "--report", str(report), "--speedscope", str(speedscope)])
    assert status == 0
    assert '"type": "Linear"' in report.read_text()  # the page's data: the root module
    profiles = json.loads(speedscope.read_text())["profiles"]
    assert [len(p.get("events", p.get("samples"))) for p in profiles] == [2, 2, 1]  # open+close, once each


def test_an_internal_error_has_its_own_exit_status(saved, monkeypatch, capsys) -> None:
    a, _ = saved

    def bug(*args, **kwargs):
        raise AttributeError("'Namespace' object has no attribute 'metrics'")  # as `show --plot` did

    monkeypatch.setattr("layerprof.cli.saved.compare", bug)
    assert main(["compare", str(a), str(a)]) == 70
    assert capsys.readouterr().err == ("layerprof: internal error: AttributeError: 'Namespace' object has no attribute "
                                       "'metrics' (rerun with --debug for the traceback)\n")
    assert main(["compare", str(a), str(a), "--debug"]) == 70
    assert "Traceback (most recent call last)" in capsys.readouterr().err


def test_show_plot_draws_a_saved_profile(saved, tmp_path, capsys) -> None:
    """It failed with an internal AttributeError (the plot check read --metrics, which `show` has not)."""
    a, _ = saved
    path = tmp_path / "p.png"
    assert main(["show", str(a), "--plot", str(path)]) == 0
    assert path.read_bytes().startswith(b"\x89PNG")
    assert main(["show", str(a), "--plot", str(tmp_path / "f.png"), "--plot-metric", "flops"]) == 2
    assert ("layerprof: error: --plot-metric: cannot plot metric 'flops': no record of this profile holds the field"
            in capsys.readouterr().err)
    assert not (tmp_path / "f.png").exists()


@pytest.mark.parametrize("argv, message", [
    (["--plot", "PLOT", "--plot-kind", "roofline"],
     "--plot-kind roofline: 'A' was saved without the flops meter's figures (FLOPs and bytes): profile with "
     "--metrics flops --json PATH"),
    (["--columns", "flops,bound"],
     "--columns flops,bound: 'A' was saved without the flops meter's figures: profile with --metrics flops --json "
     "PATH"),
    (["--columns", "forward,saved_bytes"],
     "--columns forward,saved_bytes: 'A' was saved without the memory meter's figures: profile with --metrics memory "
     "--json PATH"),
    (["--plot", "PLOT", "--plot-kind", "checkpoint"],
     "--plot-kind checkpoint: 'A' was saved without the memory meter's figures, which the frontier of checkpoint "
     "plans is drawn from: profile with --metrics memory --json PATH"),
    (["--checkpoint-budget", "50%"],
     "--checkpoint-budget: ValueError: checkpoint_plan needs the saved-for-backward bytes of every module, and it "
     "has no memory figures: profile a training step (forward and backward) with LayerProf(model, "
     "metrics=(\"memory\", \"shapes\")) and plan on that (from the shell: layerprof SPEC --metrics memory --json "
     "PATH)"),
])
def test_show_refuses_what_the_saved_profile_cannot_give_before_printing(saved, tmp_path, capsys, argv,
                                                                         message) -> None:
    """Asked for figures of a meter the profile was saved without, ``show`` printed the whole summary, then failed
    (a roofline plot, a checkpoint plan) or printed "—" in every row and exited 0 (columns): now a usage error,
    and nothing printed before it."""
    a, _ = saved
    plot = tmp_path / "r.png"
    argv = [str(plot) if arg == "PLOT" else arg for arg in argv]
    assert main(["show", str(a), *argv]) == 2
    out, err = capsys.readouterr()
    assert out == "" and not plot.exists()
    assert err.strip() == "layerprof: error: " + message.replace("'A'", repr(str(a)))


@pytest.fixture(scope="module")
def elsewhere(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A profile with FLOPs saved on another host without its roofs (as files were before they held them)."""
    net = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 8))
    with LayerProf(net, metrics=("flops",), peaks={"flops": 1e11, "bandwidth": 1e10}) as prof:
        for _ in range(3):
            net(torch.randn(16, 64)).sum().backward()
            prof.step()
    doc = json.loads(prof.to_json())
    del doc["meta"]["peaks"]
    doc["meta"]["environment"]["host"] = "gpu-node-17"
    path = tmp_path_factory.mktemp("elsewhere") / "other.json"
    path.write_text(json.dumps(doc))
    return path


@pytest.mark.parametrize("argv, asked", [
    (["--plot", "PLOT", "--plot-kind", "roofline"], "--plot-kind roofline"),
    (["--columns", "forward,bound"], "--columns forward,bound"),
])
def test_show_refuses_roofline_figures_of_another_machine_without_its_roofs(elsewhere, tmp_path, capsys, argv,
                                                                          asked) -> None:
    """Before, this machine's roofs were measured and the file's modules held against them: a wrong roofline,
    without a word. Now a usage error before anything is printed, naming that machine and --peaks."""
    plot = tmp_path / "r.png"
    argv = [str(plot) if arg == "PLOT" else arg for arg in argv]
    assert main(["show", str(elsewhere), *argv]) == 2
    out, err = capsys.readouterr()
    assert out == "" and not plot.exists()
    assert err.strip() == (
        f"layerprof: error: {asked}: {str(elsewhere)!r} holds no roofs: it was measured on another machine (host "
        "'gpu-node-17'), whose roofs were not saved with it, and this machine's would be wrong for it. Give that "
        "machine's roofs with --peaks FLOPS,BANDWIDTH (FLOP/s, bytes/s: its spec sheet, or layerprof.peaks() run "
        "there)")


def test_show_holds_a_file_against_the_roofs_given_with_peaks(elsewhere, tmp_path, capsys) -> None:
    plot = tmp_path / "r.png"
    assert main(["show", str(elsewhere), "--columns", "bound", "--peaks", "1e11,1e10", "--plot", str(plot),
                 "--plot-kind", "roofline"]) == 0
    out = capsys.readouterr().out
    # Held against the given roofs: a bound for the model and each of its three modules (none without, "—").
    assert out.count("Bound: ") == 4 and "Bound: —" not in out and plot.read_bytes().startswith(b"\x89PNG")
    assert main(["show", str(elsewhere), "--peaks", "1e11"]) == 2
    assert ("argument --peaks: expected FLOPS,BANDWIDTH in FLOP/s and bytes/s such as 989e12,3.35e12, got '1e11'"
            in capsys.readouterr().err)
    assert main(["show", str(elsewhere), "--peaks", "0,1e10"]) == 2
    assert "expected two positive finite numbers, got '0,1e10'" in capsys.readouterr().err


def test_show_says_when_this_machines_roofs_cannot_be_measured_for_a_file(elsewhere, tmp_path, capsys) -> None:
    """A file of this machine without roofs is measured here; a dtype no matmul takes failed as an internal error
    (exit 70)."""
    import socket

    doc = json.loads(elsewhere.read_text())
    doc["meta"]["environment"].update(host=socket.gethostname(), dtype="bool")
    doc["meta"]["environment"].pop("cpu", None)
    doc["meta"].pop("flops", None)  # (a file saved before the flops meter named the dtype its FLOPs ran in)
    path = tmp_path / "bool.json"
    path.write_text(json.dumps(doc))
    assert main(["show", str(path), "--columns", "bound"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and (f"layerprof: error: --columns bound: {str(path)!r} holds no roofs, and this machine's could "
                          "not be measured for it (NotImplementedError: ") in err
    assert err.rstrip().endswith("Give them with --peaks FLOPS,BANDWIDTH (FLOP/s, bytes/s)")
