"""Added cost of counting bytes beside FLOPs in the flops meter's counting step, one thread.

    python benchmarks/bytes_cost.py [--repeats 9]

For each model, interleaved in one run: a step without profiler, a one-step profile with ``metrics=()``,
``metrics=("flops",)`` with bytes off (``FlopMeter.count_bytes = False``, the meter as it was) and with bytes on
(the default). Medians of ``--repeats`` steps, forward + backward, in CPU time of this process (the machine these
figures were taken on is shared: wall time there measures the other jobs); ratios are to the plain step.
"""
from __future__ import annotations

import argparse
import statistics
import time
from typing import Callable

import torch
from torch import nn

from layerprof import LayerProf
from layerprof.metrics.flops import FlopMeter


def resnet18() -> tuple[nn.Module, Callable[[], torch.Tensor]]:
    import torchvision

    model = torchvision.models.resnet18(weights=None)
    x = torch.randn(2, 3, 64, 64)
    return model, lambda: model(x).sum()


def bert() -> tuple[nn.Module, Callable[[], torch.Tensor]]:
    import transformers

    config = transformers.BertConfig(hidden_size=256, num_hidden_layers=4, num_attention_heads=4,
                                     intermediate_size=1024, attn_implementation="sdpa")
    model = transformers.BertModel(config)
    ids = torch.randint(0, config.vocab_size, (2, 64))
    return model, lambda: model(input_ids=ids).last_hidden_state.sum()


def deep_stack(depth: int = 300) -> tuple[nn.Module, Callable[[], torch.Tensor]]:
    model = nn.Sequential(*[nn.Linear(4, 4) for _ in range(depth)])
    x = torch.randn(1, 4)
    return model, lambda: model(x).sum()


def timed(model: nn.Module, loss_fn: Callable[[], torch.Tensor], mode: str) -> float:
    model.zero_grad(set_to_none=True)
    start = time.process_time()
    if mode == "plain":
        loss_fn().backward()
    else:
        FlopMeter.count_bytes = mode == "flops+bytes"
        with LayerProf(model, metrics=() if mode == "timing" else ("flops",)):
            loss_fn().backward()
    return time.process_time() - start


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=9)
    repeats = parser.parse_args().repeats
    torch.set_num_threads(1)
    modes = ("plain", "timing", "flops", "flops+bytes")
    print("| model | plain step | timing only | flops (no bytes) | flops + bytes | bytes added to the counting step |")
    print("|---|---|---|---|---|---|")
    models = (("resnet18 (2x3x64x64)", resnet18), ("BERT 4x256 (2x64)", bert), ("300 x Linear(4, 4)", deep_stack))
    for name, make in models:
        model, loss_fn = make()
        times: dict[str, list[float]] = {mode: [] for mode in modes}
        for mode in modes:
            timed(model, loss_fn, mode)  # warm-up
        for _ in range(repeats):
            for mode in modes:
                times[mode].append(timed(model, loss_fn, mode))
        median = {mode: statistics.median(values) * 1000 for mode, values in times.items()}
        plain = median["plain"]
        cells = [f"{median[mode]:.1f} ms ({median[mode] / plain:.2f}x)" for mode in modes]
        added = median["flops+bytes"] / median["flops"] - 1
        print(f"| {name} | " + " | ".join(cells) + f" | {100 * added:+.0f}% |")
    FlopMeter.count_bytes = True


if __name__ == "__main__":
    main()
