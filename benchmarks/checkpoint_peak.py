"""The step's peak memory with a checkpoint plan, predicted against measured, on real models.

    python benchmarks/checkpoint_peak.py [--models bert-base,gpt2,resnet50,resnet18] [--device cpu|cuda]
                                         [--peak] [--optimality N] [--planning-time]

For each model and budget (75, 50 and 25 % of today's saved-for-backward bytes): the plan's predicted step peak
(``plan.predicted_peak_bytes``) against the peak of a plain step (no profiler) with the plan applied, and the
fall from today's peak, predicted against measured. The step is a GPU user's: gradients set to None, forward,
backward. On the CPU the profile is taken with ``metrics=("live_memory",)`` and a step's peak is the live-bytes
reader's (the most bytes of tensors made in the step alive at once, exact); on CUDA with ``metrics=("memory",)``
and ``max_memory_allocated`` (``--device cuda``, the sizes of ``benchmarks/gpu.py``: ResNet-50 at batch 32, BERT-base
at batch 8, GPT-2 at batch 16). The CPU sizes are smaller (a 2-core machine): ResNet-50 at batch 2 (224 px),
ResNet-18 at batch 4 (224 px), GPT-2 (6 layers of 128) at batch 16 of 128; BERT-base as on CUDA, at batch 8 of 128
tokens (at batch 2 its 440 MB of parameter gradients hold the peak, at the word embeddings' backward, and no plan
moves it: predicted, and no test of the model).
Last, on the CPU, what opting in costs: a plain step's time with the live-bytes reader open and without (median
the least of 5). About 5 minutes on an idle 2-core CPU.

``--peak`` plans by budgets of the step's peak instead (``checkpoint_plan(peak=...)`` at 90, 75 and 60 % of the
profiled peak) and verifies each plan (``verify_plan``, 3 paired steps): predicted against measured peak and extra
time per step (about 8 minutes on an idle 2-core CPU for the four models). ``--optimality N``: the brute force of
``tests/test_peak_budget.py`` on N random small nets (every admissible set, seeded costs), how often the peak plan
is the optimum, and the same with the saved-bytes frontier alone (about 1 s a net). ``--planning-time``: seconds
to plan a profiled 10,000-module model (25 Sequentials of 99 blocks of Linear-GELU-Linear) by its saved bytes and
by 90, 75, 60 and 30 % of its peak, over modules only (``runs=False``: weighing every run of 2,475 Sequentials from
the storages takes tens of seconds by itself), about 1 minute.
"""
from __future__ import annotations

import argparse
import sys
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from layerprof import LayerProf  # noqa: E402
from layerprof.metrics.live_bytes import read_step  # noqa: E402
from layerprof.plan.verify import _cuda_peak, _live_peak, verify_plan  # noqa: E402  (the peaks verify_plan reads)
from layerprof.render.checkpoint import peak_place  # noqa: E402
from layerprof.render.units import format_bytes, format_ms  # noqa: E402

BUDGETS = (0.75, 0.5, 0.25)
PEAK_BUDGETS = (0.9, 0.75, 0.6)
MIB = 2**20


# -- the models ------------------------------------------------------------------------------------------------
def _resnet(depth: int, batch: int, device: str) -> tuple[nn.Module, Callable[[], torch.Tensor]]:
    import torchvision

    model = getattr(torchvision.models, f"resnet{depth}")(weights=None).to(device)
    x = torch.randn(batch, 3, 224, 224, device=device)
    return model, lambda: model(x).sum()


