"""Plots: every kind renders on a real run, what is drawn adds up to the metric's total, figures are closed,
files are written only when asked, and a metric that was not recorded is a clear error."""
from __future__ import annotations

import math
from collections import defaultdict
from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402
from matplotlib.patches import Rectangle, Wedge  # noqa: E402
from torch import nn  # noqa: E402

import layerprof  # noqa: E402
from layerprof.render.plot import PLOT_KINDS  # noqa: E402
from layerprof.render.plot_style import fit_label, wrap_label  # noqa: E402

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def resnet_profile() -> layerprof.Profile:
    torchvision = pytest.importorskip("torchvision")
    torch.manual_seed(0)
    model = torchvision.models.resnet18(weights=None)
    with layerprof.LayerProf(model) as prof:
        model(torch.randn(1, 3, 64, 64)).sum().backward()
    return prof.profile


@pytest.fixture
def axes():
    figure, ax = plt.subplots()
    yield ax
    plt.close(figure)


def mlp_with_params() -> layerprof.Profile:
    """A profile whose ``params`` field is filled by hand, so every drawn size is known exactly."""
    model = nn.Sequential()
    model.body = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 16), nn.ReLU())
    model.head = nn.Linear(16, 1)
    with layerprof.LayerProf(model) as prof:
        model(torch.randn(2, 8)).sum().backward()
    for name, module in model.named_modules():
        prof.records[name].params = sum(p.numel() for p in module.parameters())
    return prof.profile


def wedges(ax) -> list[Wedge]:
    return [patch for patch in ax.patches if isinstance(patch, Wedge)]


def angle(wedge: Wedge) -> float:
    return wedge.theta2 - wedge.theta1


def ring(wedge: Wedge) -> int:
    return round(wedge.r) - 1  # ring d spans radii [d, d + 1]


def by_gid(patches) -> dict[str, object]:
    return {patch.get_gid(): patch for patch in patches}


def check_nesting(drawn: list[Wedge]) -> None:
    """Every wedge's next ring is either empty within it, or exactly fills it."""
    rings: dict[int, list[Wedge]] = defaultdict(list)
    for wedge in drawn:
        rings[ring(wedge)].append(wedge)
    assert [angle(w) for w in rings[0]] == [pytest.approx(360.0)]
    for depth, members in rings.items():
        for outer in members:
            inside = [
                w for w in rings.get(depth + 1, [])
                if outer.theta1 - 1e-9 <= (w.theta1 + w.theta2) / 2 <= outer.theta2 + 1e-9
            ]
            if inside:
                assert sum(angle(w) for w in inside) == pytest.approx(angle(outer), abs=1e-6), outer.get_gid()


# -- sunburst -------------------------------------------------------------------------------------------------
def test_sunburst_exact_params(axes) -> None:
    ax = layerprof.plot_sunburst(mlp_with_params(), metric="params", ax=axes)
    drawn = by_gid(wedges(ax))
    # params: body.0 = 8*16+16 = 144, body.2 = 16*16+16 = 272, head = 16+1 = 17; body = 416; root = 433.
    # No module has parameters of its own, so no self wedge; the ReLUs hold 0 and are not drawn.
    assert sorted(drawn) == ["module:", "module:body", "module:body.0", "module:body.2", "module:head"]
    assert angle(drawn["module:body"]) == pytest.approx(360 * 416 / 433)
    assert angle(drawn["module:head"]) == pytest.approx(360 * 17 / 433)
    assert angle(drawn["module:body.0"]) == pytest.approx(360 * 144 / 433)
    assert angle(drawn["module:body.2"]) == pytest.approx(360 * 272 / 433)
    assert ax.get_title() == "Sequential: Params, total 433"


def test_sunburst_resnet_adds_up_to_the_total(resnet_profile, axes) -> None:
    root = resnet_profile.tree
    # No grouping (min_share=0), so that which modules are drawn does not depend on the timings.
    ax = layerprof.plot_sunburst(resnet_profile, metric="total", ax=axes, min_share=0.0)
    drawn = wedges(ax)
    check_nesting(drawn)
    assert max(ring(w) for w in drawn) == 4  # layer1.0 is depth 2; layer2.0.downsample.0 is depth 4
    # Depth-1 wedges are the children's inclusive times, scaled only if they claim more than the root measured.
    children = [child for child in root.children if child.total_ms]
    scale = min(1.0, root.total_ms / sum(child.total_ms for child in children))
    found = by_gid(drawn)
    for child in children:
        assert angle(found[f"module:{child.name}"]) == pytest.approx(360 * child.total_ms * scale / root.total_ms)
    assert "other:" not in found
    assert sum(1 for gid in found if gid.startswith("module:")) == len(resnet_profile.records)  # all 68 drawn


