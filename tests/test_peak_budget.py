"""Planning against a budget of the step's peak: ``checkpoint_plan(peak=...)`` on real models, measured with the plan
applied (live tensor bytes on the CPU, exact and deterministic), its errors, and a brute-force check on small nets.
"""
from __future__ import annotations

import pytest
import torch

from layerprof import loads
from layerprof.plan import peak_budget
from layerprof.plan.solver import frontier
from layerprof.render.checkpoint import frontier_svg, plot_checkpoint

from .peak_cases import SHARES, make_case
from .test_peak_prediction import MODELS, TOLERANCE, _live_peak, _profiled, _trained, _zoo, profiled_model


def _resnet18_224() -> tuple[torch.nn.Module, dict[str, torch.Tensor]]:
    torchvision = pytest.importorskip("torchvision")
    return torchvision.models.resnet18(weights=None), {"x": torch.randn(2, 3, 224, 224)}


# ResNet-18 at 224 px: at the other tests' 64 px its parameter gradients (46.8 MB) are 95 % of the step's peak.
PEAK_MODELS = {**MODELS, "resnet18": (_resnet18_224, True)}


@pytest.mark.parametrize("name", sorted(PEAK_MODELS))
def test_a_peak_budget_is_met_as_measured(name: str) -> None:
    build, allow = PEAK_MODELS[name]
    model, step, profile, profiled = profiled_model(build)
    met = 0
    for share in (0.9, 0.75, 0.6):
        plan = profile.checkpoint_plan(peak=share, allow_side_effects=allow, wrap_cost=None)
        assert (plan.budget_kind, plan.budget_bytes, plan.peak_budget_bytes) == ("peak", None, int(share * profiled))
        assert plan.profiled_peak_bytes == profiled
        if not plan.feasible:  # the peak is the parameter gradients': no plan reaches it
            assert not plan.modules and plan.least_reachable_peak_bytes > plan.peak_budget_bytes
            assert plan.note is not None and "cannot be met" in plan.note
            continue
        met += 1
        assert plan.modules and plan.predicted_peak_bytes <= plan.peak_budget_bytes
        with plan.applied(model):
            measured = _live_peak(step)
        assert measured <= plan.peak_budget_bytes, (share, plan.modules)
        assert abs(measured - plan.predicted_peak_bytes) <= TOLERANCE * measured, (share, plan.modules)
    # BERT and GPT-2 (6 layers of 128, batch 2 of 128 tokens) reach 60 % of their peak; ResNet-18 (batch 2, 224 px)
    # only 90 %: below 86 % (72.4 of 84.2 MB) its parameter gradients and the stem's backward hold the peak.
    assert met == (1 if name == "resnet18" else 3)


def test_a_peak_no_plan_reaches_names_the_least_and_the_plan_that_reaches_it() -> None:
    model, step, profile, _ = profiled_model(_resnet18_224)
    plan = profile.checkpoint_plan(peak=0.6, allow_side_effects=True, wrap_cost=None)
    least = plan.least_reachable_peak_bytes
    assert not plan.feasible and not plan.modules and plan.predicted_peak_bytes == plan.profiled_peak_bytes
    assert least < plan.profiled_peak_bytes and plan.least_peak_modules
    assert f"the least predicted step peak of the {plan.plans_weighed} plans weighed is {least} bytes" in plan.note
    assert "OVER the peak budget" in str(plan)
    reached = profile.checkpoint_plan(peak=least, allow_side_effects=True, wrap_cost=None)
    assert reached.feasible and reached.predicted_peak_bytes <= least
    with reached.applied(model):
        assert _live_peak(step) <= least


def test_a_peak_budget_at_or_above_today_wraps_nothing() -> None:
    torch.manual_seed(0)
    model, inputs = _zoo("gpt2", "tiny")()
    profile = _profiled(model, _trained(model, inputs))
    profiled = profile.meta["live_memory"]["step_peak_bytes"]
    for peak in (1.0, "100%", profiled, f"{profiled * 2}B"):
        plan = profile.checkpoint_plan(peak=peak, wrap_cost=None)
        assert plan.feasible and not plan.modules and plan.predicted_peak_bytes == profiled
        assert plan.note == (f"the peak budget ({plan.peak_budget_bytes} bytes) is not below the profiled step's "
                             f"peak ({profiled} bytes): nothing to wrap")
    half = profile.checkpoint_plan(peak="50%", wrap_cost=None)
    assert half.peak_budget_bytes == profiled // 2
    assert half.to_dict()["budget_kind"] == "peak" and half.to_dict()["peak_budget_bytes"] == profiled // 2
    assert repr(half).endswith(f"(peak budget {profiled // 2}), +{half.extra_ms:.3f} ms>")