def _bert_base(batch: int, device: str) -> tuple[nn.Module, Callable[[], torch.Tensor]]:
    import transformers

    config = transformers.BertConfig(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    model = transformers.BertModel(config).to(device)
    ids = torch.randint(0, config.vocab_size, (batch, 128), device=device)
    return model, lambda: model(input_ids=ids).last_hidden_state.float().pow(2).mean()


def _gpt2(batch: int, device: str) -> tuple[nn.Module, Callable[[], torch.Tensor]]:
    import transformers

    config = transformers.GPT2Config(vocab_size=200, n_embd=128, n_layer=6, n_head=4, n_positions=128, use_cache=False)
    model = transformers.GPT2LMHeadModel(config).to(device)
    ids = torch.randint(0, 200, (batch, 128), device=device)
    return model, lambda: model(input_ids=ids, labels=ids).loss


# name -> (builder, batch on the CPU, batch on CUDA)
MODELS: dict[str, tuple[Callable[..., Any], int, int]] = {
    "bert-base": (_bert_base, 8, 8),
    "gpt2": (_gpt2, 16, 16),
    "resnet50": (lambda batch, device: _resnet(50, batch, device), 2, 32),
    "resnet18": (lambda batch, device: _resnet(18, batch, device), 4, 32),
}


# -- records ---------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class PeakRow:
    """One plan: bytes only (rendering formats them)."""

    model: str
    budget: float
    wrapped: int
    saved_before: int
    saved_after: int
    profiled_peak: int  # today's, in the profiled step
    plain_peak: int  # today's, in a plain step
    predicted_peak: int
    measured_peak: int
    phase: str
    at: str | None


@dataclass(frozen=True)
class PeakBudgetRow:
    """One plan for a budget of the step's peak, verified: bytes and ms only."""

    model: str
    share: float
    budget: int
    feasible: bool
    wrapped: int
    profiled_peak: int
    predicted_peak: int
    measured_peak: int | None
    least_peak: int | None
    predicted_ms: float
    measured_ms: float | None
    planning_s: float


@dataclass(frozen=True)
class ReaderCost:
    model: str
    plain_ms: float
    reading_ms: float


# -- collection ------------------------------------------------------------------------------------------------
def _peak_of(device: str) -> Callable[[Callable[[], Any]], int]:
    """How ``verify_plan`` reads a plain step's peak on ``device``: live tensor bytes on the CPU, the allocator's
    ``max_memory_allocated`` on CUDA."""
    return _live_peak if device == "cpu" else _cuda_peak


def _training(name: str, device: str) -> tuple[nn.Module, Callable[[], None]]:
    """The model at its size for ``device``, in training, and its step (gradients set to None, forward,
    backward), run once."""
    build, cpu_batch, cuda_batch = MODELS[name]
    torch.manual_seed(0)
    model, loss_fn = build(cpu_batch if device == "cpu" else cuda_batch, device)
    model.train()

    def step() -> None:
        model.zero_grad(set_to_none=True)
        loss_fn().backward()

    step()
    return model, step


def collect(name: str, device: str) -> tuple[list[PeakRow], ReaderCost | None]:
    model, step = _training(name, device)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # one step under the memory meter
        with LayerProf(model, metrics=("live_memory" if device == "cpu" else "memory",)) as prof:
            step()
    peak_of = _peak_of(device)
    plain = peak_of(step)
    rows = []
    for budget in BUDGETS:
        plan = prof.checkpoint_plan(budget, allow_side_effects=True, wrap_cost=None)
        with plan.applied(model):
            measured = peak_of(step)
        rows.append(PeakRow(name, budget, len(plan.modules), plan.saved_bytes_before, plan.saved_bytes_after,
                            plan.profiled_peak_bytes, plain, plan.predicted_peak_bytes, measured,
                            plan.predicted_peak_phase, plan.predicted_peak_at))
        print(render_rows(rows[-1:], header=False), flush=True)
    return rows, _reader_cost(name, step) if device == "cpu" else None


def collect_peak_budgets(name: str, device: str) -> list[PeakBudgetRow]:
    """Plans for 90, 75 and 60 % of the profiled step's peak, each verified on the model (3 paired steps)."""
    model, step = _training(name, device)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the memory meter's step; the times come from the others
        with LayerProf(model, metrics=("live_memory" if device == "cpu" else "memory",)) as prof:
            for _ in range(3):
                step()
                prof.step()
    rows = []
    for share in PEAK_BUDGETS:
        start = time.perf_counter()
        plan = prof.checkpoint_plan(peak=share, allow_side_effects=True)
        planning = time.perf_counter() - start
        result = verify_plan(plan, model, step, repeats=3) if plan.modules else None
        rows.append(PeakBudgetRow(
            name, share, plan.peak_budget_bytes, plan.feasible, len(plan.modules), plan.profiled_peak_bytes,
            plan.predicted_peak_bytes, None if result is None or result.peak_bytes is None else result.peak_bytes[1],
            plan.least_reachable_peak_bytes, plan.extra_ms, None if result is None else result.measured_extra_ms,
            planning))
        print(render_peak_budgets(rows[-1:], header=False), flush=True)
    return rows


def optimality(nets: int) -> str:
    """The brute force of ``tests/test_peak_budget.py`` on ``nets`` random small nets, with the rounds of
    frontiers of the bytes held at a peak (the planner) and without them (the saved-bytes frontier alone)."""
    from layerprof.plan import peak_budget
    from tests.peak_cases import SHARES, make_case

    counts = {rounds: [0, 0, 0, []] for rounds in (peak_budget.ROUNDS, 0)}  # optimal, dearer, missed, gaps
    budgets, default = 0, peak_budget.ROUNDS
    try:
        for seed in range(nets):
            case = make_case(seed)
            peaks = {chosen: case.peak(chosen) for chosen in case.sets}
            for share in SHARES:
                budget = int(share * case.base.profiled_peak_bytes)
                fitting = [case.cost(chosen) for chosen in case.sets if peaks[chosen] <= budget]
                if not fitting:
                    continue
                budgets += 1
                for rounds, found in counts.items():
                    peak_budget.ROUNDS = rounds
                    plan = case.plan(budget)
                    if not plan.feasible:
                        found[2] += 1
                    elif plan.cold_extra_ms <= min(fitting) + 1e-9:
                        found[0] += 1
                    else:
                        found[1] += 1
                        found[3].append(plan.cold_extra_ms / min(fitting) - 1)
    finally:
        peak_budget.ROUNDS = default
    lines = [f"{nets} small nets, {budgets} peak budgets some admissible set meets:"]
    for rounds, (optimal, dearer, missed, gaps) in counts.items():
        gaps.sort()
        what = "saved-bytes frontier alone" if rounds == 0 else f"the planner ({rounds} rounds)"
        median = f", by {gaps[len(gaps) // 2]:.1%} at the median, {gaps[-1]:.1%} at most" if gaps else ""
        lines.append(f"  {what}: {optimal} optimal, {dearer} dearer{median}, {missed} without a plan")
    return "\n".join(lines)


def planning_time() -> str:
    """Seconds to plan a profiled 10,000-module model by saved bytes and by budgets of its peak (modules only)."""
    import random

    rng = random.Random(0)
    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Sequential(*[nn.Sequential(nn.Linear(16, width), nn.GELU(), nn.Linear(width, 16))
                                            for width in (rng.choice([16, 64, 256]) for _ in range(99))])
                            for _ in range(25)])
    x = torch.randn(64, 16)

    def step() -> None:
        model.zero_grad(set_to_none=True)
        model(x).sum().backward()

    step()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with LayerProf(model, metrics=("live_memory",)) as prof:
            step()
    prof.checkpoint_plan(0.5, wrap_cost=None, runs=False)  # the profiler's hook cost, measured once a process
    lines = [f"planning a {len(prof.records):,}-module model (modules only):"]
    for label, kwargs in [("saved 50 %", {"budget": 0.5})] + [(f"peak {share:.0%}", {"peak": share})
                                                              for share in (0.9, 0.75, 0.6, 0.3)]:
        start = time.perf_counter()
        plan = prof.checkpoint_plan(**kwargs, wrap_cost=None, runs=False)
        lines.append(f"  {label}: {time.perf_counter() - start:.3f} s ({plan.plans_weighed} plans predicted, "
                     f"{len(plan.modules)} wrapped)")
    return "\n".join(lines)


