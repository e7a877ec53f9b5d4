"""The roofline: machine peaks (measured or given), per-module attainable time, efficiency, bound, lost time.

Classification runs on this CPU against its measured peaks. The machine is shared, so a module's mean time
can be inflated by other processes while the peaks are the best of several repeats: the efficiency tests take
the best of a few short profiles, as ``peaks()`` takes the best of a few repeats."""
from __future__ import annotations

import json
import re
import time

import pytest
import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

import layerprof
from layerprof import LayerProf
from layerprof.metrics.roofline import OVERHEAD_RATIO
from layerprof.record.fields import FIELDS

GIVEN = {"flops": 1e9, "bandwidth": 1e6}  # 1 GFLOP/s, 1 MB/s: round numbers for exact figures


def profile(model: nn.Module, make_input, steps: int = 3, **kwargs) -> LayerProf:
    """Several steps, so that times come from steps the flops meter did not slow down."""
    with LayerProf(model, metrics=("flops",), **kwargs) as prof:
        for _ in range(steps):
            out = model(make_input())
            if out.requires_grad:  # a dense gradient: the ones of .sum()'s backward are a stride-0 expand,
                out.backward(torch.ones_like(out))  # which sends a matmul off its fast kernel
            prof.step()
    return prof


def best_of(attempts: int, make_profile, name: str, enough: float = 1.0):
    """The record of ``name`` with the highest efficiency over up to ``attempts`` profiles (the least disturbed
    by the other processes on this machine), stopping at one that reaches ``enough``."""
    best = None
    for _ in range(attempts):
        record = make_profile().profile.records[name]
        if best is None or FIELDS["efficiency"].value(record) > FIELDS["efficiency"].value(best):
            best = record
        if FIELDS["efficiency"].value(best) >= enough:
            break
    return best


def test_peaks_measured_once_and_cached() -> None:
    roofs = layerprof.peaks("cpu")
    assert roofs is layerprof.peaks("cpu") is layerprof.peaks(torch.device("cpu"), torch.float32)
    assert roofs["device"] == "cpu" and roofs["dtype"] == "float32" and roofs["source"] == "measured"
    assert roofs["threads"] == torch.get_num_threads() == 1  # conftest runs single-threaded
    # a plausible CPU core: between 1 GFLOP/s and 10 TFLOP/s, between 100 MB/s and 1 TB/s
    assert 1e9 < roofs["flops"] < 1e13 and 1e8 < roofs["bandwidth"] < 1e12