def test_sunburst_depth_limit_and_grouping(resnet_profile, axes) -> None:
    ax = layerprof.plot_sunburst(resnet_profile, metric="forward", depth=1, ax=axes, min_share=0.05)
    drawn = wedges(ax)
    check_nesting(drawn)
    assert {ring(w) for w in drawn} == {0, 1}
    kinds = [w.get_gid().split(":")[0] for w in drawn if ring(w) == 1]
    assert kinds.count("other") <= 1 and "module" in kinds
    assert sum(angle(w) for w in drawn if ring(w) == 1) == pytest.approx(360.0)


def test_shared_parameters_are_scaled_to_fit() -> None:
    model = nn.Sequential(nn.Linear(4, 4, bias=False), nn.Linear(4, 4, bias=False))
    model[1].weight = model[0].weight  # tied: each child has 16 params, the model 16 in all
    with layerprof.LayerProf(model) as prof:
        model(torch.randn(1, 4)).sum().backward()
    for name, module in model.named_modules():
        prof.records[name].params = sum(p.numel() for p in module.parameters())
    figure, ax = plt.subplots()
    try:
        drawn = by_gid(wedges(prof.plot("sunburst", metric="params", ax=ax)))
    finally:
        plt.close(figure)
    # 16 + 16 claimed inside 16: both halved, to 180 degrees each, and the root has no self wedge.
    assert angle(drawn["module:0"]) == pytest.approx(180.0)
    assert angle(drawn["module:1"]) == pytest.approx(180.0)
    assert "self:" not in drawn


