"""``layerprof compare --fail-if-slower``: a gate on the median step and the noise of both profiles
(``render/gate.py``), its refusal of two different models, its exit statuses; the per-step times it reads."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

import layerprof
from layerprof import LayerProf
from layerprof.cli import main
from layerprof.profile import Profile
from layerprof.record.records import ModuleRecord
from layerprof.render.gate import Gate, different_models, model_spread


def _set_stats(record: ModuleRecord, name: str, values: list[float]) -> None:
    setattr(record, f"{name}_ms", float(np.mean(values)))
    median, p95 = np.percentile(values, [50, 95])
    stats = {"median": median, "min": min(values), "max": max(values), "p95": p95,
             "std": float(np.std(values, ddof=1)) if len(values) > 1 else 0.0}
    for statistic, value in stats.items():
        setattr(record, f"{name}_ms_{statistic}", float(value))


def make_profile(modules: dict[str, tuple[str, list[float], list[float] | None]], series: bool = True,
                 batch: int = 2) -> Profile:
    """A profile whose modules took these forward (and backward) times in each step; ``series``: the model's
    per-step times in ``meta["step_ms"]`` as this version writes them (else only the statistics, as older files)."""
    records: dict[str, ModuleRecord] = {}
    steps = len(next(iter(modules.values()))[1])
    for name, (type_name, forward, backward) in modules.items():
        parent = None if name == "" else records[name.rpartition(".")[0]]
        record = records[name] = ModuleRecord(name, type_name, "", parent)
        record.steps, record.steps_run, record.calls = steps, steps, 1
        _set_stats(record, "forward", forward)
        if backward is not None:
            _set_stats(record, "backward", backward)
    meta: dict = {"steps": steps, "environment": {"batch_size": batch}}
    if series:
        _, forward, backward = modules[""]
        meta["step_ms"] = {"forward": forward, "backward": backward}
    return Profile(records[""], meta)


def write(tmp_path: Path, name: str, profile: Profile) -> str:
    path = tmp_path / name
    profile.to_json(path)
    return str(path)


def gate_run(tmp_path: Path, a: Profile, b: Profile, *options: str) -> list[str]:
    return ["compare", write(tmp_path, "a.json", a), write(tmp_path, "b.json", b), *options]


def model(forward: list[float], backward: list[float] | None = None, **children) -> dict:
    return {"": ("Net", forward, backward), **children}


def verdict_line(capsys: pytest.CaptureFixture[str]) -> str:
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("layerprof compare: ")]
    assert len(lines) == 1, lines
    return lines[0].removeprefix("layerprof compare: ")


def test_one_slow_step_is_not_a_regression(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a = make_profile(model([10, 10, 10], [20, 20, 20]))
    b = make_profile(model([10, 10, 40], [20, 20, 80]))  # one step 4x slower: another job on the machine
    # The old gate compared means: (30 + 30 + 120) / 3 = 60 ms against 30 ms, +100 %, exit 1. Medians: 30 -> 30.
    assert main(gate_run(tmp_path, a, b, "--fail-if-slower", "10")) == 0
    assert verdict_line(capsys).startswith("ok: total time per step (median) 30 ms -> 30 ms (+0.0 %), limit +10 %")


def test_a_shift_beyond_the_noise_fails(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a = make_profile(model([30, 30.3, 30.6]))
    b = make_profile(model([36, 36.36, 36.72]))  # every step 1.2x
    # medians 30.3 -> 36.36: +20.0 %; A's p95 30.3 + 0.9 * 0.3 = 30.57 < 36.36; B's fastest 36 > 30.3
    assert main(gate_run(tmp_path, a, b, "--fail-if-slower", "10")) == 1
    line = verdict_line(capsys)
    assert line.startswith("FAIL: B is slower: total time per step (median) 30.3 ms -> 36.4 ms (+20.0 %), limit +10 %")
    assert main(gate_run(tmp_path, a, b, "--fail-if-slower", "20.5")) == 0  # +20.0 % is within +20.5 %
    capsys.readouterr()


def test_a_change_within_the_noise_passes_and_says_so(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a = make_profile(model([30, 31, 45]))  # p95 = 31 + 0.9 * (45 - 31) = 43.6
    b = make_profile(model([34, 36, 37]))  # median 36: +16.1 % over 31, but below A's p95
    assert main(gate_run(tmp_path, a, b, "--fail-if-slower", "10")) == 0
    line = verdict_line(capsys)
    assert "(+16.1 %)" in line and "noise 46.2 %" in line  # (43.6 - 31) / 31 + (36 - 34) / 36
    assert line.endswith("the change is within the noise of the two profiles, not a regression")


def test_by_picks_the_pass(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a = make_profile(model([10, 10, 10], [20, 20, 20]))
    b = make_profile(model([10, 10, 10], [30, 30, 30]))  # backward +50 %, total +33.3 %, forward +0 %
    assert main(gate_run(tmp_path, a, b, "--fail-if-slower", "40", "--by", "backward")) == 1
    assert "backward time per step (median) 20 ms -> 30 ms (+50.0 %)" in verdict_line(capsys)
    assert main(gate_run(tmp_path, a, b, "--fail-if-slower", "40")) == 0  # total: +33.3 %
    assert main(gate_run(tmp_path, a, b, "--fail-if-slower", "0", "--by", "forward")) == 0
    capsys.readouterr()


def _layered(root: list[float], first: list[float], inner: list[float], tiny: list[float]) -> dict:
    """These 3 steps 4 times over: 12 steps, as --per-module needs 10 (medians as of the 3, p95 the largest)."""
    return model(root * 4, None, **{"0": ("Sequential", first * 4, None), "0.0": ("Linear", inner * 4, None),
                                    "1": ("ReLU", [20.0] * 12, None), "2": ("Identity", tiny * 4, None)})


def test_per_module_gate_names_the_innermost_slower_module(tmp_path: Path,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    a = make_profile(_layered([30, 30.1, 30.2], [3, 3, 3], [2.5, 2.5, 2.5], [0.1, 0.1, 0.1]))
    b = make_profile(_layered([32, 32.1, 32.2], [5, 5, 5], [4.5, 4.5, 4.5], [0.5, 0.5, 0.5]))
    # The model: 30.1 -> 32.1 ms, +6.6 %, under the limit. Module 0.0: 2.5 -> 4.5 ms, +80 %; its parent 0 is left
    # out (its change is its child's); module 2 (+400 %) is 0.1 / 30.1 = 0.3 % of the model, under the 1 % floor.
    assert main(gate_run(tmp_path, a, b, "--fail-if-slower", "10")) == 0
    line = verdict_line(capsys)
    assert line.startswith("ok: total time per step (median) 30.1 ms -> 32.1 ms (+6.6 %)")
    # Against the rest of the model: 2.5 / (30.1 - 2.5) -> 4.5 / (32.1 - 4.5), the rest 27.6 ms both times: +80 %
    assert line.endswith("slower (against the rest of the model) beyond the limit but not gated (add --per-module): "
                         "0.0 2.5 ms -> 4.5 ms (+80.0 %)")
    assert main(gate_run(tmp_path, a, b, "--fail-if-slower", "10", "--per-module")) == 1
    line = verdict_line(capsys)
    assert line.startswith("FAIL: modules of B are slower: total time per step (median) 30.1 ms -> 32.1 ms (+6.6 %), "
                           "limit +10 %, noise 0.6 % (12 and 12 steps)")  # (30.2 - 30.1) / 30.1 + 0.1 / 32.1
    assert line.endswith("; slower (against the rest of the model): 0.0 2.5 ms -> 4.5 ms (+80.0 %)")
    gate = Gate(make_profile(_layered([30] * 3, [3] * 3, [2.5] * 3, [0.1] * 3)), b, 10)
    assert [verdict.name for verdict in gate.modules] == ["0", "0.0"]  # "2" under the 1 % floor, "1" over 50 %


def test_a_failing_total_names_the_modules_that_got_slower(tmp_path: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    a = make_profile(_layered([30, 30.1, 30.2], [3, 3, 3], [2.5, 2.5, 2.5], [0.1] * 3))
    b = make_profile(_layered([40, 40.1, 40.2], [13, 13, 13], [12.5, 12.5, 12.5], [0.1] * 3))
    assert main(gate_run(tmp_path, a, b, "--fail-if-slower", "10")) == 1
    # noise: (30.2 - 30.1) / 30.1 + (40.1 - 40) / 40.1 = 0.58 %
    assert verdict_line(capsys).endswith("(+33.2 %), limit +10 %, noise 0.6 % (12 and 12 steps); "
                                         "slower (against the rest of the model): 0.0 2.5 ms -> 12.5 ms (+400.0 %)")


def test_a_machine_slower_for_every_module_fails_the_model_but_names_no_module(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    scaled = [[value * 1.3 for value in values] for values in ([30, 30.1, 30.2], [3] * 3, [2.5] * 3, [0.1] * 3)]
    a = make_profile(_layered([30, 30.1, 30.2], [3] * 3, [2.5] * 3, [0.1] * 3))
    b = make_profile(_layered(*scaled))  # "1" stays at 20 ms: its share drops, so none of the others rises
    assert main(gate_run(tmp_path, a, b, "--fail-if-slower", "10", "--per-module")) == 1
    line = verdict_line(capsys)
    assert line.startswith("FAIL: B is slower: total time per step (median) 30.1 ms -> 39.1 ms (+30.0 %)")
    assert "against the rest" not in line


def test_a_module_that_got_faster_does_not_make_the_others_slower(tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    # Module "1" 20 -> 2 ms, nothing else moved: against the rest of the model alone, the rest fell (30.1 - 2.5 =
    # 27.6 -> 12.1 - 2.5 = 9.6 ms) and the unchanged 0.0 read +188 % "slower", failing a pure speed-up.
    a = make_profile(_layered([30, 30.1, 30.2], [3] * 3, [2.5] * 3, [0.1] * 3))
    faster = _layered([12, 12.1, 12.2], [3] * 3, [2.5] * 3, [0.1] * 3)
    faster["1"] = ("ReLU", [2.0] * 12, None)
    b = make_profile(faster)
    assert main(gate_run(tmp_path, a, b, "--fail-if-slower", "10", "--per-module")) == 0
    # noise: (30.2 - 30.1) / 30.1 + (12.1 - 12) / 12.1 = 1.2 %
    assert verdict_line(capsys) == ("ok: total time per step (median) 30.1 ms -> 12.1 ms (-59.8 %), limit +10 %, "
                                    "noise 1.2 % (12 and 12 steps)")
    gate = Gate(a, b, 10)
    inner = next(verdict for verdict in gate.modules if verdict.name == "0.0")
    assert inner.change > 100 and inner.beyond_noise and not inner.slower  # (against the rest alone it was)


def test_two_different_models_are_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    small = make_profile(model([10] * 3, None, fc=("Linear", [9] * 3, None)))
    other = make_profile({"": ("ResNet", [60] * 3, None), "fc": ("Linear", [1] * 3, None)})
    # The old gate: "ok -83.9 %" on two different models.
    assert main(gate_run(tmp_path, other, small, "--fail-if-slower", "10")) == 4
    assert ("--fail-if-slower: A and B are not profiles of the same model (A is a ResNet and B a Net); a gate "
            "compares one model before and after a change") in capsys.readouterr().err
    wider = make_profile(model([10] * 3, None, fc=("Linear", [9] * 3, None), fc2=("Linear", [1] * 3, None),
                               act=("ReLU", [1] * 3, None), out=("Linear", [1] * 3, None)))
    assert main(gate_run(tmp_path, small, wider, "--fail-if-slower", "10")) == 4
    assert "only 2 of their 5 modules are alike by name and type (A has 2, B 5)" in capsys.readouterr().err
    bigger_batch = make_profile(model([10] * 3, None, fc=("Linear", [9] * 3, None)), batch=8)
    assert main(gate_run(tmp_path, small, bigger_batch, "--fail-if-slower", "10")) == 4
    assert "A was profiled with batch size 2 and B with 8" in capsys.readouterr().err
    assert main(gate_run(tmp_path, other, small)) == 0  # without the gate: the comparison is printed
    one_more = make_profile(model([10] * 3, None, fc=("Linear", [9] * 3, None), act=("ReLU", [1] * 3, None)))
    assert main(gate_run(tmp_path, small, one_more, "--fail-if-slower", "10")) == 0  # 2 of 3 alike: one model
    capsys.readouterr()


def test_a_short_first_batch_does_not_make_another_workload(tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    # The batch size was the first call's: a profile whose first batch was short (8, then 32s) was refused
    # against one of 32s as another workload, and one whose first batch was long accepted against short ones.
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1))
    paths = []
    for batches in ([8] + [32] * 5, [32] * 6):
        with LayerProf(net) as prof:
            for rows in batches:
                net(torch.randn(rows, 16)).sum().backward()
                prof.step()
        paths.append(tmp_path / f"{len(paths)}.json")
        prof.profile.to_json(paths[-1])
    first, second = (layerprof.load(path) for path in paths)
    assert first.meta["environment"]["batch_size"] == 32 and first.meta["environment"]["batch_sizes"] == [[8, 1],
                                                                                                         [32, 5]]
    assert second.meta["environment"]["batch_size"] == 32 and "batch_sizes" not in second.meta["environment"]
    assert main(["compare", str(paths[0]), str(paths[1]), "--fail-if-slower", "1000"]) == 0
    capsys.readouterr()


def test_forward_only_against_training_and_meters_slowing_a_step_are_refused(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # Before: a forward-only reference against a training run of the same model failed the gate (+100 %: A's
    # forward read as its total), and a one-step profile timed with the flops and memory meters running against a
    # clean one failed it by +1,270 %, each without a word.
    forward_only = make_profile(model([30, 30.3, 30.6]))
    training = make_profile(model([30, 30.3, 30.6], [30, 30.3, 30.6]))
    assert main(gate_run(tmp_path, forward_only, training, "--fail-if-slower", "10")) == 4
    assert ("A and B were not measured the same way (A's steps ran forward only and B's forward and backward)"
            in capsys.readouterr().err)
    slowed = make_profile(model([30, 30.3, 30.6], [30, 30.3, 30.6]))
    slowed.meta["timing_distorted_by"] = ["flops", "memory"]
    assert main(gate_run(tmp_path, training, slowed, "--fail-if-slower", "10")) == 4
    out, err = capsys.readouterr()
    assert ("A and B were not measured the same way (B's times include the overhead of metrics ['flops', "
            "'memory'] (its one profiled step ran them))") in err
    assert "Measured otherwise: B's times include the overhead of metrics" in out  # (the comparison says so too)
    assert main(gate_run(tmp_path, training, make_profile(model([30, 30.3, 30.6], [30, 30.3, 30.6])),
                         "--fail-if-slower", "10")) == 0


def test_two_runs_measured_otherwise_are_refused_and_other_machines_noted(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # Before, a reference of 8 threads against a run of 2 (or float32 against bfloat16, CPU against GPU) failed
    # or passed the gate on the setting alone.
    def run(**environment: object) -> Profile:
        profile = make_profile(model([30, 30.3, 30.6]))
        profile.meta["environment"].update({"device": "cpu", "dtype": "float32", "threads": 8, **environment})
        return profile

    reference = run(cpu="AMD EPYC 7B13", torch="2.14.1")
    assert main(gate_run(tmp_path, reference, run(threads=2, dtype="bfloat16"), "--fail-if-slower", "10")) == 4
    assert ("--fail-if-slower: A and B were not measured the same way (A ran in float32, with 8 threads and B in "
            "bfloat16, with 2 threads); a gate compares two runs made alike: profile both with the same --device, "
            "--dtype and --threads") in capsys.readouterr().err
    assert main(gate_run(tmp_path, reference, run(device="cuda:0"), "--fail-if-slower", "10")) == 4
    assert "(A ran on cpu and B on cuda)" in capsys.readouterr().err
    # On GPUs: another index of the same GPU model, or another host thread count, is the same run.
    on_gpu = run(device="cuda:0", gpu="NVIDIA H100 80GB HBM3")
    assert main(gate_run(tmp_path, on_gpu, run(device="cuda:1", gpu="NVIDIA H100 80GB HBM3", threads=2),
                         "--fail-if-slower", "10")) == 0
    assert "note:" not in capsys.readouterr().err
    # Another CPU model or torch: gated, with a note that the verdict holds that difference.
    assert main(gate_run(tmp_path, reference, run(cpu="Intel Xeon 8480", torch="2.14.1"), "--fail-if-slower", "10")) == 0
    err = capsys.readouterr().err
    assert ("layerprof: note: A ran CPU 'AMD EPYC 7B13' and B CPU 'Intel Xeon 8480'; the verdict below holds that "
            "difference too") in err
    assert "layerprof compare: ok: total time per step (median)" in err
    # Alike (host names aside, which CI runners change): no note.
    assert main(gate_run(tmp_path, reference, run(cpu="AMD EPYC 7B13", torch="2.14.1", host="runner-2"),
                         "--fail-if-slower", "10")) == 0
    assert "note:" not in capsys.readouterr().err


@pytest.mark.parametrize("limit", ["nan", "inf", "-5", "ten", "-inf"])
def test_a_limit_that_is_not_a_percentage_is_a_usage_error(limit: str, tmp_path: Path,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    a = make_profile(model([10] * 3))
    assert main(gate_run(tmp_path, a, a, f"--fail-if-slower={limit}")) == 2
    expected = "a percentage" if limit == "ten" else "a finite percentage >= 0"
    assert f"argument --fail-if-slower: expected {expected} such as 10, got {limit!r}" in capsys.readouterr().err


def test_by_without_a_limit_is_a_usage_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # Before: `compare A B --by forward` printed the comparison it prints without --by: the option was dropped.
    a = make_profile(model([10] * 3))
    assert main(gate_run(tmp_path, a, a, "--by", "forward")) == 2
    assert ("--by forward chooses the time the --fail-if-slower limit checks: give --fail-if-slower PCT"
            in capsys.readouterr().err)


def test_per_module_needs_a_limit_and_ten_steps(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a = make_profile(model([10] * 3))
    assert main(gate_run(tmp_path, a, a, "--per-module")) == 2
    assert "--per-module applies the --fail-if-slower limit to each module" in capsys.readouterr().err
    assert main(gate_run(tmp_path, make_profile(model([10] * 12)), a, "--fail-if-slower", "5", "--per-module")) == 2
    assert "--per-module needs at least 10 recorded steps in each profile, and B has 3" in capsys.readouterr().err
    assert Gate(a, a, 5).modules == [] and Gate(a, a, 5).failed(per_module=True) is False


def test_a_profile_without_the_pass_is_unreadable_input(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    forward_only = make_profile(model([10] * 3))
    assert main(gate_run(tmp_path, forward_only, forward_only, "--fail-if-slower", "5", "--by", "backward")) == 3
    assert "profile A holds no backward time to compare" in capsys.readouterr().err


def test_files_without_step_times_use_the_root_statistics(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a = make_profile(model([10, 10.1, 10.2], [20, 20, 20]), series=False)
    b = make_profile(model([10, 10.1, 40], [30, 30, 30]), series=False)
    # No per-step totals: the median of the total is the sum of the passes' medians, 10.1 + 20 -> 10.1 + 30.
    assert "step_ms" not in json.loads(Path(write(tmp_path, "old.json", a)).read_text())["meta"]
    assert main(gate_run(tmp_path, a, b, "--fail-if-slower", "10")) == 1
    assert "30.1 ms -> 40.1 ms (+33.2 %)" in verdict_line(capsys)


# -- the per-step times a real profile keeps ----------------------------------------------------------------------
class Wrapper(nn.Module):
    """A trainer's module: its children are called, never the module itself."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(8, 16), nn.ReLU())
        self.head = nn.Linear(16, 1)