def test_given_peaks_give_exact_figures_and_are_not_measured(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(layerprof.profile, "measure_peaks", lambda *a, **k: pytest.fail("peaks were measured"))
    net = nn.Linear(8, 16)
    prof = profile(net, lambda: torch.randn(4, 8), peaks=GIVEN)
    record = prof.tree
    assert prof.meta["peaks"] == {**GIVEN, "source": "given"}
    # forward only (no input needs a gradient; the sum's backward reaches the weight): own ops are the addmm
    # (2*4*8*16 = 1024 FLOPs, 960 bytes, see test_bytes) and the weight and bias gradients: g^T @ x
    # (2*16*4*8 = 1024 FLOPs; reads g 256 + x 128, writes 512) and g.sum(0) (reads 256, writes 64)
    assert record.self_flops == 1024 + 1024 and record.self_bytes == 960 + 896 + 320
    row, self_ms = prof.roofline()[0], record.self_forward_ms + record.self_backward_ms
    # compute 2048 / 1e9 s = 0.002048 ms; memory 2176 / 1e6 s = 2.176 ms: memory is the larger term
    assert row["attainable_ms"] == pytest.approx(2.176)
    assert row["efficiency"] == pytest.approx(2.176 / self_ms)
    assert row["self_intensity"] == pytest.approx(2048 / 2176)
    assert row["lost_ms"] == pytest.approx(max(0.0, self_ms - 2.176))
    assert row["bound"] == ("overhead" if self_ms > OVERHEAD_RATIO * 2.176 else "memory")


def _counted_roofs(monkeypatch: pytest.MonkeyPatch, flops: float, bandwidth: float) -> tuple[list[tuple], LayerProf]:
    """Roofs measured as ``(flops, bandwidth)``, each measurement noted in the list; and a profile with FLOPs."""
    calls: list[tuple] = []
    monkeypatch.setattr(layerprof.profile, "measure_peaks",
                        lambda *args, **kwargs: calls.append(args) or {"flops": flops, "bandwidth": bandwidth})
    return calls, profile(nn.Sequential(nn.Linear(8, 8), nn.ReLU()), lambda: torch.randn(4, 8))


def test_peaks_measured_only_when_a_roofline_figure_is_read(monkeypatch: pytest.MonkeyPatch) -> None:
    calls, prof = _counted_roofs(monkeypatch, 1e9, 1e9)
    prof.layerwise_summary(), prof.top(3), prof.rows(), prof.to_csv()
    assert calls == [] and "peaks" not in prof.meta
    assert prof.layerwise_summary(columns=("bound",)).count("Bound: ") == 3
    assert calls == [("cpu", "float32")] and prof.meta["peaks"]["flops"] == 1e9
    prof.roofline(), prof.top(2, by="lost_ms"), prof.to_report(), prof.to_json()
    assert len(calls) == 1  # kept in meta: measured once per profile (and cached per process)


def test_a_saved_profile_holds_the_roofs_of_the_machine_that_measured_it(monkeypatch: pytest.MonkeyPatch) -> None:
    # Only a process on the machine that measured a profile can measure its roofs: saving one with FLOPs measures
    # them (where nothing read them yet), and a file read elsewhere holds its modules against those.
    calls, prof = _counted_roofs(monkeypatch, 2e9, 4e8)
    saved = json.loads(prof.to_json())
    assert calls == [("cpu", "float32")] and saved["meta"]["peaks"] == {"flops": 2e9, "bandwidth": 4e8}
    saved["meta"]["environment"].update(host="gpu-node-17", cpu="Intel(R) Xeon(R) Platinum 8480+")
    elsewhere = layerprof.loads(json.dumps(saved))
    assert elsewhere.peaks() == {"flops": 2e9, "bandwidth": 4e8}
    assert [row["bound"] for row in elsewhere.roofline()] == [row["bound"] for row in prof.roofline()]
    assert len(calls) == 1


def test_a_file_from_another_machine_without_roofs_is_not_held_against_this_ones(
        monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    # Saved before files held their roofs (or written by hand): this machine's would put its modules against the
    # wrong roofs (before: measured here, silently). Said so, with the way to give that machine's.
    calls, prof = _counted_roofs(monkeypatch, 2e9, 4e8)
    saved = json.loads(prof.to_json())
    del saved["meta"]["peaks"]
    here = layerprof.loads(json.dumps(saved))  # this machine's file: measured here, as before
    assert here.peaks() == {"flops": 2e9, "bandwidth": 4e8} and len(calls) == 2
    saved["meta"]["environment"]["host"] = "gpu-node-17"
    text = json.dumps(saved)
    elsewhere = layerprof.loads(text)
    assert elsewhere.peaks() is None and len(calls) == 2
    with pytest.raises(ValueError, match=r"another machine \(host 'gpu-node-17'\).*layerprof.load\(path, peaks="):
        elsewhere.roofline()
    with pytest.raises(ValueError, match="host 'gpu-node-17'"):
        elsewhere.plot("roofline")
    with pytest.raises(ValueError, match="cannot rank by 'lost_ms': no roofs for this profile: .*'gpu-node-17'"):
        elsewhere.top(2, by="lost_ms")  # (before: a list of the fields it could rank by, roofs not named)
    assert 'id="roofline-section"' not in elsewhere.to_report()  # the report leaves the panel out
    given = layerprof.loads(text, peaks={"flops": 2e9, "bandwidth": 4e8, "source": "datasheet"})
    assert [row["bound"] for row in given.roofline()] == [row["bound"] for row in prof.roofline()]
    assert 'id="roofline-section"' in given.to_report()
    path = tmp_path / "elsewhere.json"
    path.write_text(text)
    assert layerprof.load(path, peaks={"flops": 2e9, "bandwidth": 4e8}).peaks()["source"] == "given"
    with pytest.raises(ValueError, match="'bandwidth'"):
        layerprof.load(path, peaks={"flops": 2e9})  # checked before the file is read
    assert len(calls) == 2
    # An environment written by hand that is not a dict names no machine: this one's roofs, not an AttributeError.
    saved["meta"]["environment"] = "by hand"
    assert layerprof.loads(json.dumps(saved)).peaks() == {"flops": 2e9, "bandwidth": 4e8}


def test_a_save_whose_roofs_cannot_be_measured_is_saved_without_them(monkeypatch: pytest.MonkeyPatch) -> None:
    # Saving measures the roofs; a measurement that fails (no matmul for the model's dtype, such as int8 on CUDA;
    # out of memory at the end of a run) must not lose the profile: before, to_json raised it.
    def fail(*args, **kwargs):
        raise NotImplementedError("\"addmm_cuda\" not implemented for 'Char'")

    prof = profile(nn.Sequential(nn.Linear(8, 8), nn.ReLU()), lambda: torch.randn(4, 8))
    monkeypatch.setattr(layerprof.profile, "measure_peaks", fail)
    with pytest.warns(RuntimeWarning, match=r"roofs could not be measured for the file \(NotImplementedError: "
                                            r"\"addmm_cuda\" not implemented for 'Char'\).*peaks="):
        text = prof.to_json()
    assert "peaks" not in json.loads(text)["meta"]
    assert layerprof.loads(text).layerwise_summary() == prof.layerwise_summary()


def test_measuring_the_roofs_leaves_the_random_stream_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    # Saving a profile with FLOPs measures the roofs: a script that saves its profile must draw the same numbers
    # after it as one that does not (before, the matmul's operands were drawn from torch's default generator).
    monkeypatch.setattr("layerprof.metrics.peaks._CACHE", {})
    torch.manual_seed(0)
    expected = torch.rand(4)
    torch.manual_seed(0)
    layerprof.peaks("cpu", threads=1)
    assert torch.equal(torch.rand(4), expected)


def test_bad_peaks_are_refused_early() -> None:
    net = nn.Linear(2, 2)
    with pytest.raises(ValueError, match="'bandwidth'"):
        LayerProf(net, peaks={"flops": 1e12})
    with pytest.raises(ValueError, match=r"peaks\['flops'\] must be a positive"):
        LayerProf(net, peaks={"flops": -1, "bandwidth": 1e9})
    with pytest.raises(TypeError, match="peaks must be a dict"):
        LayerProf(net, peaks=1e12)
    with pytest.raises(ValueError, match="unknown dtype"):
        layerprof.peaks("cpu", "float7")


@pytest.mark.parametrize("kwargs, error, message", [
    # Before: torch's "set_num_threads expects a positive integer" (a RuntimeError) for 0 and -1; 2.5 ran on 2
    # threads and "4" on 4, each cached and saved as asked.
    (dict(threads=0), ValueError, "peaks: threads must be >= 1 or None, got 0"),
    (dict(threads=2.5), TypeError, "peaks: threads must be an int >= 1 or None, got 2.5 (float)"),
    (dict(threads="4"), TypeError, "peaks: threads must be an int >= 1 or None, got '4' (str)"),
    # Before: torch's "Expected one of cpu, cuda, ipu, xpu, mkldnn, ... device type at start of device string"
    (dict(device="cup"), ValueError, "peaks: device 'cup' is not a device: give 'cpu', 'cuda', 'cuda:1' or a "
     "torch.device"),
])
def test_bad_peaks_arguments_name_the_argument(kwargs: dict, error: type, message: str) -> None:
    with pytest.raises(error, match="^" + re.escape(message) + "$"):
        layerprof.peaks(**kwargs)


def test_big_matmul_is_compute_bound_near_the_roof(monkeypatch: pytest.MonkeyPatch) -> None:
    net = nn.Linear(512, 512, bias=False)  # the peak's own 512 x 512 x 512 matmul
    x = torch.randn(512, 512)
    ratios = []
    # Up to three tries, each with the peaks measured afresh beside the profile: the peaks are cached per process,
    # and a peak measured earlier in the suite in a moment the machine was busy would misjudge every later step.
    for _ in range(3):
        monkeypatch.setattr("layerprof.metrics.peaks._CACHE", {})
        # Forward only, many steps of one 3 ms kernel: on this shared machine the mean step is slowed by the other
        # processes by a varying factor, the fastest step much less so (as the peaks are the fastest of repeats).
        with torch.no_grad():
            record = profile(net, lambda: x, steps=25).profile.records[""]
        bound = FIELDS["bound"].value(record)  # "overhead" where a heavy load slowed the mean step tenfold: retried
        attainable = FIELDS["attainable_ms"].value(record)
        assert attainable == pytest.approx(1000 * 2 * 512**3 / layerprof.peaks("cpu")["flops"])
        assert FIELDS["efficiency"].value(record) == pytest.approx(attainable / record.self_forward_ms)
        ratios.append((bound, attainable / record.forward_ms_min))
        # The efficiency of the least disturbed step: 0.7 to 1, and up to 10 % over where the peak itself was
        # measured in a disturbed moment (the repeatability peaks() aims at on a shared machine).
        if bound == "compute" and 0.7 <= ratios[-1][1] <= 1.1:
            return
    pytest.fail(f"not compute-bound with attainable / fastest step in 0.7 .. 1.1 in three tries: {ratios}")


def test_layer_norm_and_relu_on_a_big_tensor_are_memory_bound() -> None:
    x = torch.randn(2048, 1024, requires_grad=True)  # 8 MiB
    for net in (nn.LayerNorm(1024), nn.ReLU()):
        record = best_of(5, lambda: profile(net, lambda: x, steps=2), "", enough=1 / OVERHEAD_RATIO)
        assert FIELDS["bound"].value(record) == "memory", (net, FIELDS["efficiency"].value(record))
        assert FIELDS["intensity"].value(record) < 1


def test_stack_of_tiny_linears_is_overhead_bound() -> None:
    net = nn.Sequential(*[nn.Linear(4, 4) for _ in range(8)])
    prof = profile(net, lambda: torch.randn(2, 4, requires_grad=True))
    for index in range(8):
        assert FIELDS["bound"].value(prof.records[str(index)]) == "overhead"
    assert {row["bound"] for row in prof.roofline()} == {"overhead"}


def test_roofline_survives_save_and_load() -> None:
    net = nn.Sequential(nn.Linear(8, 8), nn.ReLU())
    prof = profile(net, lambda: torch.randn(4, 8), peaks=GIVEN)
    loaded = layerprof.loads(prof.to_json())
    assert loaded.meta["peaks"] == prof.meta["peaks"]
    assert [row["bound"] for row in loaded.roofline()] == [row["bound"] for row in prof.roofline()]
    assert json.loads(prof.to_json())["meta"]["peaks"]["bandwidth"] == 1e6


def test_top_by_lost_ms_ranks_modules_with_the_reason_beside() -> None:
    net = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 64))
    prof = profile(net, lambda: torch.randn(32, 64, requires_grad=True), peaks={"flops": 1e11, "bandwidth": 1e10})
    table = prof.top(3, by="lost_ms")
    lost = [row["lost_ms"] for row in table]
    assert lost == sorted(lost, reverse=True) and len(lost) == 3
    assert table.columns[:7] == ["name", "type", "calls", "lost_ms", "bound", "efficiency", "attainable_ms"]
    for row in table:
        record = prof.records[row["name"]]
        assert row["lost_ms"] == pytest.approx(max(0.0, record.self_forward_ms + record.self_backward_ms
                                                   - row["attainable_ms"]))
    summary = prof.layerwise_summary(columns=("bound", "efficiency", "intensity"))
    assert summary.count("Bound: ") == 4 and "Intensity: " in summary