def test_peak_budget_errors_name_the_argument() -> None:
    torch.manual_seed(0)
    model, inputs = _zoo("gpt2", "tiny")()
    step = _trained(model, inputs)
    profile = _profiled(model, step)
    with pytest.raises(TypeError, match="budget= for the memory saved for backward, or peak=.*got neither"):
        profile.checkpoint_plan()
    with pytest.raises(TypeError, match="got both"):
        profile.checkpoint_plan(0.5, peak=0.5)
    with pytest.raises(ValueError, match="cannot read peak 'lots'"):
        profile.checkpoint_plan(peak="lots")
    with pytest.raises(ValueError, match="peak -1 must be a non-negative number of bytes"):
        profile.checkpoint_plan(peak=-1)
    with pytest.raises(TypeError, match="peak must be bytes, a size string or a fraction, got list"):
        profile.checkpoint_plan(peak=[1])
    plain = _profiled(model, step, metric="memory")
    with pytest.raises(ValueError, match=r"peak: .*no reader for the step's device.*metrics=\(\"live_memory\",\)"):
        plain.checkpoint_plan(peak=0.5)
    # A saved profile keeps the step's tables (tests/test_saved_step_tables.py): loaded, it plans by the peak too.
    assert loads(profile.to_json()).checkpoint_plan(peak=0.5, wrap_cost=None).to_dict() == \
        profile.checkpoint_plan(peak=0.5, wrap_cost=None).to_dict()


def test_the_frontier_figures_show_each_plans_predicted_peak() -> None:
    torch.manual_seed(0)
    model, inputs = _zoo("gpt2", "tiny")()
    profile = _profiled(model, _trained(model, inputs))
    plan = profile.checkpoint_plan(peak="80%", wrap_cost=None)
    # (Not asserted here: that the plan does not say its host figures read high. Under three busy processes on
    # the 2 cores it said so in 2 of 6 runs, and in one run of the suite on 12 workers of a GPU machine; the live
    # profile test checks it, retried.)
    points = plan.pareto()
    assert all(point.predicted_peak_bytes is not None for point in points)
    assert points[0].predicted_peak_bytes == plan.profiled_peak_bytes  # wrapping nothing: today's peak
    svg = frontier_svg(plan)
    assert 'class="checkpoint-peaks"' in svg and "peak budget" in svg
    matplotlib = pytest.importorskip("matplotlib")
    matplotlib.use("Agg")
    ax = plot_checkpoint(plan)
    gids = {artist.get_gid() for artist in ax.get_children()}
    assert {"checkpoint:peaks", "checkpoint:chosen-peak", "checkpoint:budget"} <= gids
    assert ax.get_ylabel() == "memory (MiB)"
    matplotlib.pyplot.close(ax.figure)


def test_a_live_profile_priced_at_nothing_still_plans_under_a_peak(monkeypatch: pytest.MonkeyPatch) -> None:
    """The reader's cost per op set far above its true figure (one CI run's calibration read about 2.1x it): every
    recomputation of tiny GPT-2's live profile is priced at 0 ms. The frontier then starts with many free
    levels; it once kept the first, which wraps nothing, and no plan was weighed: "cannot be met" at 80 %."""
    from layerprof.collect import live_op_cost as reader

    # ms an op: more than any module's forward, preempted ones too (at 1 ms, two modules kept 2.6 and 3.6 ms of
    # price in a suite run on 4 workers over 2 cores)
    monkeypatch.setitem(reader._CACHE, "cpu", 1000.0)
    torch.manual_seed(0)
    model, inputs = _zoo("gpt2", "tiny")()
    profile = _profiled(model, _trained(model, inputs))
    plan = profile.checkpoint_plan(peak="80%", wrap_cost=None)
    assert set(plan._costs) == {0.0}  # every recomputation priced at nothing
    assert plan.feasible and plan.modules and plan.predicted_peak_bytes <= plan.peak_budget_bytes
    assert plan.cold_extra_ms == 0.0
    assert plan.pareto()[0].modules == ()  # today's point first all the same
    # Said: every timed module loses more than its forward to the figure (1 s an op).
    assert plan.host_figures_high and len(plan.over_deducted) == plan.timed_modules >= 3
    assert f"note: for {plan.timed_modules} of the {plan.timed_modules} modules timed" in str(plan)


