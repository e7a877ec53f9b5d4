"""The checkpoint planner on a zoo of real models, against two peers, one thread.

    python benchmarks/checkpoint_plan.py [--models resnet50,bert] [--repeats 5] [--scale bench]

For each model and budget (25 %, 50 %, 75 % of today's saved-for-backward bytes): layerprof's plan, predicted
against measured (saved bytes by the memory meter on the wrapped model; extra step time as the median step with
the plan minus the median without, interleaved, in process CPU time so that other work on a shared machine does
not count; the prediction is the profiled forward time, the median over three steps, in wall time, plus the
checkpoint wrapper's own cost as ``wrap_cost`` measures it), and beside it in the same run: wrapping every block of the
model's natural repeated unit (every transformer layer, ResNet bottleneck, dense layer), and on the sequential
model ``torch.utils.checkpoint.checkpoint_sequential`` with the fewest segments that meet the budget.
Then the planning time of a synthetic 10,000-module tree.
"""
from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
import warnings
from pathlib import Path
from typing import Any, Callable

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from layerprof import LayerProf  # noqa: E402
from layerprof.plan.apply import unwrap, wrap  # noqa: E402
from tests.checkpoint_zoo import ZOO, zoo_step  # noqa: E402

BUDGETS = (0.25, 0.5, 0.75)


def saved_bytes(model: nn.Module, step: Callable[[], Any]) -> int:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with LayerProf(model, metrics=("memory",)) as prof:
            step()
    return int(prof.tree.saved_bytes)


def step_ms(steps: dict[str, Callable[[], Any]], repeats: int) -> dict[str, float]:
    """Median wall time of each step, the steps interleaved so that drift hits all alike."""
    times: dict[str, list[float]] = {key: [] for key in steps}
    for _ in range(repeats):
        for key, step in steps.items():
            start = time.process_time()  # CPU time: other work on a shared machine does not count
            step()
            times[key].append((time.process_time() - start) * 1e3)
    return {key: statistics.median(values) for key, values in times.items()}


def block_names(model: nn.Module, containers: tuple[str, ...]) -> list[str]:
    found = []
    for container in containers:
        prefix = f"{container}." if container else ""
        found += [prefix + name for name, _ in model.get_submodule(container).named_children()]
    return found


class _Sequential(nn.Module):
    """Runs an nn.Sequential under checkpoint_sequential, as a module the memory meter sees."""

    def __init__(self, body: nn.Sequential, segments: int) -> None:
        super().__init__()
        self.body = body
        self.segments = segments

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        from torch.utils.checkpoint import checkpoint_sequential

        return checkpoint_sequential(self.body, self.segments, x, use_reentrant=False)


def run_model(name: str, scale: str, repeats: int) -> list[dict[str, Any]]:
    entry = ZOO[name]
    model, step = zoo_step(name, scale)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with LayerProf(model, metrics=("memory",)) as prof:
            for _ in range(4):  # the memory meter runs in the first step; times come from the other three
                step()
                prof.step()
    today = int(prof.tree.saved_bytes)
    rows = []
    blocks = [model.get_submodule(n) for n in block_names(model, entry.blocks)]
    owns = [wrap(block) for block in blocks]
    every_block_saved = saved_bytes(model, step)
    for block, own in zip(blocks, owns):
        unwrap(block, own)
    for budget in BUDGETS:
        plan = prof.checkpoint_plan(budget, allow_side_effects=entry.allow_side_effects)
        with plan.applied(model):
            measured = saved_bytes(model, step)
        timed = {"base": step}

        def planned(plan: Any = plan) -> Any:
            with plan.applied(model):
                return step()

        def every_block() -> Any:
            owned = [wrap(block) for block in blocks]
            try:
                return step()
            finally:
                for block, own in zip(blocks, owned):
                    unwrap(block, own)

        timed.update(plan=planned, blocks=every_block)
        row: dict[str, Any] = dict(model=name, budget=budget, today=today, budget_bytes=plan.budget_bytes,
                                   feasible=plan.feasible, modules=len(plan.modules),
                                   predicted=plan.saved_bytes_after, measured=measured,
                                   predicted_ms=plan.extra_ms, blocks_saved=every_block_saved, blocks=len(blocks))
        if entry.sequential:
            row.update(sequential_peer(model, step, plan.budget_bytes, timed))
        times = step_ms(timed, repeats)
        row.update(base_ms=times["base"], plan_ms=times["plan"] - times["base"],
                   blocks_ms=times["blocks"] - times["base"])
        if "sequential" in times:
            row["sequential_ms"] = times["sequential"] - times["base"]
        rows.append(row)
        print(format_row(row), flush=True)
    return rows


