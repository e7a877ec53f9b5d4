"""A chosen plan's wrappers priced by the other work between them: the calibration's gap points, the gaps read from
the profiled step's call times, and the plan's figures (the knapsack's choice unchanged)."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from layerprof.plan.gaps import gap_savings, wrapped_spans
from layerprof.plan.wrap_cost import WrapCost, gap_points, wrap_cost
from layerprof.record.records import CallTiming
from tests.test_checkpoint_bytes import _profile

# Back to back 0.2 ms a call; after 0.5 ms of forward and 1 ms of backward work 0.5; cold (1 ms, 2 ms) 0.8.
POINTS = ((0.0, 0.0, 0.2), (0.5, 1.0, 0.5), (1.0, 2.0, 0.8))
COST = WrapCost(per_call_ms=0.8, per_tensor_ms=0.01, source="measured", gap_points=POINTS)


def test_per_call_cost_interpolates_each_side_and_averages() -> None:
    # forward 0.25: halfway from 0 to 0.5, 0.2 + 0.5 x 0.3 = 0.35; backward 3.0, past the last point: 0.8.
    assert COST.per_call_at(0.25, 3.0) == pytest.approx((0.35 + 0.8) / 2)
    # no wrapped call before it in forward: cold, 0.8; backward 0: back to back, 0.2.
    assert COST.per_call_at(None, 0.0) == pytest.approx(0.5)
    # forward 0.75: halfway from 0.5 to 1.0, 0.65; backward 1.5: halfway from 1 to 2, 0.65.
    assert COST.per_call_at(0.75, 1.5) == pytest.approx(0.65)
    assert COST.per_call_at(None, None) == 0.8
    # a given cost has no points: every call cold, whatever the gaps.
    assert WrapCost(0.8, 0.01).per_call_at(0.0, 0.0) == 0.8


def test_gap_points_never_fall_and_stay_under_the_cold_cost() -> None:
    # the 8-row filler read cheaper than back to back (noise): priced as back to back, 0.3.
    assert gap_points([(0.0, 0.0, 0.3), (0.4, 0.9, 0.2), (1.2, 2.4, 0.6)]) == (
        (0.0, 0.0, 0.3), (0.4, 0.9, 0.3), (1.2, 2.4, 0.6))
    # back to back read dearer than cold: cold, 0.6; a negative cost: 0.
    assert gap_points([(0.0, 0.0, 0.9), (1.0, 2.0, 0.6)]) == ((0.0, 0.0, 0.6), (1.0, 2.0, 0.6))
    assert gap_points([(0.0, 0.0, -0.1), (1.0, 2.0, 0.6)])[0][2] == 0.0


def _five() -> nn.Sequential:
    torch.manual_seed(0)
    blocks = [nn.Sequential(nn.Linear(16, 16), nn.Tanh(), nn.Linear(16, 16)) for _ in range(4)]
    return nn.Sequential(*blocks[:2], nn.Tanh(), *blocks[2:])  # each block frees its Tanh's output


def _fake_timings(records: dict) -> None:
    """Call times, ms: forward "0" 0-1, "1" 1.1-2.1, the Tanh "2" from 2.2, "3" 2.6-3.6, "4" 3.6-4.6; backward in
    reverse: "4" 10-11, "3" 11-12, "2" from 12.5, "1" 13-14, "0" 14.5-15.5. Each block's children inside it."""
    spans = {"0": (0.0, 1.0, 14.5, 1.0), "1": (1.1, 1.0, 13.0, 1.0), "2": (2.2, 0.3, 12.5, 0.2),
             "3": (2.6, 1.0, 11.0, 1.0), "4": (3.6, 1.0, 10.0, 1.0), "": (0.0, 4.6, 10.0, 5.5)}
    for name, record in records.items():
        parent = name.split(".")[0]
        start, ms, back, back_ms = spans[parent] if parent in spans else spans[""]
        if name != parent:  # a child: inside its block, not in a gap
            start, ms, back, back_ms = start + 0.1, 0.2, back + 0.1, 0.2
        record.call_times = [CallTiming(start, ms, back, back_ms)]


def test_savings_from_fake_call_times() -> None:
    records = _profile(_five(), torch.randn(4, 16, requires_grad=True)).profile.records
    _fake_timings(records)
    assert [span.forward for span in wrapped_spans(records, "1")] == [(1.1, 2.1)]
    assert [span.backward for span in wrapped_spans(records, "1")] == [(13.0, 14.0)]
    saving = gap_savings(records, ["0", "1", "3", "4"], COST, hook_ms=0.05)
    # Backward gaps run from the last wrapped call's backward start (its recomputation) to this one's, less the
    # hooks of the calls that start between (the last block's three children, the Tanh).
    # "0": forward first (cold 0.8); backward 14.5 - 13.0 = 1.5 less "1"'s children (13.1) 0.15 = 1.35: 0.605.
    #      Mean 0.7025: saves 0.0975.
    # "1": forward gap 1.1 - 1.0 = 0.1: 0.26; backward 13.0 - 11.0 = 2.0 less "3"'s children (11.1) and the Tanh
    #      (12.5), 0.2: 1.8: 0.74. Mean 0.5: saves 0.3.
    # "3": forward 2.6 - 2.1 = 0.5 less the Tanh's hooks (2.2) 0.45: 0.47; backward 11.0 - 10.0 = 1.0 less "4"'s
    #      children (10.1) 0.15 = 0.85: 0.455. Mean 0.4625: saves 0.3375.
    # "4": forward 3.6 - 3.6 = 0: 0.2; backward first (cold 0.8). Mean 0.5: saves 0.3.
    assert saving == pytest.approx({"0": 0.0975, "1": 0.3, "3": 0.3375, "4": 0.3})
    # Not adjacent: "0" and "4" have 2.6 ms of forward (less 1.1's, 2.2's and the children's hooks, 0.3) and
    # 4.5 ms of backward between their starts, past the cold point on both sides: priced as before.
    assert gap_savings(records, ["0", "4"], COST, hook_ms=0.05) == {"0": 0.0, "4": 0.0}
    # A run "[3:5]" spans "3"'s start to "4"'s end in forward, "4"'s backward start to "3"'s end in backward.
    assert [(s.forward, s.backward) for s in wrapped_spans(records, "[3:5]")] == [((2.6, 4.6), (10.0, 12.0))]
    # Given costs (no points) save nothing.
    assert gap_savings(records, ["0", "1"], WrapCost(0.8, 0.01), 0.05) == {"0": 0.0, "1": 0.0}