def test_uncalled_container_counts_its_children(axes) -> None:
    class Stack(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.blocks = nn.ModuleList([nn.Linear(4, 4), nn.Linear(4, 4)])

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            for block in self.blocks:
                x = block(x)
            return x

    model = Stack()
    with layerprof.LayerProf(model) as prof:
        model(torch.randn(2, 4)).sum().backward()
    assert prof.records["blocks"].forward_ms is None  # a ModuleList is never called
    drawn = by_gid(wedges(layerprof.plot_sunburst(prof, metric="forward", ax=axes)))
    assert angle(drawn["module:blocks"]) == pytest.approx(angle(drawn["module:blocks.0"]) + angle(drawn["module:blocks.1"]))
    assert angle(drawn["module:blocks"]) > 0


# -- icicle ---------------------------------------------------------------------------------------------------
def test_icicle_every_level_spans_the_total(resnet_profile, axes) -> None:
    root = resnet_profile.tree
    ax = layerprof.plot_icicle(resnet_profile, metric="backward", ax=axes, min_share=0.0)  # no timing-dependent grouping
    bars = [patch for patch in ax.patches if isinstance(patch, Rectangle) and patch.get_gid()]
    levels: dict[int, list[Rectangle]] = defaultdict(list)
    for bar in bars:
        levels[round(bar.get_y() + bar.get_height() / 2)].append(bar)
    assert sorted(levels) == [0, 1, 2, 3, 4]  # resnet18 is 4 deep: layer2.0.downsample.0
    for level, members in levels.items():
        assert sum(bar.get_width() for bar in members) == pytest.approx(root.backward_ms), level
    drawn = by_gid(levels[1])
    assert drawn["module:layer3"].get_width() <= root.backward_ms
    carried = [bar for bar in levels[4] if bar.get_gid().startswith("carried:")]
    assert carried and all(bar.get_alpha() == pytest.approx(0.3) for bar in carried)
    # A module keeps its colour when carried down: conv1 (a leaf at depth 1) at depth 4.
    conv1_below = by_gid(levels[4])["carried:conv1"]
    assert conv1_below.get_facecolor()[:3] == pytest.approx(drawn["module:conv1"].get_facecolor()[:3])


@pytest.mark.parametrize("kind", ["icicle", "top"])
@pytest.mark.parametrize("inches", [6.0, 14.0, 24.0])
def test_value_axis_tick_labels_never_touch(kind, inches) -> None:
    """Tick labels in a unit ("800 MFLOPs") are wide: on every figure width the drawn labels keep apart, and a
    wide axis still has several of them. Measured on the rendered text, not on the estimate the plot uses."""
    profile = mlp_with_params()
    for record in profile.records.values():  # tens of MFLOPs: labels like "40 MFLOPs" (overlapped at 6 in)
        record.flops_forward = record.params * 123_456
        record.flops_backward = 2 * record.flops_forward
    figure, ax = plt.subplots(figsize=(inches, 4.0))
    try:
        PLOT_KINDS[kind](profile, metric="flops", ax=ax)
        figure.canvas.draw()
        renderer = figure.canvas.get_renderer()
        boxes = sorted((label.get_window_extent(renderer) for label in ax.get_xticklabels()
                        if label.get_visible() and label.get_text()), key=lambda box: box.x0)
        assert len(boxes) >= 3, [label.get_text() for label in ax.get_xticklabels()]
        assert all("FLOPs" in label.get_text() for label in ax.get_xticklabels())
        gaps = [right.x0 - left.x1 for left, right in zip(boxes, boxes[1:])]
        assert min(gaps) > 0, gaps
    finally:
        plt.close(figure)


# -- top-k ----------------------------------------------------------------------------------------------------
def test_top_bars_add_up_to_the_total(resnet_profile, axes) -> None:
    root = resnet_profile.tree
    ax = layerprof.plot_top(resnet_profile, k=5, metric="total", ax=axes)
    bars = [patch for patch in ax.patches if (patch.get_gid() or "").startswith("top:")]
    widths = [bar.get_width() for bar in bars]
    assert len(bars) == 6  # 5 modules and "other"
    assert sum(widths) == pytest.approx(root.total_ms)
    assert widths[:5] == sorted(widths[:5], reverse=True)
    assert bars[-1].get_gid() == "top:other"


def test_top_by_type_exact_params(axes) -> None:
    ax = layerprof.plot_top(mlp_with_params(), metric="params", by_type=True, ax=axes)
    bars = [patch for patch in ax.patches if (patch.get_gid() or "").startswith("top:")]
    # All 433 parameters sit in the three Linear leaves; ReLU and the containers own none.
    assert [(bar.get_gid(), bar.get_width()) for bar in bars] == [("top:Linear", 433.0)]
    assert [tick.get_text() for tick in ax.get_yticklabels()] == ["Linear ×3"]


def test_top_by_type_resnet(resnet_profile, axes) -> None:
    ax = layerprof.plot_top(resnet_profile, k=50, metric="forward", by_type=True, ax=axes)
    bars = by_gid(patch for patch in ax.patches if (patch.get_gid() or "").startswith("top:"))
    assert "top:other" not in bars  # resnet18 has 9 module types, fewer than k
    assert {"top:Conv2d", "top:BatchNorm2d", "top:ReLU", "top:Linear"} <= set(bars)
    assert sum(bar.get_width() for bar in bars.values()) == pytest.approx(resnet_profile.tree.forward_ms)
    assert "Conv2d ×20" in [tick.get_text() for tick in ax.get_yticklabels()]  # 1 + 8 blocks * 2 + 3 downsample


def metered_with_buffers() -> layerprof.Profile:
    """Parameters, buffers, a frozen layer and forward FLOPs, all known exactly."""
    model = nn.Sequential(nn.Linear(8, 16), nn.BatchNorm1d(16), nn.Linear(16, 1))
    model[2].requires_grad_(False)
    with layerprof.LayerProf(model, metrics=("params", "flops")) as prof, torch.no_grad():
        for _ in range(2):  # FLOPs counted in the first step, times from the second
            model(torch.randn(4, 8))
            prof.step()
    return prof.profile


def test_computed_fields_that_add_up_are_plotted(axes) -> None:
    profile = metered_with_buffers()
    # size = param + buffer bytes: Linear(8, 16) 144*4 = 576; BatchNorm1d(16) 32*4 + 2*16*4 + 8 (an int64 count)
    # = 264; Linear(16, 1) 17*4 = 68; 908 in all (not anytree's ``record.size``, the root's 4 records).
    ax = layerprof.plot_top(profile, k=3, metric="size", ax=axes)
    bars = [(bar.get_gid(), bar.get_width()) for bar in ax.patches if (bar.get_gid() or "").startswith("top:")]
    assert bars == [("top:0", 576.0), ("top:1", 264.0), ("top:2", 68.0)]
    assert ax.get_title().endswith("Size, total 908 B")
    figure, ax = plt.subplots()
    try:  # macs = flops / 2: 2*4*8*16 / 2 = 512 and 2*4*16 / 2 = 64; the BatchNorm adds none
        ax = layerprof.plot_sunburst(profile, metric="macs", ax=ax)
        drawn = by_gid(wedges(ax))
        assert angle(drawn["module:0"]) == pytest.approx(360 * 512 / 576)
        assert angle(drawn["module:2"]) == pytest.approx(360 * 64 / 576)
        assert ax.get_title() == "Sequential: MACs, total 576 MACs"
    finally:
        plt.close(figure)
    figure, ax = plt.subplots()
    try:  # frozen_params: the last Linear's 16 + 1
        ax = layerprof.plot_top(profile, metric="frozen_params", by_type=True, ax=ax)
        assert [(bar.get_gid(), bar.get_width()) for bar in ax.patches
                if (bar.get_gid() or "").startswith("top:")] == [("top:Linear", 17.0)]
    finally:
        plt.close(figure)
    from layerprof.render.plot_metrics import metric_meters

    assert [metric_meters(name) for name in ("macs", "size", "frozen_params")] == [("flops",), ("params",), ("params",)]


def test_rates_and_shares_are_refused_with_the_reason() -> None:
    profile = metered_with_buffers()
    before = plt.get_fignums()
    with pytest.raises(ValueError, match=r"^cannot plot metric 'flops_per_s': its values \(flop/s\) do not add up "
                                         r"over modules, as the areas of a plot must; plot an amount such as 'flops'"):
        layerprof.plot_top(profile, metric="flops_per_s")
    with pytest.raises(ValueError, match=r"^cannot plot metric 'time_percent': it is a share, .* plot 'total_ms'$"):
        layerprof.plot_sunburst(profile, metric="time_percent")
    with pytest.raises(ValueError, match=r"^cannot plot metric 'mean_forward': its values \(ms\) do not add up"):
        profile.plot("icicle", metric="mean_forward")
    with pytest.raises(ValueError, match=r"^cannot plot metric 'bound': it is not a number$"):
        profile.plot("top", metric="bound")
    assert plt.get_fignums() == before


def test_self_fields_are_refused_naming_the_inclusive_one() -> None:
    """A plot lays out inclusive values and draws each module's self part from them. A self field drawn as
    inclusive made the root's own 0.2 ms of a 45 ms forward the whole plot, its children scaled 200 times down
    inside it (a Linear of 12.2 ms drawn as 0.12), and self_activation_bytes failed after a run ("is 0")."""
    profile = metered_with_buffers()
    for name, inclusive in (("self_forward", "forward_ms"), ("self_total_ms", "total_ms"), ("self_flops", "flops"),
                            ("self_activation_bytes", "activation_bytes"), ("self_saved_bytes", "saved_bytes")):
        with pytest.raises(ValueError, match=rf"^cannot plot metric '{name}': it is a module's own part, which a "
                                             rf"plot draws already .* plot '{inclusive}'$"):
            profile.plot("sunburst", metric=name)
    from layerprof.render.plot_metrics import plot_metric_names

    assert not [name for name in plot_metric_names() if name.startswith("self")]


# -- figures and files ----------------------------------------------------------------------------------------
def test_new_figure_only_without_ax(resnet_profile, axes) -> None:
    before = plt.get_fignums()
    layerprof.plot_top(resnet_profile, ax=axes)
    assert plt.get_fignums() == before
    ax = layerprof.plot_sunburst(resnet_profile)
    assert len(plt.get_fignums()) == len(before) + 1  # left open for plt.show()
    plt.close(ax.figure)
    assert plt.get_fignums() == before


@pytest.mark.parametrize("kind", ["sunburst", "icicle", "top"])
@pytest.mark.parametrize("suffix, magic", [("png", b"\x89PNG\r\n\x1a\n"), ("svg", b"<?xml")])
def test_save_writes_a_valid_file_and_closes(resnet_profile, tmp_path, kind, suffix, magic) -> None:
    before = plt.get_fignums()
    path = tmp_path / f"plot.{suffix}"
    ax = resnet_profile.plot(kind, metric="total", path=path)
    assert ax.get_title()
    assert plt.get_fignums() == before
    data = path.read_bytes()
    assert data.startswith(magic)
    if suffix == "svg":
        assert b"<svg" in data[:2000]


def test_save_into_the_callers_figure_keeps_it_open(resnet_profile, tmp_path, axes) -> None:
    path = tmp_path / "mine.png"
    assert resnet_profile.plot("icicle", path=path, ax=axes) is axes
    assert axes.figure.number in plt.get_fignums()
    assert path.read_bytes()[:4] == b"\x89PNG"


def test_no_file_unless_asked(resnet_profile, tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    before = plt.get_fignums()
    for kind in ("sunburst", "icicle", "top"):
        plt.close(resnet_profile.plot(kind).figure)
    assert list(tmp_path.iterdir()) == []
    assert plt.get_fignums() == before


def test_live_layerprof_delegates_plot(tmp_path) -> None:
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU())
    with layerprof.LayerProf(model) as prof:
        model(torch.randn(2, 4)).sum().backward()
    prof.plot("sunburst", metric="forward", path=tmp_path / "live.svg")
    assert (tmp_path / "live.svg").read_bytes().startswith(b"<?xml")


@pytest.fixture(scope="module")
def measured_profile() -> layerprof.Profile:
    """A profile every plot kind can draw: FLOPs and bytes (roofline, with given peaks) and memory (checkpoint)."""
    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Sequential(nn.Linear(32, 32), nn.ReLU()) for _ in range(3)], nn.Linear(32, 1))
    with layerprof.LayerProf(model, metrics=("flops", "memory"), peaks={"flops": 1e11, "bandwidth": 1e10}) as prof:
        for _ in range(2):
            model(torch.randn(16, 32)).sum().backward()
            prof.step()
    return prof.profile


