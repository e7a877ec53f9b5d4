"""The checkpoint planner on real training code: bugs found by a sweep of real-world use, each with its test."""
from __future__ import annotations

import copy
import warnings

import pytest
import torch
import torch.distributed as dist
from torch import nn

from layerprof import LayerProf
from layerprof.plan.apply import is_wrapped
from layerprof.plan.plan import make_plan
from layerprof.plan.verify import verify_plan
from layerprof.plan.wrap_cost import WrapCost
from layerprof.record.records import preorder
from layerprof.render.checkpoint import frontier_svg, plot_checkpoint


class _DenseLayer(nn.Module):
    """A DenseNet layer: it takes the list of every earlier feature map, which its siblings take too."""

    def __init__(self, width: int, grow: int) -> None:
        super().__init__()
        self.lin, self.act, self.out = nn.Linear(width, 4 * grow), nn.Tanh(), nn.Linear(4 * grow, grow)

    def forward(self, feats: list[torch.Tensor]) -> torch.Tensor:
        return self.out(self.act(self.lin(torch.cat(feats, 1))))


class _DenseBlock(nn.Module):
    def __init__(self, width: int = 8, grow: int = 8, depth: int = 4) -> None:
        super().__init__()
        self.layers = nn.ModuleList([_DenseLayer(width + i * grow, grow) for i in range(depth)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        feats = [x]
        for layer in self.layers:
            feats.append(layer(feats))
        return torch.cat(feats, 1)


def _profile(model: nn.Module, step) -> LayerProf:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # one step under the memory meter
        with LayerProf(model, metrics=("memory",)) as prof:
            step()
    return prof


def test_a_plan_costs_no_more_than_a_frontier_point_that_fits_its_budget() -> None:
    # Dense layers share their inputs, so wrapping several frees more than the sum of their (additive) figures:
    # the knapsack, on those, took three layers for a budget that two meet exactly, a point the frontier showed.
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(4, 8), _DenseBlock(), nn.Linear(40, 1))
    x = torch.randn(4, 4)
    prof = _profile(net, lambda: net(x).sum().backward())
    root = prof.profile.tree
    for record in preorder(root):  # 1 ms for each module in it, itself included: times the test can state
        record.forward_ms = record.forward_ms_median = float(len(preorder(record)))
    assert root.saved_bytes == 4032
    plan = make_plan(root, 2720, wrap_cost=None)
    # A layer is 4 modules, 4 ms, less its last Linear (1 ms), which the checkpoint's early stop does not re-run.
    assert plan.modules == ["1.layers.2", "1.layers.3"] and plan.extra_ms == 6.0  # was the last three, 9.0 ms
    assert plan.saved_bytes_after == 2624 <= plan.budget_bytes
    assert not [point for point in plan.pareto() if point.saved_bytes <= 2720 and point.extra_ms < plan.extra_ms]
    with plan.applied(net):
        measured = _profile(net, lambda: net(x).sum().backward())
    assert measured.profile.tree.saved_bytes == 2624


def _sequential() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 64), nn.Sequential(nn.Linear(64, 256), nn.GELU(), nn.Linear(256, 64)),
                         nn.Linear(64, 1))


