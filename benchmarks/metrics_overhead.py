"""Cost of the params, shapes and memory meters, beside timing alone, one thread.

    python benchmarks/metrics_overhead.py [--repeats 20]

For each model: the median step (forward + backward) with ``metrics=()``, and with each meter on, interleaved;
the extra time per module call (µs); and the time the params meter takes to read the model once.
"""
from __future__ import annotations

import argparse
import statistics
import time
from typing import Any, Callable

import torch
from torch import nn

from layerprof import LayerProf
from layerprof.metrics.params import ParamsMeter
from layerprof.record.records import build_tree


def resnet18() -> tuple[nn.Module, Callable[[], torch.Tensor]]:
    import torchvision

    model = torchvision.models.resnet18(weights=None)
    x = torch.randn(2, 3, 64, 64)
    return model, lambda: model(x).sum()


def gpt2() -> tuple[nn.Module, Callable[[], torch.Tensor]]:
    import transformers

    config = transformers.GPT2Config(vocab_size=1000, n_embd=64, n_layer=2, n_head=2, n_positions=64)
    model = transformers.GPT2LMHeadModel(config)
    ids = torch.randint(0, 1000, (2, 32))
    return model, lambda: model(input_ids=ids, labels=ids).loss


def deep_stack(depth: int = 300) -> tuple[nn.Module, Callable[[], torch.Tensor]]:
    model = nn.Sequential(*[nn.Linear(4, 4) for _ in range(depth)])
    x = torch.randn(1, 4)
    return model, lambda: model(x).sum()


def step(model: nn.Module, loss_fn: Callable[[], torch.Tensor], metrics: tuple[str, ...]) -> tuple[float, int]:
    model.zero_grad(set_to_none=True)
    start = time.perf_counter()
    with LayerProf(model, metrics=metrics) as prof:
        loss_fn().backward()
    elapsed = time.perf_counter() - start
    return elapsed, sum(record.calls for record in prof.records.values())


def params_read_ms(model: nn.Module, repeats: int = 5) -> float:
    _, records, entries = build_tree(model)
    times = []
    for _ in range(repeats):
        meter = ParamsMeter()
        start = time.perf_counter()
        meter.start(model, records, entries)
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def measure(name: str, factory: Callable[[], tuple[nn.Module, Callable[[], torch.Tensor]]], repeats: int) -> dict[str, Any]:
    model, loss_fn = factory()
    variants = {"timing only": (), "params": ("params",), "shapes": ("shapes",), "memory": ("memory",)}
    for metrics in variants.values():
        step(model, loss_fn, metrics)
    samples: dict[str, list[float]] = {key: [] for key in variants}
    calls = 0
    for _ in range(repeats):
        for key, metrics in variants.items():
            elapsed, calls = step(model, loss_fn, metrics)
            samples[key].append(elapsed)
    medians = {key: statistics.median(values) * 1e3 for key, values in samples.items()}
    base = medians["timing only"]
    result: dict[str, Any] = {"module calls": calls, "timing only ms": round(base, 2)}
    for key in ("params", "shapes", "memory"):
        result[f"{key} ms"] = round(medians[key], 2)
        result[f"{key} µs/call"] = round((medians[key] - base) / calls * 1e3, 2)
    result["params read ms"] = round(params_read_ms(model), 2)
    print(name, result, flush=True)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    print(f"torch {torch.__version__}, 1 thread, median of {args.repeats} interleaved steps")
    measure("resnet18 b2 64x64", resnet18, args.repeats)
    measure("gpt2 2x64 s32 b2", gpt2, args.repeats)
    measure("deep stack 300 x Linear(4,4)", deep_stack, args.repeats)


if __name__ == "__main__":
    main()
