"""Accuracy of layerprof's per-module times against an independent reference built on torch.profiler.

    python benchmarks/accuracy.py [--steps 5] [--models resnet18,bert,densenet121,t5]

Both measure **the very same steps**: layerprof runs inside the reference's profiling session, its hooks inside
the reference's (registered after them, so its pre-hooks run last and its post-hooks first), and the grads are
zeroed with ``set_to_none=True`` before each step as a training loop does; step-to-step noise drops out.

Reference: forward time of a module call = the duration of a ``record_function`` range opened and closed by
the reference's own module hooks; backward time of a module = the summed duration of the autograd-engine events
(``autograd::engine::evaluate_function: ...``) whose sequence number falls in the range of autograd sequence
numbers created during that module's forward calls (outermost calls only, as layerprof counts recursion). Both
are expressed as a share of the step (root forward + backward, each tool's own) and compared for modules above
1 % of the step; the figure per model is the largest disagreement in points of the step, forward and backward,
over the median share of ``--steps`` steps.
"""
from __future__ import annotations

import argparse
import statistics
from bisect import bisect_left
from collections import defaultdict
from typing import Any, Callable

import torch
from torch import nn
from torch.profiler import ProfilerActivity, profile, record_function

from layerprof import LayerProf

_seq = torch._C._autograd._get_sequence_nr


class Reference:
    """torch.profiler-based module times: module hooks open ``record_function`` ranges and note sequence numbers."""

    def __init__(self, model: nn.Module) -> None:
        self.model = model
        self.ranges: dict[str, list[tuple[int, int]]] = defaultdict(list)
        self.open: dict[str, list[Any]] = defaultdict(list)
        self.handles: list[Any] = []

    def __enter__(self) -> Reference:
        for name, module in self.model.named_modules():
            def pre(m: nn.Module, a: Any, name: str = name) -> None:
                rf = record_function(f"lp_ref::{name}")
                rf.__enter__()
                self.open[name].append((rf, _seq()))

            def post(m: nn.Module, a: Any, o: Any, name: str = name) -> None:
                rf, start = self.open[name].pop()
                if not self.open[name]:  # outermost call of this module: the range covers the nested ones
                    self.ranges[name].append((start, _seq()))
                rf.__exit__(None, None, None)

            self.handles += [module.register_forward_pre_hook(pre), module.register_forward_hook(post)]
        return self

    def __exit__(self, *exc: Any) -> None:
        for handle in self.handles:
            handle.remove()

    def times(self, prof: Any) -> dict[str, tuple[float, float]]:
        """{name: (forward_ms, backward_ms)} from the profiler's events."""
        forward: dict[str, float] = defaultdict(float)
        nodes: list[tuple[int, float]] = []
        for event in prof.events():
            if event.name.startswith("lp_ref::"):
                name = event.name[len("lp_ref::"):]
                # Nested events of one module (recursion) are inside the outermost one.
                if not any(parent.name == event.name for parent in _ancestors(event)):
                    forward[name] += event.cpu_time_total / 1e3
            elif event.name.startswith("autograd::engine::evaluate_function") and event.sequence_nr >= 0:
                nodes.append((event.sequence_nr, event.cpu_time_total / 1e3))
        nodes.sort()
        numbers = [seq for seq, _ in nodes]
        prefix = [0.0]
        for _, ms in nodes:
            prefix.append(prefix[-1] + ms)
        result = {}
        for name, ms in forward.items():
            backward = 0.0
            for lo, hi in self.ranges[name]:
                backward += prefix[bisect_left(numbers, hi)] - prefix[bisect_left(numbers, lo)]
            result[name] = (ms, backward)
        return result


def _ancestors(event: Any) -> Any:
    parent = event.cpu_parent
    while parent is not None:
        yield parent
        parent = parent.cpu_parent


def same_step(model: nn.Module, loss_fn: Callable[[], torch.Tensor]) -> tuple[dict, dict]:
    """One training step measured by the reference and by layerprof at once."""
    model.zero_grad(set_to_none=True)
    with Reference(model) as reference:
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            with LayerProf(model, metrics=()) as lp:
                loss_fn().backward()
    ours = {name: (r.forward_ms or 0.0, r.backward_ms or 0.0) for name, r in lp.records.items() if r.calls}
    return reference.times(prof), ours


def shares(step: dict[str, tuple[float, float]]) -> dict[str, tuple[float, float]]:
    total = step[""][0] + step[""][1]
    return {name: (f / total, b / total) for name, (f, b) in step.items()}


def compare(name: str, model: nn.Module, loss_fn: Callable[[], torch.Tensor], steps: int) -> None:
    for _ in range(2):
        model.zero_grad(set_to_none=True)
        loss_fn().backward()
    ref_runs, lp_runs = [], []
    for _ in range(steps):
        reference, ours = same_step(model, loss_fn)
        ref_runs.append(shares(reference))
        lp_runs.append(shares(ours))

    def median_share(runs: list[dict[str, tuple[float, float]]], key: str, index: int) -> float:
        return statistics.median(run[key][index] for run in runs if key in run)

    worst = {"forward": (0.0, ""), "backward": (0.0, "")}
    rows = []
    for key in ref_runs[0]:
        for index, phase in ((0, "forward"), (1, "backward")):
            ref = median_share(ref_runs, key, index)
            got = median_share(lp_runs, key, index)
            if max(ref, got) < 0.01 or key == "":
                continue
            diff = got - ref
            rows.append((abs(diff), key or "<root>", phase, ref, got))
            if abs(diff) > worst[phase][0]:
                worst[phase] = (abs(diff), key or "<root>")
    rows.sort(reverse=True)
    print(f"{name}: {len(rows)} module-passes above 1 % of the step; largest disagreement "
          f"forward {worst['forward'][0] * 100:.2f} points ({worst['forward'][1]}), "
          f"backward {worst['backward'][0] * 100:.2f} points ({worst['backward'][1]})", flush=True)
    for diff, key, phase, ref, got in rows[:5]:
        print(f"    {key:<40} {phase:<8} reference {ref * 100:6.2f} %  layerprof {got * 100:6.2f} %")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--models", default="resnet18,bert,densenet121,t5")
    args = parser.parse_args()
    chosen = args.models.split(",")
    torch.set_num_threads(1)
    torch.manual_seed(0)
    import torchvision
    import transformers

    if "resnet18" in chosen:
        resnet = torchvision.models.resnet18(weights=None)
        x = torch.randn(2, 3, 224, 224)
        compare("resnet18 b2", resnet, lambda: resnet(x).sum(), args.steps)
    if "bert" in chosen:
        config = transformers.BertConfig(hidden_size=128, num_hidden_layers=2, num_attention_heads=2,
                                         intermediate_size=512, vocab_size=1000)
        bert = transformers.BertModel(config).eval()
        ids = torch.randint(0, 1000, (8, 32))
        compare("bert 2x128 s32 b8", bert, lambda: bert(input_ids=ids).last_hidden_state.sum(), args.steps)
    if "densenet121" in chosen:
        densenet = torchvision.models.densenet121(weights=None)
        image = torch.randn(2, 3, 64, 64)
        compare("densenet121 b2 64x64", densenet, lambda: densenet(image).sum(), args.steps)
    if "t5" in chosen:
        t5 = transformers.T5ForConditionalGeneration(transformers.T5Config(decoder_start_token_id=0)).eval()  # t5-small shape
        tokens = torch.randint(0, 32000, (2, 32))
        compare("t5-small b2 s32", t5, lambda: t5(input_ids=tokens, labels=tokens).loss, args.steps)


if __name__ == "__main__":
    main()