def test_the_peak_plan_against_every_admissible_set_on_small_nets() -> None:
    """On 12 random small nets (seeded costs, a grid that rounds nothing) at 7 peak budgets each: the plan meets its
    budget as predicted; no plan of the saved-bytes frontier is cheaper and fits (the guarantee); nor is any set
    that is Pareto-optimal (bytes freed against cost, no other set as good in both) and fits. The brute force then
    counts how often some other set is cheaper."""
    optimal = costlier = missed = budgets = 0
    for seed in range(12):
        case = make_case(seed)
        peaks = {chosen: case.peak(chosen) for chosen in case.sets}
        freed = {chosen: case.freed(chosen) for chosen in case.sets}
        costs = {chosen: case.cost(chosen) for chosen in case.sets}
        pareto = {a for a in case.sets if not any(
            freed[b] >= freed[a] and costs[b] <= costs[a] and (freed[b], costs[b]) != (freed[a], costs[a])
            for b in case.sets) and sum((freed[b], costs[b]) == (freed[a], costs[a]) for b in case.sets) == 1}
        base = case.base
        saved_frontier = frontier(base._weights, base._costs, base._ends, case.resolution, base._options)
        for share in SHARES:
            budget = int(share * base.profiled_peak_bytes)
            plan = case.plan(budget)
            cost = plan.cold_extra_ms if plan.feasible else float("inf")
            if plan.feasible:
                assert plan.predicted_peak_bytes <= budget
            for solution in saved_frontier:
                if case.peak(solution.chosen) <= budget:
                    assert cost <= solution.cost + 1e-9, (seed, share)
            for chosen in pareto:
                if peaks[chosen] <= budget:
                    assert cost <= costs[chosen] + 1e-9, (seed, share)
            fitting = [costs[chosen] for chosen in case.sets if peaks[chosen] <= budget]
            if not fitting:
                assert not plan.feasible
                continue
            budgets += 1
            if not plan.feasible:
                missed += 1
            elif cost <= min(fitting) + 1e-9:
                optimal += 1
            else:
                costlier += 1
    # Over seeds 0-59 (benchmarks/checkpoint_peak.py --optimality 60): 234 budgets some set meets, 222 planned at the
    # optimum, 4 dearer (0.8 % at the median, 12 % at most), 8 with no plan found; with the saved-bytes frontier
    # alone (ROUNDS = 0), 104 optimal, 46 dearer and 84 missed.
    print(f"peak plans on 12 small nets: {budgets} reachable budgets, {optimal} optimal, {costlier} dearer, "
          f"{missed} missed")
    assert budgets >= 40 and optimal >= 0.9 * budgets  # here: 40 of 40 (torch 2.14)


def test_without_the_rounds_the_saved_bytes_frontier_alone_misses_more(monkeypatch: pytest.MonkeyPatch) -> None:
    """The frontiers of the bytes held at a peak find plans the saved-bytes frontier lacks. Seed 18 (a Linear, two
    blocks, a Linear): the step peaks in the backward of the second block's last Linear. At 85 % of the peak
    (581,491 bytes) the saved-bytes frontier's cheapest fit wraps both blocks ('1' and '2', 9.01 ms: at that cost
    the frontier's own plan is the run of both, '[1:3]', which frees 8 KiB more and fits not, its peak at 684,108;
    the walk weighs both ends of a cost), where the first block alone fits (553,036 bytes) at 4.72 ms: the second
    block's bytes are back by then (its recomputation ran at its backward's start). At 80 % no plan on it fits, and
    '[0:2]' (the first Linear and block) does."""
    case = make_case(18)
    for share, rounds, alone in ((0.85, ["1"], ["1", "2"]), (0.8, ["[0:2]"], [])):
        budget = int(share * case.base.profiled_peak_bytes)
        monkeypatch.setattr(peak_budget, "ROUNDS", 4)
        with_rounds = case.plan(budget)
        monkeypatch.setattr(peak_budget, "ROUNDS", 0)
        without = case.plan(budget)
        assert (with_rounds.modules, without.modules, without.feasible) == (rounds, alone, bool(alone))
        assert with_rounds.predicted_peak_bytes <= budget
        assert not alone or without.cold_extra_ms > with_rounds.cold_extra_ms