PLOT_FUNCTIONS = PLOT_KINDS  # the public plot_* functions and the checkpoint frontier (prof.plot("checkpoint"))


def _png_size(data: bytes) -> tuple[int, int]:
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    return int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")  # IHDR width, height


def _drawn_inches(figure) -> object:
    return figure.get_tightbbox(figure.canvas.get_renderer())


@pytest.mark.parametrize("kind", sorted(PLOT_FUNCTIONS))
def test_every_plot_function_saves_to_a_str_or_a_path(measured_profile, tmp_path, kind) -> None:
    before = plt.get_fignums()
    as_path, as_str = tmp_path / f"{kind}.png", str(tmp_path / f"{kind}.svg")
    ax = PLOT_FUNCTIONS[kind](measured_profile, path=as_path)
    assert ax.get_title() and plt.get_fignums() == before  # the Axes returned, the figure made here closed
    assert as_path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    PLOT_FUNCTIONS[kind](measured_profile, path=as_str)
    assert Path(as_str).read_bytes().startswith(b"<?xml")
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"{kind}.png", f"{kind}.svg"]  # no temporary left
    with pytest.raises(ValueError, match=r"cannot save a plot as '.*\.jpg': use a \.png, \.svg or \.pdf path"):
        PLOT_FUNCTIONS[kind](measured_profile, path=tmp_path / "plot.jpg")
    with pytest.raises(TypeError, match=r"a pathlib.Path ending in \.png, \.svg or \.pdf, got int"):
        PLOT_FUNCTIONS[kind](measured_profile, path=3)
    assert plt.get_fignums() == before  # a bad path fails before anything is drawn
    assert len(list(tmp_path.iterdir())) == 2