def test_plot_roofline_places_each_module_at_its_own_ops() -> None:
    pytest.importorskip("matplotlib")
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    peaks = {"flops": 1e11, "bandwidth": 1e10}
    net = nn.Sequential(nn.Linear(64, 64), nn.LayerNorm(64), nn.Linear(64, 8))
    prof = profile(net, lambda: torch.randn(32, 64, requires_grad=True), peaks=peaks)
    ax = prof.plot("roofline")
    drawn = {}
    for collection in ax.collections:
        for x, y in collection.get_offsets():
            drawn.setdefault(collection.get_gid(), []).append((float(x), float(y)))
    points = [point for group, found in drawn.items() if group != "roofline:model" for point in found]
    assert len(points) == 3  # the three leaves; the Sequential runs no op of its own
    linear = prof.records["0"]
    seconds = (linear.self_forward_ms + linear.self_backward_ms) / 1000
    at = (linear.self_flops / linear.self_bytes, linear.self_flops / seconds)
    assert any(x == pytest.approx(at[0]) and y == pytest.approx(at[1]) for x, y in points)
    norm = prof.records["1"]  # no FLOPs: at the left edge, at its achieved bandwidth along the memory roof
    edge = min(x for x, _ in points)
    bandwidth = norm.self_bytes / ((norm.self_forward_ms + norm.self_backward_ms) / 1000)
    assert any(x == edge and y == pytest.approx(edge * bandwidth) for x, y in points)
    memory_roof = next(line for line in ax.lines if line.get_gid() == "roof:memory")
    xs, ys = memory_roof.get_data()
    assert ys[0] == pytest.approx(xs[0] * 1e10) and ys[-1] == pytest.approx(1e11)  # meets the compute roof
    plt.close(ax.figure)