@pytest.fixture
def gloo(tmp_path):
    """A single-process gloo group, for a DistributedDataParallel on the CPU."""
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def test_a_plan_applied_across_a_ddp_wrapper_says_which_side_to_apply_it_to(gloo) -> None:
    net = _sequential()
    ddp = nn.parallel.DistributedDataParallel(net)
    x = torch.randn(16, 8)
    inner = _timed_plan(_profile(net, lambda: net(x).sum().backward()))
    outer = _timed_plan(_profile(ddp, lambda: ddp(x).sum().backward()))
    assert (inner.modules, outer.modules) == (["1"], ["module.1"])
    with pytest.raises(ValueError) as made_inside:
        inner.apply(ddp)
    assert str(made_inside.value) == (
        "model: the plan wraps module '1', which this DistributedDataParallel does not have; apply the plan to "
        "the model it was made for (a Sequential); the plan was made for the model this DistributedDataParallel "
        "wraps: apply it to model.module")
    with pytest.raises(ValueError) as made_outside:
        outer.apply(net)
    assert str(made_outside.value) == (
        "model: the plan wraps module 'module.1', which this Sequential does not have; apply the plan to the "
        "model it was made for (a DistributedDataParallel); the plan was made for a model that wraps this one (its "
        "names start with 'module', as those of a DistributedDataParallel or a compiled model do): apply it to that "
        "wrapper, or plan on a profile of this Sequential itself")
    assert not inner.is_applied and not outer.is_applied and "forward" not in net[1].__dict__
    expected = ddp(x).detach()
    with inner.applied(ddp.module), torch.no_grad():
        assert torch.equal(ddp(x), expected)
    with outer.applied(ddp), torch.no_grad():
        assert torch.equal(ddp(x), expected)


def _timed_plan(prof: LayerProf):
    """The plan for half the saved bytes with each module's forward at 1 ms a module in it (a plan the test can
    name), the wrappers not priced."""
    root = prof.profile.tree
    for record in preorder(root):
        record.forward_ms = record.forward_ms_median = float(len(preorder(record)))
    return make_plan(root, "50%", wrap_cost=None)


def test_applying_a_plan_to_a_copy_made_while_it_was_applied_says_how_to_unwrap_the_copy() -> None:
    # The copy keeps its wrappers and no plan is applied to it: "remove() it first" had nothing to remove.
    net = _sequential()
    x = torch.randn(16, 8)
    plan = _timed_plan(_profile(net, lambda: net(x).sum().backward()))
    with plan.applied(net):
        ema = copy.deepcopy(net)
    with pytest.raises(ValueError) as wrapped:
        plan.apply(ema)
    assert str(wrapped.value) == (
        "model: module '1' is already wrapped by a checkpoint plan: remove() that plan first; a copy made or loaded "
        "while a plan was applied keeps its wrappers, and del model.get_submodule('1').forward takes one off")
    assert not plan.is_applied
    del ema.get_submodule("1").forward  # as the message says
    with plan.applied(ema):
        assert is_wrapped(ema[1])
    assert not is_wrapped(ema[1]) and "forward" not in ema[1].__dict__


def test_verify_plan_refuses_a_step_that_runs_no_backward() -> None:
    # It measured the forward only and read the plan's recomputations as costing nothing ("0 ms against 0.11 ms").
    net = _sequential()
    x = torch.randn(16, 8)
    plan = _timed_plan(_profile(net, lambda: net(x).sum().backward()))
    with pytest.raises(ValueError) as no_backward:
        verify_plan(plan, net, lambda: net(x), repeats=1)
    assert str(no_backward.value) == (
        "step: verify_plan needs a step that runs backward through the model (the plan's recomputations run there), "
        "and this one ran none: call .backward() on the loss inside step, e.g. step = lambda: model(x).sum().backward()")
    assert not plan.is_applied and "forward" not in net[1].__dict__
    result = verify_plan(plan, net, lambda: net(x).sum().backward(), repeats=1)
    assert result.measured_saved_bytes == result.predicted_saved_bytes == plan.saved_bytes_after