def sequential_peer(model: nn.Sequential, step: Callable[[], Any], budget: int, timed: dict[str, Any]
                    ) -> dict[str, Any]:
    """checkpoint_sequential with the fewest segments whose measured saved bytes meet the budget."""
    x = torch.randn(256 if model[0].out_features > 64 else 16, model[0].in_features)  # the zoo's batch
    for segments in range(1, len(model) + 1):
        runner = _Sequential(model, segments)

        def run(runner: nn.Module = runner) -> Any:
            model.zero_grad(set_to_none=True)
            runner(x).float().pow(2).mean().backward()

        saved = saved_bytes(runner, run)
        if saved <= budget:
            timed["sequential"] = run
            return {"sequential_segments": segments, "sequential_saved": saved}
    return {"sequential_segments": None, "sequential_saved": None}


def _mib(value: int | None) -> str:
    return "-" if value is None else f"{value / 2**20:.2f}"


def format_row(row: dict[str, Any]) -> str:
    error = (row["measured"] - row["predicted"]) / row["predicted"] * 100 if row["predicted"] else 0.0
    seq = ("-" if row.get("sequential_segments") is None else
           f"{_mib(row['sequential_saved'])} MiB, +{row['sequential_ms']:.1f} ms ({row['sequential_segments']} seg)")
    return (f"| {row['model']} | {row['budget']:.0%} | {_mib(row['today'])} | {_mib(row['budget_bytes'])} | "
            f"{row['modules']} | {_mib(row['predicted'])} | {_mib(row['measured'])} ({error:+.1f} %) | "
            f"{'yes' if row['measured'] <= row['budget_bytes'] else 'NO'} | {row['predicted_ms']:.1f} | "
            f"{row['plan_ms']:.1f} | {_mib(row['blocks_saved'])} MiB, +{row['blocks_ms']:.1f} ms ({row['blocks']}) | "
            f"{seq} | {row['base_ms']:.0f} |")


HEADER = ("| model | budget | today MiB | budget MiB | modules | predicted MiB | measured MiB | meets | predicted "
          "extra ms | measured extra ms | every block | checkpoint_sequential | step ms |\n"
          "|---|---|---|---|---|---|---|---|---|---|---|---|---|")


def planning_time(count: int = 10_000) -> float:
    """Seconds to plan a random 10,000-module tree (pre-order, depth up to ~20) at a 50 % budget."""
    from layerprof.plan.plan import CheckpointPlan
    from layerprof.plan.candidates import Candidate

    rng = random.Random(0)
    parents = [-1]
    depth = [0]
    for i in range(1, count):
        parent = i - 1
        while depth[parent] >= 20 or (parent > 0 and rng.random() < 0.5):
            parent = parents[parent]
        parents.append(parent)
        depth.append(depth[parent] + 1)
    found = [Candidate(str(i), "Linear", parents[i], rng.randint(0, 10**8), rng.randint(0, 10**7),
                       rng.uniform(0.01, 5.0), 1, None) for i in range(count)]

    class _Root:
        type = "Synthetic"
        saved_bytes = sum(c.freed_bytes for c in found)

    start = time.perf_counter()
    CheckpointPlan(_Root(), found, _Root.saved_bytes // 2, 4096)  # type: ignore[arg-type]
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default=",".join(ZOO))
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--scale", default="bench", choices=("tiny", "bench"))
    args = parser.parse_args()
    torch.set_num_threads(1)
    warnings.simplefilter("ignore")
    print(HEADER)
    for name in args.models.split(","):
        run_model(name, args.scale, args.repeats)
    print(f"\nplanning a 10,000-module tree: {planning_time():.3f} s")


if __name__ == "__main__":
    main()
