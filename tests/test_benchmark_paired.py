"""The checkpoint benchmark's paired timing (benchmarks/paired.py): the median's interval, the order of each pair,
and when ``extend`` stops adding pairs."""
from __future__ import annotations

from typing import Any

import pytest

from benchmarks.paired import Paired, cuda_timed, extend, median_ci, pair_order, run_pairs


def test_median_ci_order_statistics() -> None:
    # n = 10: P(Bin(10, 1/2) <= 1) = 11/1024 = 0.0107 <= 0.025 < P(<= 2) = 56/1024 = 0.0547, so k = 2: (x_2, x_9)
    assert median_ci([float(v) for v in range(10, 0, -1)]) == (2.0, 9.0)
    # n = 31: P(<= 9) = 0.0147 <= 0.025 < P(<= 10) = 0.0354, so k = 10: (x_10, x_22)
    assert median_ci([float(v) for v in range(1, 32)]) == (10.0, 22.0)
    # n = 81: P(<= 31) = 0.0224 <= 0.025 < P(<= 32) = 0.0374, so k = 32: (x_32, x_50)
    assert median_ci([float(v) for v in range(1, 82)]) == (32.0, 50.0)
    # n = 5: P(<= 0) = 1/32 = 0.031 > 0.025, no rank qualifies: the whole range
    assert median_ci([3.0, 1.0, 2.0, 5.0, 4.0]) == (1.0, 5.0)
    # a wider confidence takes ranks further out: at 50 %, n = 10, P(<= 3) = 176/1024 = 0.172 <= 0.25 < P(<= 4) = 0.377
    assert median_ci([float(v) for v in range(1, 11)], confidence=0.5) == (4.0, 7.0)


def test_median_ci_rejects_bad_input() -> None:
    with pytest.raises(ValueError, match="at least one value"):
        median_ci([])
    with pytest.raises(ValueError, match="confidence must be between 0 and 1"):
        median_ci([1.0], confidence=1.0)


def _steps(log: list[str]) -> tuple:
    return (lambda: log.append("base")), (lambda: log.append("plan"))


def test_run_pairs_alternates_order_after_a_warm_up_round() -> None:
    log: list[str] = []
    base, plan = _steps(log)
    found = run_pairs(base, {"plan": plan}, repeats=3)
    # 1 warm-up pair (base first) + 3 kept: plan first, base first, plan first (A B, B A, A B, B A)
    assert log == ["base", "plan", "plan", "base", "base", "plan", "plan", "base"]
    assert len(found["plan"].differences) == 3 and len(found["plan"].faults) == 3
    assert [pair_order(i) for i in range(4)] == [True, False, True, False]


def test_extend_stops_at_an_even_count_once_narrow() -> None:
    log: list[str] = []
    base, plan = _steps(log)
    paired = Paired(differences=[0.0, 0.1, 0.2, 0.3, 0.4], bases=[1.0] * 5, faults=[(0, 0)] * 5)
    extend(base, plan, paired, half_width=1e9, cap=20)
    # 5 pairs is an odd count: one more (index 6, base first), and at 6 the interval (any width) is narrow enough
    assert len(paired.differences) == 6 and log == ["base", "plan"]
    log.clear()
    few = Paired(differences=[0.0, 0.1], bases=[1.0] * 2, faults=[(0, 0)] * 2)
    extend(base, plan, few, half_width=1e9, cap=20)
    # under 6 pairs there is no 95 % interval yet: 4 more pairs (indices 3..6), 8 steps, however wide it may be
    assert len(few.differences) == 6 and len(log) == 8


def test_extend_runs_to_the_cap_while_wide() -> None:
    log: list[str] = []
    base, plan = _steps(log)
    paired = Paired(differences=[-50.0, 50.0], bases=[1.0] * 2, faults=[(0, 0)] * 2)
    extend(base, plan, paired, half_width=-1.0, cap=7)
    # 2 pairs given, 5 added (indices 3..7: plan first, base first, ...), 5 x 2 steps
    assert len(paired.differences) == 7 and len(log) == 10
    assert log[:4] == ["plan", "base", "base", "plan"]
    assert paired.half_width == pytest.approx(50.0)  # n = 7: no rank at 95 % beyond the range (-50, 50)


def test_pairs_take_the_timer_given() -> None:
    # A timer of known figures: the plan's step 7 ms, the plain one 5 ms, so every difference is exactly 2.
    log: list[str] = []
    base, plan = _steps(log)

    def timed(run: Any) -> tuple[float, int]:
        run()
        return (7.0 if log[-1] == "plan" else 5.0), 3

    found = run_pairs(base, {"plan": plan}, repeats=4, timed=timed)["plan"]
    extend(base, plan, found, half_width=-1.0, cap=8, timed=timed)
    assert found.differences == [2.0] * 8 and found.bases == [5.0] * 8 and found.faults == [(3, 3)] * 8


def test_cuda_timed_synchronizes_before_and_after_the_step(monkeypatch: pytest.MonkeyPatch) -> None:
    """A GPU step returns when its kernels are queued: the clock starts after the queue is drained and stops
    after the step's kernels are done (the second synchronize, standing in here for 20 ms of kernels)."""
    import time

    import torch

    calls: list[str] = []

    def synchronize(*args: Any) -> None:
        calls.append("sync")
        time.sleep(0.02 if len(calls) == 3 else 0.2)  # the first: earlier work drained before the clock starts

    monkeypatch.setattr(torch.cuda, "synchronize", synchronize)
    ms, _ = cuda_timed(lambda: calls.append("step"))
    assert calls == ["sync", "step", "sync"] and 20 <= ms < 200
