"""Overhead and accuracy of layerprof on a CUDA GPU (CUDA events, one synchronize per step).

    python benchmarks/gpu.py [--repeats 20] [--models resnet50,bert]

Models: torchvision resnet50 at batch 32 (224x224) and BERT-base (12 layers, hidden 768) at batch 8, sequence
128, built from its config (no download). Overhead: median step time, interleaved with plain steps, of one
``LayerProf`` alternating hook-free and profiled steps (steady state) and of a fresh ``with LayerProf(model)`` per
step (one-shot); each step ends with ``torch.cuda.synchronize()``. Accuracy: layerprof inside a torch.profiler
session with CUDA activity on the very same steps; a module's reference time is the GPU time of the kernels
launched inside its forward (its ``record_function`` range, annotate=True) and inside its backward range, as a
share of the step, compared with layerprof's shares for modules above 1 % of the step.

Needs a CUDA device; exits with a message (status 2) where there is none.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections import defaultdict
from typing import Callable

import torch
from torch import nn

from layerprof import LayerProf, schedule


def resnet50() -> tuple[nn.Module, Callable[[], torch.Tensor]]:
    import torchvision

    model = torchvision.models.resnet50(weights=None).cuda()
    x = torch.randn(32, 3, 224, 224, device="cuda")
    return model, lambda: model(x).sum()


def bert_base() -> tuple[nn.Module, Callable[[], torch.Tensor]]:
    import transformers

    config = transformers.BertConfig(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    model = transformers.BertModel(config).cuda()
    ids = torch.randint(0, config.vocab_size, (8, 128), device="cuda")
    return model, lambda: model(input_ids=ids).last_hidden_state.float().pow(2).mean()


MODELS = {"resnet50": resnet50, "bert": bert_base}


def _step(model: nn.Module, loss_fn: Callable[[], torch.Tensor]) -> float:
    model.zero_grad(set_to_none=True)
    torch.cuda.synchronize()
    start = time.perf_counter()
    loss_fn().backward()
    torch.cuda.synchronize()
    return time.perf_counter() - start


def overhead(name: str, repeats: int) -> None:
    model, loss_fn = MODELS[name]()
    for _ in range(3):
        _step(model, loss_fn)
    plain, steady, oneshot = [], [], []
    prof = LayerProf(model, schedule=schedule(wait=1, active=1))
    prof.start()
    try:
        for _ in range(repeats):
            plain.append(_step(model, loss_fn))
            prof.step()
            steady.append(_step(model, loss_fn))
            prof.step()
    finally:
        prof.stop()
    for _ in range(repeats):
        model.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        start = time.perf_counter()
        with LayerProf(model):
            loss_fn().backward()
        torch.cuda.synchronize()
        oneshot.append(time.perf_counter() - start)
    base = statistics.median(plain)
    print(f"{name}: plain {base * 1e3:.1f} ms, steady {statistics.median(steady) / base:.3f}x, "
          f"one-shot {statistics.median(oneshot) / base:.3f}x", flush=True)


def accuracy(name: str, steps: int) -> None:
    from torch.profiler import ProfilerActivity, profile

    model, loss_fn = MODELS[name]()
    for _ in range(3):
        _step(model, loss_fn)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as session:
        with LayerProf(model, annotate=True) as prof:
            for _ in range(steps):
                _step(model, loss_fn)
                prof.step()
    gpu_ms: dict[str, float] = defaultdict(float)
    for event in session.key_averages():
        key = event.key
        if key in prof.records or key.endswith(" (backward)"):
            gpu_ms[key] += getattr(event, "device_time_total", 0.0) / 1e3 / steps
    root = prof.tree
    total_ref = gpu_ms.get(root.name, 0.0) + gpu_ms.get(f"{root.name} (backward)", 0.0)
    worst = {"forward": (0.0, ""), "backward": (0.0, "")}
    for module_name, record in prof.records.items():
        for passname, field, key in (("forward", "forward_ms", module_name), ("backward", "backward_ms",
                                                                                f"{module_name} (backward)")):
            ours = getattr(record, field)
            if ours is None or not total_ref or not root.total_ms:
                continue
            share, ref_share = 100 * ours / root.total_ms, 100 * gpu_ms.get(key, 0.0) / total_ref
            if max(share, ref_share) >= 1.0 and abs(share - ref_share) > worst[passname][0]:
                worst[passname] = (abs(share - ref_share), module_name or "(model)")
    print(f"{name}: largest disagreement forward {worst['forward'][0]:.2f} points ({worst['forward'][1]}), "
          f"backward {worst['backward'][0]:.2f} points ({worst['backward'][1]})", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--models", default="resnet50,bert")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("benchmarks/gpu.py needs a CUDA device; none is available here (torch "
              f"{torch.__version__}). Run it on a machine with a GPU.", file=sys.stderr)
        sys.exit(2)
    torch.backends.cudnn.benchmark = True
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}")
    for name in args.models.split(","):
        overhead(name, args.repeats)
        accuracy(name, args.steps)


if __name__ == "__main__":
    main()
