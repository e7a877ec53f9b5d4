"""The step's peak memory with a checkpoint plan, predicted against measured, on real models.

    python benchmarks/checkpoint_peak.py [--models bert-base,gpt2,resnet50,resnet18] [--device cpu|cuda]

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
from layerprof.plan.verify import _cuda_peak, _live_peak  # noqa: E402  (the peaks verify_plan reads)
from layerprof.render.checkpoint import peak_place  # noqa: E402
from layerprof.render.units import format_bytes, format_ms  # noqa: E402

BUDGETS = (0.75, 0.5, 0.25)
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
class ReaderCost:
    model: str
    plain_ms: float
    reading_ms: float


# -- collection ------------------------------------------------------------------------------------------------
def _peak_of(device: str) -> Callable[[Callable[[], Any]], int]:
    """How ``verify_plan`` reads a plain step's peak on ``device``: live tensor bytes on the CPU, the allocator's
    ``max_memory_allocated`` on CUDA."""
    return _live_peak if device == "cpu" else _cuda_peak


def collect(name: str, device: str) -> tuple[list[PeakRow], ReaderCost | None]:
    build, cpu_batch, cuda_batch = MODELS[name]
    torch.manual_seed(0)
    model, loss_fn = build(cpu_batch if device == "cpu" else cuda_batch, device)
    model.train()

    def step() -> None:
        model.zero_grad(set_to_none=True)
        loss_fn().backward()

    step()
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


def render_costs(costs: list[ReaderCost]) -> str:
    return "\n".join(f"{cost.model}: a plain step {format_ms(cost.plain_ms)}, with the live-bytes reader open "
                     f"{format_ms(cost.reading_ms)} (x{cost.reading_ms / cost.plain_ms:.2f})" for cost in costs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    options = parser.parse_args()
    names = [name for name in options.models.split(",") if name]
    unknown = [name for name in names if name not in MODELS]
    if unknown:
        parser.error(f"--models: unknown {unknown}; choose from {sorted(MODELS)}")
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