@pytest.mark.parametrize("kind", sorted(PLOT_FUNCTIONS))
def test_an_ax_that_is_no_axes_is_a_type_error_saying_what_to_pass(measured_profile, kind) -> None:
    # Before: AttributeError: 'Figure' object has no attribute 'set_xlim' (or 'numpy.ndarray' ... 'barh'), from
    # inside the drawing: ``fig, axes = plt.subplots(1, 2)`` then ax=axes, or ax=fig, are the likely slips.
    figure, pair = plt.subplots(1, 2)
    try:
        with pytest.raises(TypeError, match=r"^ax must be a matplotlib Axes \(fig, ax = plt.subplots\(\)\) or None, "
                                            r"got a Figure: pass one of its Axes, e.g. ax=fig.axes\[0\]$"):
            PLOT_FUNCTIONS[kind](measured_profile, ax=figure)
        with pytest.raises(TypeError, match=r"^ax must be .* got an array of 2 Axes: pass one, e.g. ax=axes\[0\]$"):
            PLOT_FUNCTIONS[kind](measured_profile, ax=pair)
        with pytest.raises(TypeError, match=r"^ax must be .* or None, got 5 \(int\)$"):
            PLOT_FUNCTIONS[kind](measured_profile, ax=5)
    finally:
        plt.close(figure)


