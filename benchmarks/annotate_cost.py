"""The cost of ``LayerProf(model, annotate=True)``: training-step time with and without the annotations.

Usage: python benchmarks/annotate_cost.py [--steps 20] [--repeats 5]. Prints the median step CPU time (process
time, so that other processes on a shared machine count less) of an
unprofiled run, of LayerProf, and of LayerProf(annotate=True), on CPU (one thread) for ResNet-18 and a BERT
built from a config; the ratio annotated / plain LayerProf is the cost of the annotations alone.
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

from layerprof import LayerProf


def _models():
    import torchvision
    from transformers import BertConfig, BertModel

    resnet = torchvision.models.resnet18(weights=None)
    yield "resnet18 (2x3x64x64)", resnet, (torch.randn(2, 3, 64, 64),)
    bert = BertModel(BertConfig(hidden_size=128, num_hidden_layers=4, num_attention_heads=4, intermediate_size=256))
    yield "bert 4x128 (2x64 tokens)", bert, (torch.randint(0, 1000, (2, 64)),)


def _step(model, inputs) -> None:
    out = model(*inputs)
    out = out if isinstance(out, torch.Tensor) else out[0]
    out.float().sum().backward()


def _median_step(model, inputs, steps: int, mode: str) -> float:
    times = []
    if mode == "none":
        for _ in range(steps):
            start = time.process_time(); _step(model, inputs); times.append(time.process_time() - start)
        return statistics.median(times)
    with LayerProf(model, annotate=(mode == "annotate")) as prof:
        for _ in range(steps):
            start = time.process_time(); _step(model, inputs); times.append(time.process_time() - start)
            prof.step()
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=5)
    options = parser.parse_args()
    torch.set_num_threads(1)
    for name, model, inputs in _models():
        _step(model, inputs)
        best = {mode: min(_median_step(model, inputs, options.steps, mode) for _ in range(options.repeats))
                for mode in ("none", "layerprof", "annotate")}
        print(f"{name}: unprofiled {best['none'] * 1e3:.2f} ms | LayerProf {best['layerprof'] * 1e3:.2f} ms | "
              f"annotate=True {best['annotate'] * 1e3:.2f} ms | annotate / LayerProf "
              f"{best['annotate'] / best['layerprof']:.3f}")


if __name__ == "__main__":
    main()