def test_a_profile_keeps_the_model_time_of_every_step(tmp_path: Path) -> None:
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
    with LayerProf(net) as prof:
        for step in range(5):
            net(torch.randn(4, 8)).sum().backward()
            if step < 4:
                prof.step()
    series = prof.meta["step_ms"]
    root = prof.tree
    assert len(series["forward"]) == len(series["backward"]) == 5
    # The series is what the root's statistics were taken over (rounded to the nanosecond).
    assert float(np.median(series["forward"])) == pytest.approx(root.forward_ms_median, abs=1e-6)
    assert min(series["backward"]) == pytest.approx(root.backward_ms_min, abs=1e-6)
    assert float(np.mean(series["forward"])) == pytest.approx(root.forward_ms, abs=1e-6)
    path = tmp_path / "p.json"
    prof.to_json(path)
    loaded = layerprof.load(path)
    assert loaded.meta["step_ms"] == series
    spread = model_spread(loaded)
    totals = [f + b for f, b in zip(series["forward"], series["backward"])]
    assert (spread.median, spread.low, spread.steps) == (pytest.approx(float(np.median(totals))), min(totals), 5)


@pytest.mark.parametrize("steps", [1, 3])
def test_a_root_never_called_totals_its_top_level_modules(steps: int) -> None:
    wrapper = Wrapper()
    with LayerProf(wrapper) as prof:
        for step in range(steps):
            wrapper.head(wrapper.body(torch.randn(4, 8))).sum().backward()
            if step < steps - 1:
                prof.step()
    series = prof.meta["step_ms"]
    body, head = prof.profile.records["body"], prof.profile.records["head"]
    assert len(series["forward"]) == steps
    assert float(np.mean(series["forward"])) == pytest.approx(body.forward_ms + head.forward_ms, abs=1e-5)
    assert float(np.mean(series["backward"])) == pytest.approx(body.backward_ms + head.backward_ms, abs=1e-5)


