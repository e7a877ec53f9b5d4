"""Accuracy of layerprof's per-module times against an independent reference built on torch.profiler.

    python benchmarks/accuracy.py [--steps 5]

Reference: forward time of a module call = the duration of a ``record_function`` range opened and closed by
the reference's own module hooks; backward time of a module = the summed duration of the autograd-engine events
(``autograd::engine::evaluate_function: ...``) whose sequence number falls in the range of autograd sequence
numbers created during that module's forward calls. Both are expressed as a share of the step (root forward +
backward) and compared with layerprof's, for modules above 1 % of the step. Separate runs (never both at once),
median over steps.
"""
from __future__ import annotations

import argparse
import statistics
from collections import defaultdict
from typing import Any, Callable

import torch
from torch import nn
from torch.profiler import ProfilerActivity, profile, record_function

from layerprof import LayerProf

_seq = torch._C._autograd._get_sequence_nr


def reference_step(model: nn.Module, loss_fn: Callable[[], torch.Tensor]) -> dict[str, tuple[float, float]]:
    """{name: (forward_ms, backward_ms)} for one step, from torch.profiler events."""
    ranges: dict[str, list[tuple[int, int]]] = defaultdict(list)
    open_ranges: dict[str, list[Any]] = defaultdict(list)
    handles = []
    for name, module in model.named_modules():
        def pre(m: nn.Module, a: Any, name: str = name) -> None:
            rf = record_function(f"lp_ref::{name}")
            rf.__enter__()
            open_ranges[name].append((rf, _seq()))

        def post(m: nn.Module, a: Any, o: Any, name: str = name) -> None:
            rf, start = open_ranges[name].pop()
            ranges[name].append((start, _seq()))
            rf.__exit__(None, None, None)

        handles += [module.register_forward_pre_hook(pre), module.register_forward_hook(post)]
    try:
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            loss_fn().backward()
    finally:
        for handle in handles:
            handle.remove()
    events = prof.events()
    forward: dict[str, float] = defaultdict(float)
    backward_nodes: list[tuple[int, float]] = []
    for event in events:
        if event.name.startswith("lp_ref::"):
            forward[event.name[len("lp_ref::"):]] += event.cpu_time_total / 1e3
        elif event.name.startswith("autograd::engine::evaluate_function") and event.sequence_nr >= 0:
            backward_nodes.append((event.sequence_nr, event.cpu_time_total / 1e3))
    result = {}
    for name in forward:
        spans = ranges[name]
        backward = sum(ms for seq, ms in backward_nodes if any(lo <= seq < hi for lo, hi in spans))
        result[name] = (forward[name], backward)
    return result


def layerprof_step(model: nn.Module, loss_fn: Callable[[], torch.Tensor]) -> dict[str, tuple[float, float]]:
    with LayerProf(model) as prof:
        loss_fn().backward()
    return {name: (r.forward_ms or 0.0, r.backward_ms or 0.0) for name, r in prof.records.items() if r.calls}


def shares(step: dict[str, tuple[float, float]]) -> dict[str, tuple[float, float]]:
    total = step[""][0] + step[""][1]
    return {name: (f / total, b / total) for name, (f, b) in step.items()}


def compare(name: str, model: nn.Module, loss_fn: Callable[[], torch.Tensor], steps: int) -> None:
    for _ in range(2):
        loss_fn().backward()
    ref_runs, lp_runs = [], []
    for _ in range(steps):
        ref_runs.append(shares(reference_step(model, loss_fn)))
        lp_runs.append(shares(layerprof_step(model, loss_fn)))

    def median_share(runs: list[dict[str, tuple[float, float]]], key: str, index: int) -> float:
        return statistics.median(run[key][index] for run in runs if key in run)

    worst = (0.0, "", "")
    rows = []
    for key in ref_runs[0]:
        for index, phase in ((0, "forward"), (1, "backward")):
            ref = median_share(ref_runs, key, index)
            got = median_share(lp_runs, key, index)
            if max(ref, got) < 0.01 or key == "":
                continue
            diff = got - ref
            rows.append((abs(diff), key or "<root>", phase, ref, got))
            if abs(diff) > worst[0]:
                worst = (abs(diff), key or "<root>", phase)
    rows.sort(reverse=True)
    print(f"{name}: {len(rows)} module-passes above 1 % of the step; largest disagreement "
          f"{worst[0] * 100:.2f} points of the step ({worst[1]}, {worst[2]})")
    for diff, key, phase, ref, got in rows[:5]:
        print(f"    {key:<40} {phase:<8} reference {ref * 100:6.2f} %  layerprof {got * 100:6.2f} %")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=5)
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    import torchvision
    import transformers

    resnet = torchvision.models.resnet18(weights=None)
    x = torch.randn(2, 3, 224, 224)
    compare("resnet18 b2", resnet, lambda: resnet(x).sum(), args.steps)
    config = transformers.BertConfig(hidden_size=128, num_hidden_layers=2, num_attention_heads=2,
                                     intermediate_size=512, vocab_size=1000)
    bert = transformers.BertModel(config).eval()
    ids = torch.randint(0, 1000, (8, 32))
    compare("bert 2x128 s32 b8", bert, lambda: bert(input_ids=ids).last_hidden_state.sum(), args.steps)


if __name__ == "__main__":
    main()