def test_the_plan_keeps_the_knapsacks_choice_and_lowers_its_figures() -> None:
    prof = _profile(_five(), torch.randn(64, 16, requires_grad=True))
    _fake_timings(prof.profile.records)
    # Half the 32 KiB: the four blocks (4 KiB each) or the whole model. 10 ms a saved tensor makes the model (21
    # tensors) dearer than the blocks (5 each) whatever the forward times: 0.8 + 210 against 3.2 + 200, and its
    # recompute holds theirs.
    cold = prof.checkpoint_plan(0.5, wrap_cost=WrapCost(0.8, 10.0), runs=False)
    plan = prof.checkpoint_plan(0.5, wrap_cost=WrapCost(0.8, 10.0, "measured", POINTS), runs=False)
    assert plan.modules == cold.modules == ["0", "1", "3", "4"]
    saving = gap_savings(prof.profile.records, plan.modules, plan.wrap_cost, plan.hook_ms)
    for mine, theirs in zip(plan.chosen, cold.chosen):
        assert mine.cold_wrap_ms == pytest.approx(theirs.wrap_ms)
        assert mine.wrap_ms == pytest.approx(theirs.wrap_ms - saving[mine.name])
    assert plan.extra_ms == pytest.approx(cold.extra_ms - sum(saving.values())) and sum(saving.values()) > 0
    row = plan.to_dict()
    assert row["cold_extra_ms"] == plan.cold_extra_ms
    assert [c["cold_wrap_ms"] for c in row["chosen"]] == [c.cold_wrap_ms for c in plan.chosen]
    assert "priced cold)" in str(plan) and "priced cold)" not in str(cold)


def test_adjacent_blocks_of_a_real_model_cost_less_than_cold() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(*(nn.Sequential(nn.Linear(128, 128), nn.Tanh(), nn.Linear(128, 128), nn.Tanh())
                            for _ in range(6)))
    prof = _profile(model, torch.randn(64, 128, requires_grad=True))
    records, hook_ms = prof.profile.records, prof.profile._measured("hook_ms")
    # The real step's call times, priced by given points that only a gap of a second reaches cold (the measured
    # points follow the host's caches, which a loaded machine moves: not what this test is about).
    wide = WrapCost(0.8, 0.01, "measured", ((0.0, 0.0, 0.2), (1000.0, 1000.0, 0.8)))
    saving = gap_savings(records, ["1", "2", "3"], wide, hook_ms)
    # "2" and "3" run right after a wrapped block in forward, "1" and "2" right before one (after it in
    # backward): each priced under cold, never under back to back (0.8 - 0.2 saved at the most).
    assert all(0 < saving[name] <= 0.6 for name in ("1", "2", "3")), saving
    # "1" is the first wrapped call in forward, "3" in backward: cold on that side, half the most saved at most.
    assert saving["1"] <= 0.3 and saving["3"] <= 0.3, saving
    # "2" has a wrapped neighbour on both sides: the most saved (whatever the gaps, up to a second each).
    assert saving["2"] >= max(saving["1"], saving["3"]), saving
    # The measured calibration on the same gaps: between nothing and cold less back to back, for each.
    cost = wrap_cost()
    measured = gap_savings(records, ["1", "2", "3"], cost, hook_ms)
    assert all(0 <= measured[name] <= cost.per_call_ms - cost.gap_points[0][2] + 1e-12 for name in measured)


def test_a_call_after_a_gap_never_costs_more_than_cold_nor_less_than_nothing() -> None:
    # A WrapCost whose cold cost was set below its points (``dataclasses.replace(wrap_cost(), per_call_ms=...)``)
    # or whose points are negative: a call is priced between 0 and the cold per-call cost, so ``extra_ms`` stays
    # at most ``cold_extra_ms`` and the savings at least 0.
    cheap = WrapCost(per_call_ms=0.3, per_tensor_ms=0.01, source="measured", gap_points=POINTS)
    assert cheap.per_call_at(0.75, 1.5) == 0.3  # 0.65 on both sides by the points: the cold 0.3
    assert cheap.per_call_at(0.0, 0.0) == pytest.approx(0.2)  # under cold: the points' 0.2
    negative = WrapCost(0.8, 0.01, "measured", ((0.0, 0.0, -0.4), (1.0, 2.0, 0.8)))
    assert negative.per_call_at(0.0, 0.0) == 0.0
    records = _profile(_five(), torch.randn(4, 16, requires_grad=True)).profile.records
    _fake_timings(records)
    saving = gap_savings(records, ["0", "1", "3", "4"], cheap, hook_ms=0.05)
    assert all(0.0 <= value <= 0.3 for value in saving.values()), saving  # one call each, at most 0.3 saved