def test_plot_roofline_needs_flops() -> None:
    net = nn.Linear(4, 4)
    with LayerProf(net) as prof:
        net(torch.randn(2, 4))
    with pytest.raises(ValueError, match="metrics=\\('flops',\\)"):
        prof.plot("roofline")
    with pytest.raises(ValueError, match="the roofline needs FLOPs and bytes"):
        prof.roofline()
    # FLOPs counted, but no module did work of its own (views only): said so, not the meter or the steps.
    net = nn.Sequential(nn.Identity(), nn.Flatten())
    with LayerProf(net, metrics=("flops",)) as prof:
        for _ in range(3):
            net(torch.randn(4, 8, requires_grad=True)).sum().backward()
            prof.step()
    assert len(prof.roofline()) == 0
    with pytest.raises(ValueError, match="no module did work of its own that the FLOP meter counts"):
        prof.plot("roofline")


def test_report_has_a_roofline_panel_for_a_flops_profile() -> None:
    net = nn.Sequential(nn.Linear(16, 16), nn.ReLU())
    page = profile(net, lambda: torch.randn(8, 16), peaks=GIVEN).to_report()
    assert page.count('<section id="roofline-section">') == 1 and 'id="roof:memory"' in page
    assert '{"name": "efficiency", "label": "Efficiency"' in page  # a column of the modules table
    with LayerProf(net) as prof:
        net(torch.randn(8, 16))
    assert "roofline-section" not in prof.to_report()