def _reader_cost(name: str, step: Callable[[], None]) -> ReaderCost:
    def timed(run: Callable[[], Any]) -> float:
        start = time.perf_counter()
        run()
        return (time.perf_counter() - start) * 1e3

    plain, reading = [], []
    for _ in range(5):  # interleaved, the least of each: what a busy machine adds only lengthens a step
        plain.append(timed(step))
        reading.append(timed(lambda: read_step(step)))
    return ReaderCost(name, min(plain), min(reading))


# -- rendering -------------------------------------------------------------------------------------------------
HEADER = ("| model | budget | wrapped | saved (MiB) | peak today (MiB) | peak predicted | peak measured | error | "
          "fall predicted | fall measured | predicted peak is |\n|---|---|---|---|---|---|---|---|---|---|---|")


def render_rows(rows: list[PeakRow], header: bool = True) -> str:
    lines = [HEADER] if header else []
    for row in rows:
        error = (row.predicted_peak - row.measured_peak) / row.measured_peak
        lines.append(
            f"| {row.model} | {row.budget:.0%} | {row.wrapped} | {row.saved_before / MIB:.1f} -> "
            f"{row.saved_after / MIB:.1f} | {row.profiled_peak / MIB:.1f} (plain {row.plain_peak / MIB:.1f}) | "
            f"{row.predicted_peak / MIB:.1f} | {row.measured_peak / MIB:.1f} | {error:+.2%} | "
            f"{(row.profiled_peak - row.predicted_peak) / MIB:.1f} | {(row.plain_peak - row.measured_peak) / MIB:.1f} | "
            f"{peak_place(row.phase, row.at)} |")
    return "\n".join(lines)


