"""Where a checkpoint plan's recompute time comes from on CUDA (about 1.5 minutes on an H100): for the modules of
the plans at 50 and 25 % of ResNet-50's and BERT-base's saved bytes (``benchmarks/gpu.py``'s sizes), each
wrapped module's recomputation as measured by ``verify_plan`` (wall time between synchronizes around it in a
plain step), against the plan's price (``less_hooks``: from the events, the host's time beside them and the hooks
measured on the GPU), the profiled forward by CUDA events, the host's time in that profile (``host_forward_ms``),
the forward by the host's wall clock (a profile with the CPU clock in the events' place), and that less the hooks
as the CPU measures them (``hook_ms`` per module call inside, without the events' stamps).

    python benchmarks/gpu_recompute.py [--models resnet50,bert] [--budgets 0.5,0.25]

A host-bound profiled step (each module's events about its host time) wants the hooks taken off; a device-bound
one (events above the host time) hides them. Needs a CUDA device (status 2 without one), or ``--device cpu`` for a
dry run of the script's code on the CPU (the two clocks are then the same).
"""
from __future__ import annotations

import argparse
import contextlib
import re
import sys
import warnings
from pathlib import Path
from typing import Any
from unittest import mock

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from layerprof import LayerProf, schedule, verify_plan  # noqa: E402
from layerprof.collect import clock as clocks  # noqa: E402
from layerprof.collect import tracker as tracker_module  # noqa: E402
from layerprof.collect.hook_cost import hook_cost  # noqa: E402
from layerprof.plan.candidates import candidates  # noqa: E402


def build(name: str, device: str) -> tuple[torch.nn.Module, Any]:
    if name == "resnet50":
        import torchvision

        model = torchvision.models.resnet50(weights=None).to(device)
        x = torch.randn(32 if device == "cuda" else 4, 3, 224, 224, device=device)
        return model, lambda: model(x).sum()
    import transformers

    config = transformers.BertConfig(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
                                     **({} if device == "cuda" else {"num_hidden_layers": 4}))
    model = transformers.BertModel(config).to(device)
    ids = torch.randint(0, config.vocab_size, (8, 128), device=device)
    return model, lambda: model(input_ids=ids).last_hidden_state.float().pow(2).mean()


def profile(model: torch.nn.Module, step: Any, wall: bool) -> Any:
    patch = mock.patch.object(tracker_module, "make_clock", lambda device, sync: clocks.CpuClock())
    with patch if wall else contextlib.nullcontext(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with LayerProf(model, metrics=("memory", "shapes"), schedule=schedule(wait=1, active=5)) as prof:
            for _ in range(6):
                step()
                prof.step()
    return prof


def part(found: dict[str, Any], name: str, read: Any = lambda c: c.recompute_ms) -> float:
    """``read`` of a module's entry in ``found`` (a candidate's recompute time by default); for a run
    ``parent[first:stop]`` of a Sequential's children, theirs summed."""
    if name in found:
        return float(read(found[name]) or 0.0)
    parent, first, stop = re.fullmatch(r"(.*)\[(\d+):(\d+)\]", name).groups()  # type: ignore[union-attr]
    prefix = f"{parent}." if parent else ""
    return sum(float(read(found[f"{prefix}{i}"]) or 0.0) for i in range(int(first), int(stop)))


def host_ms(record: Any) -> float:
    return float(getattr(record, "host_forward_ms", None) or 0.0)  # (None on the CPU clock)


def run(name: str, device: str, budgets: list[float]) -> None:
    model, loss_fn = build(name, device)

    def step() -> None:
        model.zero_grad(set_to_none=True)
        loss_fn().backward()

    for _ in range(3):
        step()
    events, wall = profile(model, step, False), profile(model, step, True)
    cpu_hook_ms = hook_cost(LayerProf, ("shapes",))
    by_wall = {c.name: c for c in candidates(wall.tree, True, None, cpu_hook_ms)}
    bare = {c.name: c for c in candidates(wall.tree, True, None, 0.0)}
    root_e, root_w = events.tree, wall.tree
    plans = [events.checkpoint_plan(budget, allow_side_effects=True, wrap_cost=None) for budget in budgets]
    print(f"{name}: clocks {events.meta['clock']} / {wall.meta['clock']}; root forward {root_e.forward_ms:.2f} ms "
          f"(events; host {host_ms(root_e):.2f}) / {root_w.forward_ms:.2f} (wall); hook_ms "
          f"{cpu_hook_ms * 1e3:.1f} µs a module call (CPU), {plans[0].hook_ms * 1e3:.1f} as the plan took it",
          flush=True)
    for budget, plan in zip(budgets, plans):
        result = verify_plan(plan, model, step, repeats=3)
        totals = [0.0] * 6
        print(f"{name} {budget:.0%}: module | measured | priced | events | host (events' profile) | wall | "
              "wall less CPU hooks (ms)")
        for chosen in plan.chosen:
            measured = result.recompute_ms[chosen.name][1]
            row = [measured, chosen.recompute_ms, part(events.records, chosen.name, lambda r: r.forward_ms_median),
                   part(events.records, chosen.name, host_ms), part(bare, chosen.name), part(by_wall, chosen.name)]
            totals = [t + r for t, r in zip(totals, row)]
            print(f"  {chosen.name} | " + " | ".join(f"{value:.2f}" for value in row), flush=True)
        print("  total | " + " | ".join(f"{value:.2f}" for value in totals), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="resnet50,bert")
    parser.add_argument("--budgets", default="0.5,0.25")
    parser.add_argument("--device", default="cuda")
    options = parser.parse_args()
    if options.device == "cuda" and not torch.cuda.is_available():
        sys.exit("benchmarks/gpu_recompute.py needs a CUDA device (or --device cpu for a dry run)")
    budgets = [float(b) for b in options.budgets.split(",")]
    for name in options.models.split(","):
        run(name, options.device, budgets)


if __name__ == "__main__":
    main()