def test_peaks_on_cuda(cuda: torch.device) -> None:
    roofs = layerprof.peaks(cuda)
    assert roofs["device"].startswith("cuda") and roofs is layerprof.peaks(cuda)
    assert roofs["flops"] > 1e12 and roofs["bandwidth"] > 1e11  # any GPU of the last decade


def test_real_models_classify_every_module_with_own_work() -> None:
    torchvision = pytest.importorskip("torchvision")
    transformers = pytest.importorskip("transformers")
    peaks = {"flops": 1e11, "bandwidth": 1e10}  # ridge at 10 FLOP/B
    resnet = torchvision.models.resnet18(weights=None)
    config = transformers.BertConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
                                     intermediate_size=128, vocab_size=500, attn_implementation="sdpa")
    bert = transformers.BertModel(config)
    ids = torch.randint(0, 500, (2, 16))
    for model, make_input, body in ((resnet, lambda: torch.randn(2, 3, 32, 32), lambda x: resnet(x)),
                                    (bert, lambda: ids, lambda x: bert(input_ids=x).last_hidden_state)):
        with LayerProf(model, metrics=("flops",), peaks=peaks) as prof:
            for _ in range(2):
                body(make_input()).sum().backward()
                prof.step()
        rows = prof.roofline()
        assert rows and {row["bound"] for row in rows} <= {"compute", "memory", "overhead"}
        for row in rows:
            record = prof.records[row["name"]]
            assert row["lost_ms"] >= 0 and row["efficiency"] > 0 or not (row["self_flops"] or row["self_bytes"])
            # which roof: right of the ridge (10 FLOP/B) compute, left of it memory. A small-spatial conv is
            # left of it (layer3.0.conv2 on a 2x2 map reads 2.4 MB of weights for 28 MFLOPs: 4 FLOP/B)
            if row["bound"] != "overhead":
                assert row["bound"] == ("compute" if row["self_flops"] >= 10 * row["self_bytes"] else "memory")
            if record.type in ("BatchNorm2d", "LayerNorm", "ReLU", "Dropout") and row["bound"] != "overhead":
                assert row["bound"] == "memory" and row["self_flops"] == 0, row
        # own work adds up to the whole model's
        assert sum(row["self_bytes"] for row in rows) == FIELDS["bytes"].value(prof.tree)