def test_forward_only_has_no_backward_series() -> None:
    net = nn.Linear(4, 2)
    with torch.no_grad(), LayerProf(net) as prof:
        net(torch.randn(2, 4))
    assert prof.meta["step_ms"]["backward"] is None and len(prof.meta["step_ms"]["forward"]) == 1


def test_inputs_of_another_shape_beyond_the_batch_are_another_workload(tmp_path: Path,
                                                                       capsys: pytest.CaptureFixture[str]) -> None:
    # Batch 4, sequence 16 against sequence 128: gated as one workload, it failed with +322 % (or passed, under load).
    def profiled(length: int) -> Profile:
        model = nn.Sequential(nn.Embedding(100, 16), nn.Linear(16, 16))
        with LayerProf(model) as prof:
            for _ in range(2):
                model(torch.randint(0, 100, (4, length))).sum().backward()
                prof.step()
        return prof.profile

    short, long = profiled(16), profiled(128)
    assert short.meta["environment"]["input_shape"] == [4, 16]
    assert main(gate_run(tmp_path, short, long, "--fail-if-slower", "10")) == 4
    assert ("A was profiled on inputs of shape [4, 16] and B on [4, 128] (other than the batch: another sequence "
            "length or image size)") in capsys.readouterr().err
    assert different_models(short, profiled(16)) is None
    # Dynamic padding: each batch its own length, two runs in another order. Every shape is the workload's: no one
    # input shape is kept, and the two are not refused.
    def padded(lengths: list[int]) -> Profile:
        model = nn.Sequential(nn.Embedding(100, 16), nn.Linear(16, 16))
        with LayerProf(model) as prof:
            for length in lengths:
                model(torch.randint(0, 100, (4, length))).sum().backward()
                prof.step()
        return prof.profile

    first, second = padded([24, 21, 17]), padded([21, 17, 24])
    assert "input_shape" not in first.meta["environment"] and different_models(first, second) is None


