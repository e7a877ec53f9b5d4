"""The host calibrations against a burst of noise (a preempted vCPU, another tenant of the host) over part of their
rounds: each takes the least of its bare and of its measured passes, which a burst cannot move unless it covers
every round of one side. A median of the rounds' differences could: in one CI run the live-bytes reader's figure
read about 2.1x its cost, which priced every recomputation of a live profile at 0 ms.
"""
from __future__ import annotations

import time
from typing import Any

import pytest
import torch
from torch import nn

from layerprof import LayerProf
from layerprof.collect import hook_cost as hooks, live_op_cost
from layerprof.plan import fault_cost

from .measured import measured_until


def test_a_burst_in_the_second_passes_does_not_zero_the_fault_cost(monkeypatch: pytest.MonkeyPatch) -> None:
    """Faked rounds of 1,000 pages: a first pass (faults) of 3.0 ms and a second of 0.5 ms, but for a burst of
    3 ms in the second pass of three of the five rounds. The median of the rounds' differences read 0 µs."""
    calls = iter(range(5))

    def fake_round(pages: int) -> tuple[float, float]:
        return 3.0e-3, (3.5e-3 if next(calls) in (1, 2, 3) else 0.5e-3)

    monkeypatch.setattr(fault_cost, "_round", fake_round)
    assert fault_cost.page_fault_us(pages=1000, repeats=5) == pytest.approx(2.5)  # (3.0 - 0.5) ms / 1,000 pages


def test_a_burst_in_half_the_rounds_does_not_move_the_live_op_cost(monkeypatch: pytest.MonkeyPatch) -> None:
    """The calibration's rounds, faked: a bare loop of 10 ops takes 1,000 ns, a watched one 3,000 (200 ns an op
    for the reader), except where a burst (another tenant of the host, a preempted vCPU) adds 6,000 ns: in four of
    the six watched rounds kept (the first is dropped). The median of the rounds' differences read 800 ns an op."""
    calls = iter(range(100))

    def fake_round(x: Any, weight: Any, bias: Any, watcher: Any) -> tuple[int, int]:
        index = next(calls) // 2  # bare then watched, in each round
        if watcher is None:
            return 1_000, 0
        return (9_000 if index in (2, 3, 4, 5) else 3_000), 10

    monkeypatch.setattr(live_op_cost, "_round_ns", fake_round)
    assert live_op_cost._measure() == pytest.approx(200 / 1e6)  # ms: (3,000 - 1,000) / 10 ns


def _hook_cost_with_burst(monkeypatch: pytest.MonkeyPatch, burst_us: int) -> float:
    """``hook_cost()`` measured afresh, with every Linear call of five of the nine profiled steps (the 12th to 16th
    of the stack's 18 calls) slowed by ``burst_us`` µs of busy waiting; 0 for none."""
    made, steps = hooks.calibration_stack, [0]

    def stack_with_burst(layers: int) -> Any:
        stack, blocks, x = made(layers)
        stack.register_forward_pre_hook(lambda module, args: steps.__setitem__(0, steps[0] + 1))

        def slow(module: nn.Module, args: Any, output: Any) -> None:
            if 12 <= steps[0] <= 16:
                end = time.perf_counter_ns() + burst_us * 1000
                while time.perf_counter_ns() < end:
                    pass

        for block in blocks:
            for linear in block:
                linear.register_forward_hook(slow)
        return stack, blocks, x

    monkeypatch.setattr(hooks, "calibration_stack", stack_with_burst)
    monkeypatch.setattr(hooks, "_CACHE", {})
    threads = torch.get_num_threads()
    try:
        return hooks.hook_cost(LayerProf)
    finally:
        assert torch.get_num_threads() == threads


def test_a_burst_over_half_the_profiled_steps_does_not_move_the_hook_cost(monkeypatch: pytest.MonkeyPatch) -> None:
    """A burst of 30 µs on each Linear call (about twice its profiled forward) in five of the seven profiled steps
    kept (the 3rd to the 7th of nine): the medians' difference read 3.0-3.8x the clean figure (40.6 µs against
    13.7, 40.7 against 10.7); the least of each side stays within the clean figure's spread. Under the full
    suite's two workers the pair's own spread reached 1.8x in all three tries of one CI run (20.0 against 36.6
    µs): five tries, and a bound of 2x, still well under what the medians read."""
    def measure() -> tuple[float, float]:
        return _hook_cost_with_burst(monkeypatch, 0), _hook_cost_with_burst(monkeypatch, 30)

    clean, burst = measured_until(5, measure, lambda pair: pair[1] < 2 * pair[0])
    assert 0 < clean and burst < 2 * clean, (clean, burst)