def test_the_frontier_figures_mark_the_plan_on_the_frontier() -> None:
    # The frontier is in cold figures (every wrapper call priced cold); the plan was drawn at its extra_ms, which
    # prices a wrapped call right after another for less: left of the frontier, cheaper than any plan it shows.
    matplotlib = pytest.importorskip("matplotlib")
    matplotlib.use("Agg")
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(4, 8), _DenseBlock(), nn.Linear(40, 1))
    x = torch.randn(4, 4)
    root = _profile(net, lambda: net(x).sum().backward()).profile.tree
    for record in preorder(root):
        record.forward_ms = record.forward_ms_median = float(len(preorder(record)))
    # 1 ms a wrapped call cold, nothing for one that follows another wrapped call.
    plan = make_plan(root, 2720, wrap_cost=WrapCost(1.0, 0.0, "given", ((1e9, 1e9, 0.0),)))
    # Two layers at 3 ms each; the first wrapper cold (1 ms), the second after it (0 ms): 7 ms, 8 ms cold.
    assert plan.modules == ["1.layers.2", "1.layers.3"] and (plan.extra_ms, plan.cold_extra_ms) == (7.0, 8.0)
    assert (8.0, 2624) in [(point.extra_ms, point.saved_bytes) for point in plan.pareto()]
    ax = plot_checkpoint(plan)
    chosen = next(artist for artist in ax.get_children() if artist.get_gid() == "checkpoint:chosen")
    assert chosen.get_offsets().tolist() == [[8.0, 2624 / 2**20]]  # was at 7.0
    assert chosen.get_label() == "plan: 2.56 KiB, +7 ms (+8 ms priced cold)"
    matplotlib.pyplot.close(ax.figure)
    # The report's SVG: x = 70 + (640 - 90) * 8 / 21 (the frontier's last point, 21 ms) = 279.5
    assert ('<circle cx="279.5" cy="103.8" r="6" fill="#d62728"><title>plan: 2.56 KiB, +7 ms (+8 ms priced cold)'
            '</title></circle>') in frontier_svg(plan)


def test_the_frontier_plot_refuses_options_it_would_drop_or_pass_on_under_another_name() -> None:
    # Before: plot("checkpoint", k=3) raised "Profile.checkpoint_plan() got an unexpected keyword argument 'k'" (a
    # function the user did not call), and a CheckpointPlan drawn with budget= or planning options ignored them:
    # the marked plan was the one given, not the plan for that budget.
    matplotlib = pytest.importorskip("matplotlib")
    matplotlib.use("Agg")
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 1))
    x = torch.randn(4, 4)
    prof = _profile(net, lambda: net(x).sum().backward())
    with pytest.raises(TypeError, match=r"^plot\('checkpoint'\) got an unexpected keyword argument 'k'; it takes "
                                        r"budget=, ax=, path= and checkpoint_plan's allow_side_effects=, "
                                        r"resolution=, wrap_cost=, runs=, peak=$"):
        prof.plot("checkpoint", k=3)
    plan = prof.checkpoint_plan(0.5)
    with pytest.raises(TypeError, match=r"^plot\('checkpoint'\) of a CheckpointPlan draws that plan: budget= and "
                                        r"allow_side_effects= apply to a profile \(prof.plot\('checkpoint', "
                                        r"budget=...\)\)$"):
        plot_checkpoint(plan, budget="30%", allow_side_effects=True)


def test_a_metric_given_to_the_frontier_plot_is_refused_not_dropped(tmp_path) -> None:
    # Before: prof.plot("checkpoint", "flops") and --plot-kind checkpoint --plot-metric flops drew the frontier
    # (saved memory against extra time) as if no metric had been given.
    from layerprof.cli import main

    matplotlib = pytest.importorskip("matplotlib")
    matplotlib.use("Agg")
    net = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))
    prof = _profile(net, lambda: net(torch.randn(4, 4)).sum().backward())
    with pytest.raises(ValueError, match=r"^plot\('checkpoint'\) draws saved memory against extra time: metric= "
                                         r"does not apply \(got 'flops'\)$"):
        prof.plot("checkpoint", "flops")
    saved = tmp_path / "p.json"
    prof.to_json(saved)
    assert main(["show", str(saved), "--plot", str(tmp_path / "p.png"), "--plot-kind", "checkpoint",
                 "--plot-metric", "flops"]) == 2
    assert not (tmp_path / "p.png").exists()