def test_a_stateless_base_on_the_meta_device_is_profiled_on_its_inputs_device() -> None:
    # Model ensembling as the torch.func tutorial does it: a copy of the model moved to "meta" is the base that
    # functional_call runs with real parameters under vmap. The profile said device "meta", whose roofs cannot be
    # measured: to_json warned and roofline() raised "META device type not an accelerator".
    import copy
    import warnings

    from torch.func import functional_call, stack_module_state, vmap

    torch.manual_seed(0)
    members = [nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1)) for _ in range(3)]
    params, buffers = stack_module_state(members)
    base = copy.deepcopy(members[0]).to("meta")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with LayerProf(base, metrics=("flops",)) as prof:
            run = lambda p, b, x: functional_call(base, (p, b), (x,))  # noqa: E731
            vmap(run, in_dims=(0, 0, None))(params, buffers, torch.randn(5, 4)).sum().backward()
    assert prof.profile.meta["environment"]["device"] == "cpu"
    assert prof.tree.flops_forward == 3 * (5 * 4 * 8 * 2 + 5 * 8 * 1 * 2)  # 3 members: 320 + 80 each = 1,200
    assert all(row["bound"] is not None for row in prof.roofline())


def test_a_step_under_autocast_is_held_against_the_roofs_of_its_autocast_dtype(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # Under torch.autocast(bfloat16) the matrix products compute in bf16 while the parameters stay float32: the
    # roofline measured float32 roofs (0.18 TFLOP/s on this CPU against 1.3 for bf16) and read efficiencies of 1.4.
    asked: list[object] = []

    def measured(device, dtype=None, threads=None):
        asked.append(dtype)
        return {"device": str(device), "dtype": str(dtype), "flops": 1e12, "bandwidth": 1e10, "source": "measured"}

    monkeypatch.setattr(layerprof.profile, "measure_peaks", measured)
    model = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 64))
    with LayerProf(model, metrics=("flops",)) as prof:
        for _ in range(2):
            with torch.autocast("cpu", dtype=torch.bfloat16):
                out = model(torch.randn(32, 64))
            out.float().sum().backward()
            prof.step()
    environment = prof.profile.meta["environment"]
    assert environment["dtype"] == "float32" and environment["autocast_dtype"] == "bfloat16"
    prof.roofline()
    assert asked == ["bfloat16"]
    with LayerProf(model, metrics=("flops",)) as plain:  # without autocast: no such key, the parameters' dtype
        model(torch.randn(32, 64)).sum().backward()
    assert "autocast_dtype" not in plain.profile.meta["environment"]