@pytest.mark.parametrize("kind", sorted(PLOT_FUNCTIONS))
def test_a_figure_made_here_holds_its_legend_and_labels(resnet_profile, measured_profile, tmp_path, kind) -> None:
    profile = measured_profile if kind in ("roofline", "checkpoint") else resnet_profile
    ax = PLOT_FUNCTIONS[kind](profile)
    figure = ax.figure
    width, height = figure.get_size_inches()
    drawn = _drawn_inches(figure)
    # Everything drawn (the legend beside the Axes, tick labels, the title) lies on the figure, so a plain
    # savefig of the returned Axes keeps it: the icicle's legend and the top bars' labels used to stick out.
    assert drawn.x0 >= 0 and drawn.y0 >= 0 and drawn.x1 <= width and drawn.y1 <= height, (drawn, width, height)
    legend = ax.get_legend()
    if legend is not None:
        box = legend.get_window_extent()  # pixels
        assert box.x0 >= 0 and box.y0 >= 0 and box.x1 <= width * figure.dpi and box.y1 <= height * figure.dpi
    plain = tmp_path / "plain.png"
    figure.savefig(plain, dpi=100)
    plain_width, plain_height = _png_size(plain.read_bytes())
    assert abs(plain_width - width * 100) < 1 and abs(plain_height - height * 100) < 1  # the whole figure
    figure.set_dpi(110)  # text measures a little differently at another resolution
    drawn = _drawn_inches(figure)
    plt.close(figure)
    # Saved with path=: the same figure, cropped to what was drawn and padded by 0.1 in on each side, at 110 dpi
    # (a pixel of rounding either way).
    saved = tmp_path / "saved.png"
    PLOT_FUNCTIONS[kind](profile, path=saved)
    saved_width, saved_height = _png_size(saved.read_bytes())
    assert abs(saved_width - (drawn.width + 0.2) * 110) <= 1.5 and abs(saved_height - (drawn.height + 0.2) * 110) <= 1.5


def test_the_callers_figure_is_never_resized(resnet_profile, tmp_path, axes) -> None:
    size = tuple(axes.figure.get_size_inches())
    position = axes.get_position().bounds
    layerprof.plot_icicle(resnet_profile, ax=axes, path=tmp_path / "icicle.png")
    assert tuple(axes.figure.get_size_inches()) == size and axes.get_position().bounds == position
    assert axes.figure.number in plt.get_fignums()


# -- errors ---------------------------------------------------------------------------------------------------
def test_missing_metric_names_the_field_and_the_fix(resnet_profile) -> None:
    before = plt.get_fignums()
    with pytest.raises(ValueError, match=r"'flops'.*'flops_forward'.*metrics=\('flops',\)"):
        layerprof.plot_sunburst(resnet_profile, metric="flops")
    with pytest.raises(ValueError, match=r"'saved_bytes' or 'activation_bytes'.*metrics=\('memory',\)"):
        resnet_profile.plot("icicle", metric="memory")
    model = torch.nn.Sequential(torch.nn.Linear(2, 2))
    with layerprof.LayerProf(model, metrics=()) as bare:  # params is a default metric: turn it off to lose it
        model(torch.randn(1, 2)).sum().backward()
    with pytest.raises(ValueError, match=r"'params'.*metrics=\('params',\)"):
        layerprof.plot_top(bare.profile, metric="params")
    assert plt.get_fignums() == before  # nothing drawn before the check