def test_a_profile_that_recorded_no_step_is_said_so(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # A block that ran no step was refused as "forward only" against a full profile (exit 4, advice on backward),
    # and gating two such files on --by forward advised --by forward; `show --plot` blamed --plot-metric.
    net = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 1))
    with pytest.warns(RuntimeWarning, match="recorded no step"):
        with LayerProf(net) as empty:
            pass
    with LayerProf(net) as full:
        for _ in range(3):
            net(torch.randn(4, 8)).sum().backward()
            full.step()
    a, b = str(tmp_path / "empty.json"), str(tmp_path / "full.json")
    empty.to_json(a)
    full.to_json(b)
    for argv in ([a, b], [a, a, "--by", "forward"], [b, a]):
        assert main(["compare", *argv, "--fail-if-slower", "10"]) == 3
        err = capsys.readouterr().err
        which = "A" if argv[0] == a else "B"
        assert f"profile {which} ('{a}') recorded no step, so it holds no time to gate on" in err, err
    assert main(["show", a, "--plot", str(tmp_path / "x.png")]) == 3
    assert capsys.readouterr().err.strip() == (f"layerprof: error: --plot: '{a}' recorded no step, so it holds no "
                                               "'total' figure to plot: profile at least one step")
    assert not (tmp_path / "x.png").exists()