def test_the_roofline_tables_intensity_is_the_modules_own_and_top_shows_each_column_once() -> None:
    # A parent whose own op is a copy (no FLOPs) around a Linear: the table put the inclusive intensity (the
    # Linear's FLOPs over every byte) beside a bound read from its own ops: "35 FLOP/B, memory-bound" past a ridge
    # of 10. And top(by="efficiency") listed Efficiency twice.
    class Copies(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(64, 64)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.fc(x).clone()

    net = Copies()
    prof = profile(net, lambda: torch.randn(32, 64), peaks={"flops": 1e10, "bandwidth": 1e9})
    row = next(row for row in prof.roofline() if row["name"] == "")
    assert row["self_flops"] == 0 and row["self_intensity"] == 0.0 and row["bound"] in ("memory", "overhead")
    assert FIELDS["intensity"].value(prof.tree) > 0  # (inclusive: the Linear's FLOPs over every byte)
    for by in ("efficiency", "attainable_ms", "lost_ms"):
        columns = prof.top(2, by=by).columns
        assert len(columns) == len(set(columns)), (by, columns)


@pytest.mark.parametrize("case", ["no parameters", "a float32 parameter first"])
def test_the_roofs_are_the_dtype_the_flops_ran_in(case: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # The roofs' dtype came from the first parameter: a parameterless module's bf16 Gram matrix was held against
    # float32 roofs (efficiency 4.1), as were the bf16 Linears of a model whose root holds a float32 scale.
    class Gram(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x @ x.T

    class Scaled(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.scale = nn.Parameter(torch.ones(()))  # float32, first in parameters()
            self.body = nn.Linear(16, 16).to(torch.bfloat16)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.body(x) * self.scale.to(torch.bfloat16)

    calls: list[tuple] = []
    monkeypatch.setattr(layerprof.profile, "measure_peaks",
                        lambda *args, **kwargs: calls.append(args) or {"flops": 1e12, "bandwidth": 1e11})
    net = Gram() if case == "no parameters" else Scaled()
    with LayerProf(net, metrics=("flops",)) as prof:
        net(torch.randn(8, 16, dtype=torch.bfloat16))
    assert prof.profile.meta["flops"] == {"dtype": "bfloat16"}
    prof.roofline()
    assert calls == [("cpu", "bfloat16")]


class SleepsInForward(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        time.sleep(0.03)
        return x * 1.0


class CheckpointedRegion(nn.Module):
    def __init__(self, reentrant: bool) -> None:
        super().__init__()
        self.region = nn.Sequential(SleepsInForward(), nn.Linear(8, 8))
        self.head = nn.Linear(8, 1)
        self.reentrant = reentrant

    def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.head(checkpoint(self.region, x, use_reentrant=self.reentrant))


@pytest.mark.parametrize("reentrant", [False, True], ids=["non-reentrant", "reentrant"])
def test_the_roofline_time_holds_a_modules_recomputation_and_not_anothers(reentrant: bool) -> None:
    # The 30 ms sleep runs again in backward. Its self times leave the re-run out while its FLOPs count it; and
    # the re-run ran inside another module's backward (non-reentrant: the Linear whose node unpacks the region's
    # saved input; reentrant: the checkpoint's own node, which the root's code made), whose self time held it: a
    # Linear read "overhead" at 0.06 efficiency where it read "memory" at 0.4 without checkpointing.
    from layerprof.record.work_time import work_ms

    net = CheckpointedRegion(reentrant)
    with LayerProf(net) as prof:
        net(torch.randn(4, 8, requires_grad=reentrant)).sum().backward()
    sleeper, linear = prof.records["region.0"], prof.records["region.1"]
    held = linear if not reentrant else prof.tree
    assert FIELDS["self_total_ms"].value(held) >= 30.0  # the re-run, in its self backward
    assert work_ms(held) < 15.0  # taken off
    assert FIELDS["self_total_ms"].value(sleeper) < 45.0 and sleeper.recompute_ms >= 30.0
    assert work_ms(sleeper) >= 60.0  # its forward and its re-run, both its own work
    assert work_ms(prof.records["head"]) == FIELDS["self_total_ms"].value(prof.records["head"])