def test_bad_arguments(resnet_profile, tmp_path) -> None:
    with pytest.raises(ValueError, match="unknown plot metric 'time'; choose from: forward, backward, total"):
        layerprof.plot_icicle(resnet_profile, metric="time")
    with pytest.raises(ValueError, match="unknown plot kind 'pie'"):
        resnet_profile.plot("pie")
    with pytest.raises(ValueError, match=r"\.png, \.svg or \.pdf"):
        resnet_profile.plot("top", path=tmp_path / "plot.jpg")
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(TypeError, match="expected a Profile"):
        layerprof.plot_top({"not": "a profile"})


def test_model_never_called_has_nothing_to_plot() -> None:
    model = nn.Linear(2, 2)
    with pytest.warns(RuntimeWarning):
        with layerprof.LayerProf(model) as prof:
            pass
    with pytest.raises(ValueError, match="'forward_ms'.*inside the `with LayerProf"):
        prof.plot("sunburst", metric="forward")


def test_docstring_examples_run() -> None:
    import doctest

    import layerprof.render.plot as plot_module

    before = plt.get_fignums()
    result = doctest.testmod(plot_module)
    assert result.attempted >= 5 and result.failed == 0
    assert plt.get_fignums() == before  # the example closes the figure it made


# -- label fitting --------------------------------------------------------------------------------------------
def test_label_fitting_arithmetic() -> None:
    # "conv1" at 7 pt: 5 chars * 7 * 0.6 = 21 pt wide, plus half an em (3.5 pt) of margin = 24.5 pt.
    assert fit_label(["layer1.conv1", "conv1"], 24.5, 9.0, 7.0) == "conv1"
    assert fit_label(["conv1"], 24.4, 9.0, 7.0) is None
    assert fit_label(["conv1"], 100.0, 8.0, 7.0) is None  # a line needs 1.15 * 7 = 8.05 pt
    # "Sequence" is 8 * 8 * 0.6 = 38.4 pt at 8 pt; "BertFor" = 33.6 pt; "BertForSequence" would be 72 pt.
    assert wrap_label("BertForSequenceClassification", 70.0, 8.0) == "BertFor\nSequence\nClassification"
    assert wrap_label("BertForSequenceClassification", 60.0, 8.0) is None
    assert math.isclose(len("Classification") * 8 * 0.6, 67.2)


@pytest.mark.parametrize("kind", ["top", "sunburst", "icicle"])
def test_a_long_module_name_is_shortened_in_legends_and_labels(kind: str) -> None:
    # One 200-character ModuleDict key was drawn whole: the figure grew to 2,200 px wide, the chart in a corner.
    keys = ["L" * 200, "short"]

    class Keyed(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            # (alike: neither is the trunk a plot names on its axis, not in its legend)
            self.d = nn.ModuleDict({key: nn.Linear(128, 128) for key in keys})

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            for key in keys:
                x = self.d[key](x)
            return x

    net = Keyed()
    net(torch.randn(64, 128)).sum().backward()  # (a process's first step is slower)
    with layerprof.LayerProf(net) as prof:
        net(torch.randn(64, 128)).sum().backward()
    ax = PLOT_FUNCTIONS[kind](prof, metric="params")  # (counted, not timed: the two alike, whatever the load)
    texts = [text.get_text() for text in ax.get_yticklabels()]
    legend = ax.get_legend()
    if legend is not None:
        texts += [text.get_text() for text in legend.get_texts()]
    plt.close(ax.figure)
    long_ones = [text for text in texts if "LLLL" in text]
    assert long_ones and all("…" in text and len(text) < 80 for text in long_ones), texts


def test_long_names_that_differ_in_the_middle_stay_apart_in_the_top_plot() -> None:
    # Shortened around the middle, two layers' long names (which differ in the layer's index, mid-name) read alike:
    # two bars with one label.
    class Layers(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.layers = nn.ModuleList(
                [nn.ModuleDict({"self_attention_linear_qkv_projection": nn.Linear(16, 16)}) for _ in range(2)])

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            for layer in self.layers:
                x = layer["self_attention_linear_qkv_projection"](x)
            return x

    net = nn.Sequential()
    net.add_module("language_model_encoder", Layers())
    with layerprof.LayerProf(net) as prof:
        net(torch.randn(4, 16)).sum().backward()
    ax = PLOT_FUNCTIONS["top"](prof)
    labels = [text.get_text() for text in ax.get_yticklabels()]
    plt.close(ax.figure)
    long = [label for label in labels if "qkv" in label]
    assert len(long) == 2 and len(set(long)) == 2 and all(len(label) < 80 for label in long), labels