PEAK_HEADER = ("| model | peak budget | MiB | wrapped | peak today (MiB) | predicted | measured | error | extra ms "
               "predicted | measured | planning s |\n|---|---|---|---|---|---|---|---|---|---|---|")


def render_peak_budgets(rows: list[PeakBudgetRow], header: bool = True) -> str:
    lines = [PEAK_HEADER] if header else []
    for row in rows:
        if not row.feasible:
            lines.append(f"| {row.model} | {row.share:.0%} | {row.budget / MIB:.1f} | out of reach: least "
                         f"{(row.least_peak or 0) / MIB:.1f} | {row.profiled_peak / MIB:.1f} | | | | | | "
                         f"{row.planning_s:.2f} |")
            continue
        measured = "" if row.measured_peak is None else f"{row.measured_peak / MIB:.1f}"
        error = "" if row.measured_peak is None else (
            f"{(row.predicted_peak - row.measured_peak) / row.measured_peak:+.2%}")
        extra = "" if row.measured_ms is None else f"{row.measured_ms:+.1f}"
        lines.append(f"| {row.model} | {row.share:.0%} | {row.budget / MIB:.1f} | {row.wrapped} | "
                     f"{row.profiled_peak / MIB:.1f} | {row.predicted_peak / MIB:.1f} | {measured} | {error} | "
                     f"{row.predicted_ms:+.1f} | {extra} | {row.planning_s:.2f} |")
    return "\n".join(lines)


def render_costs(costs: list[ReaderCost]) -> str:
    return "\n".join(f"{cost.model}: a plain step {format_ms(cost.plain_ms)}, with the live-bytes reader open "
                     f"{format_ms(cost.reading_ms)} (x{cost.reading_ms / cost.plain_ms:.2f})" for cost in costs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument("--peak", action="store_true", help="plan by budgets of the step's peak, verified")
    parser.add_argument("--optimality", type=int, metavar="N", help="the brute force on N small nets, only")
    parser.add_argument("--planning-time", action="store_true", help="a 10,000-module model's planning time, only")
    options = parser.parse_args()
    names = [name for name in options.models.split(",") if name]
    unknown = [name for name in names if name not in MODELS]
    if unknown:
        parser.error(f"--models: unknown {unknown}; choose from {sorted(MODELS)}")
    if options.optimality is not None or options.planning_time:
        if options.optimality is not None:
            print(optimality(options.optimality), flush=True)
        if options.planning_time:
            print(planning_time(), flush=True)
        return
    if options.peak:
        print(PEAK_HEADER, flush=True)
        for name in names:
            collect_peak_budgets(name, options.device)
        return
    print(HEADER, flush=True)
    rows, costs = [], []
    for name in names:
        found, cost = collect(name, options.device)
        rows += found
        costs += [cost] if cost is not None else []
    worst = max(rows, key=lambda row: abs(row.predicted_peak - row.measured_peak) / row.measured_peak)
    print(f"\nlargest error: {worst.model} at {worst.budget:.0%}, predicted {format_bytes(worst.predicted_peak)} "
          f"against {format_bytes(worst.measured_peak)} measured")
    if costs:
        print(render_costs(costs))


if __name__ == "__main__":
    main()
