"""How often ``layerprof compare --fail-if-slower`` cries wolf, and how often it catches a real slowdown.

    python benchmarks/gate.py [--pairs 12] [--steps 3,20] [--limit 10] [--models mlp,resnet18]
                              [--slowdowns 0.1,0.25] [--whole 0]

For each model and number of steps, ``4 x pairs`` profiles are taken one after the other, in rounds (A, B,
A+10 %, A+25 %), so that the load of the machine drifts over all four kinds alike:

- **false alarms**: pairs (A_i, B_i) of the same model profiled twice; every failure is a false alarm;
- **detection**: pairs (A_i, C_i) where C_i is the same model with one module made slower by 10 % or 25 % of
  its own time (a busy wait in its forward, sized from a calibration profile), so the model is slower by that
  fraction of the module's share only.

Each pair is judged by three gates at ``--limit`` %: the old one (change of the *mean* total time, what
``compare`` did before), the new gate on the model's time (median step beyond the noise of both profiles), and
the new gate with ``--per-module`` (which refuses profiles of fewer than 10 steps). The changes are medians over the pairs (min .. max): the model's median step,
and the slowed module's median against the rest of the model (what ``--per-module`` judges). A model's total grows by much less than the module's 10 % or 25 %, so the
total gates are not expected to catch it; the per-module gate is.
"""
from __future__ import annotations

import argparse
import time
from typing import Any

import torch
from torch import nn

from layerprof import LayerProf
from layerprof.profile import Profile
from layerprof.render.gate import MIN_MODULE_STEPS, Gate, model_spread

MODELS = {
    # name: (factory, input shape, the module slowed down)
    "mlp": (lambda: nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(),
                                  nn.Linear(512, 10)), (64, 256), "2"),
    "resnet18": (lambda: __import__("torchvision").models.resnet18(weights=None), (2, 3, 64, 64), "layer3"),
}


def spin(ms: float) -> None:
    end = time.perf_counter() + ms / 1e3
    while time.perf_counter() < end:
        pass


def slowed(module: nn.Module, extra_ms: float) -> Any:
    """Make ``module``'s forward ``extra_ms`` slower (an instance attribute, removed by the returned undo)."""
    original = module.forward

    def forward(*args: Any, **kwargs: Any) -> Any:
        spin(extra_ms)
        return original(*args, **kwargs)

    module.forward = forward
    return lambda: delattr(module, "forward")


def profile(model: nn.Module, x: torch.Tensor, steps: int) -> Profile:
    with LayerProf(model, warmup=1) as prof:
        for step in range(steps + 1):
            model(x).sum().backward()
            model.zero_grad(set_to_none=True)
            if step < steps:
                prof.step()
    return prof.profile


def old_gate(a: Profile, b: Profile, limit: float) -> bool:
    """What ``compare --fail-if-slower`` did before: the change of the mean total time."""
    mean_a = a.tree.forward_ms + (a.tree.backward_ms or 0)
    mean_b = b.tree.forward_ms + (b.tree.backward_ms or 0)
    return 100 * (mean_b - mean_a) / mean_a > limit


def module_total(profile_: Profile, name: str) -> float:
    record = profile_.records[name]
    return record.forward_ms_median + (record.backward_ms_median or 0)


def run(name: str, steps: int, pairs: int, limit: float, slowdowns: list[float],
        whole: float = 0.0) -> list[dict[str, Any]]:
    factory, shape, target = MODELS[name]
    torch.manual_seed(0)
    model = factory()
    x = torch.randn(shape)
    calibration = profile(model, x, 20)
    module_ms = module_total(calibration, target)
    share = 100 * module_ms / model_spread(calibration).median
    model_ms = model_spread(calibration).median
    # kind: (the module slowed, by how many ms)
    kinds = {"same model": (target, 0.0)}
    kinds.update({f"+{100 * s:g} % on one module": (target, s * module_ms) for s in slowdowns})
    if whole:
        kinds[f"+{100 * whole:g} % on the whole model"] = ("", whole * model_ms)
    verdicts: dict[str, dict[str, int]] = {kind: {"old": 0, "total": 0, "per-module": 0} for kind in kinds}
    changes: dict[str, list[float]] = {kind: [] for kind in kinds}
    module_changes: dict[str, list[float]] = {kind: [] for kind in kinds}
    for _ in range(pairs):
        a = profile(model, x, steps)
        for kind, (slowed_name, extra_ms) in kinds.items():
            undo = slowed(dict(model.named_modules())[slowed_name], extra_ms) if extra_ms else None
            try:
                b = profile(model, x, steps)
            finally:
                if undo:
                    undo()
            gate = Gate(a, b, limit)
            verdicts[kind]["old"] += old_gate(a, b, limit)
            verdicts[kind]["total"] += gate.failed()
            verdicts[kind]["per-module"] += gate.failed(per_module=True)
            changes[kind].append(gate.model.change)
            module_changes[kind] += [verdict.change for verdict in gate.modules if verdict.name == target]
    rows = []
    for kind in kinds:
        rows.append({"model": name, "steps": steps, "pair": kind, "pairs": pairs, "share": share,
                     **verdicts[kind], "model change": _range(changes[kind]),
                     "module change": _range(module_changes[kind])})
    return rows


def _range(values: list[float]) -> str:
    ordered = sorted(values)
    if not ordered:
        return "—"
    middle = ordered[len(ordered) // 2]
    return f"{middle:+.1f} % ({ordered[0]:+.1f} .. {ordered[-1]:+.1f})"


def per_module(row: dict[str, Any]) -> str:
    if row["steps"] < MIN_MODULE_STEPS:
        return f"refused (< {MIN_MODULE_STEPS} steps)"
    return f"{row['per-module']}/{row['pairs']}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pairs", type=int, default=12)
    parser.add_argument("--steps", default="3,20")
    parser.add_argument("--limit", type=float, default=10.0)
    parser.add_argument("--models", default="mlp,resnet18")
    parser.add_argument("--slowdowns", default="0.1,0.25", help="fractions of the slowed module's own time")
    parser.add_argument("--whole", type=float, default=0.0, help="also slow the whole model by this fraction")
    options = parser.parse_args()
    torch.set_num_threads(1)
    print(f"gate at --fail-if-slower {options.limit:g}; failures out of {options.pairs} pairs "
          f"(torch {torch.__version__}, 1 thread)\n")
    print("| model (slowed module, its share) | steps | pair | old gate (mean) | new gate | new --per-module "
          "| model's change | slowed module's change against the rest |")
    print("|---|---|---|---|---|---|---|---|")
    for name in options.models.split(","):
        for steps in map(int, options.steps.split(",")):
            slowdowns = [float(s) for s in options.slowdowns.split(",") if s]
            for row in run(name, steps, options.pairs, options.limit, slowdowns, options.whole):
                target = MODELS[name][2]
                print(f"| {name} ({target}, {row['share']:.0f} %) | {steps} | {row['pair']} | "
                      f"{row['old']}/{row['pairs']} | {row['total']}/{row['pairs']} | "
                      f"{per_module(row)} | {row['model change']} | {row['module change']} |", flush=True)


if __name__ == "__main__":
    main()
