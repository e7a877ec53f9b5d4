"""Small random nets for the brute-force check of planning against a peak budget (``test_peak_budget.py``, and
``benchmarks/checkpoint_peak.py --optimality``): every admissible set of a plan's options with its predicted step
peak, priced by costs that do not depend on the machine (seeded; a module costs what its leaves cost, a run what its
children cost), on a byte grid that rounds nothing (its step divides every option's bytes).
"""
from __future__ import annotations

import math
import random
import warnings
from dataclasses import dataclass, replace
from typing import Any

import torch
from torch import nn

from layerprof import LayerProf
from layerprof.metrics.checkpoint_bytes import STORAGES_ATTRIBUTE
from layerprof.plan.candidates import candidates, descendant_calls
from layerprof.plan.plan import CheckpointPlan
from layerprof.plan.runs import run_options
from layerprof.plan.solver import best_reachable
from layerprof.record.records import preorder

SHARES = (0.95, 0.9, 0.85, 0.8, 0.75, 0.7, 0.6)  # peak budgets, of the profiled step's peak


def random_net(rng: random.Random) -> tuple[nn.Module, torch.Tensor]:
    """A stack of 2-4 blocks (Linear-activation-Linear, a nested one, or a bare activation) between two Linears,
    on a batch large enough that activations, not parameter gradients, make most of the step's peak."""
    width = rng.choice([8, 16, 32])
    layers: list[nn.Module] = [nn.Linear(8, width)]
    for _ in range(rng.randint(2, 4)):
        inner, kind = rng.choice([8, 32, 64, 128]), rng.random()
        if kind < 0.4:
            activation = rng.choice([nn.Tanh, nn.GELU, nn.Sigmoid])()
            layers.append(nn.Sequential(nn.Linear(width, inner), activation, nn.Linear(inner, width)))
        elif kind < 0.7:
            layers.append(nn.Sequential(nn.Sequential(nn.Linear(width, inner), nn.Tanh()), nn.Linear(inner, inner),
                                        nn.GELU(), nn.Linear(inner, width)))
        else:
            layers.append(rng.choice([nn.Tanh, nn.GELU])())
    layers.append(nn.Linear(width, 1))
    return nn.Sequential(*layers), torch.randn(rng.choice([256, 1024, 2048]), 8)


@dataclass
class Case:
    """One net's profile, a plan maker with seeded costs, and every admissible set of its options."""

    profile: Any
    costs: dict[str, float]
    resolution: int
    sets: list[tuple[int, ...]]
    base: CheckpointPlan  # planned for the profiled peak (nothing to wrap): its options and their numbers

    def plan(self, peak_budget: int) -> CheckpointPlan:
        return seeded_plan(self.profile, self.costs, self.resolution, peak_budget)

    def cost(self, chosen: tuple[int, ...]) -> float:
        return sum(self.base._option(i).cost_ms for i in chosen)

    def peak(self, chosen: tuple[int, ...]) -> int:
        return self.base._peak_of(chosen).peak_bytes

    def freed(self, chosen: tuple[int, ...]) -> int:
        options = self.base._options
        count = len(self.base._weights)
        return sum(self.base._weights[i] if i < count else options[i - count].weight for i in chosen)


def seeded_plan(profile: Any, costs: dict[str, float], resolution: int, peak_budget: int) -> CheckpointPlan:
    """``profile.checkpoint_plan(peak=peak_budget)`` with each module's recompute time from ``costs`` (no wrapper)."""
    root = profile.tree
    found = [replace(c, recompute_ms=costs[c.name]) for c in candidates(root)]
    records = preorder(root)
    below = descendant_calls(records, [c.parent for c in found])
    runs = [replace(run, recompute_ms=sum(costs[name] for name in run.children))
            for run in run_options(records, found, below, root.__dict__[STORAGES_ATTRIBUTE], None, 0.0)]
    return CheckpointPlan(root, found, None, resolution, None, 0.0, runs, peak_budget)


def admissible(plan: CheckpointPlan) -> list[tuple[int, ...]]:
    """Every admissible set of the plan's options that free bytes (as the planner numbers them: nodes in
    pre-order, then runs): no two overlapping."""
    count, ends = len(plan._weights), plan._ends
    starting: list[list[tuple[int, int]]] = [[(i, ends[i])] if plan._weights[i] > 0 else [] for i in range(count)]
    for k, run in enumerate(plan._options):
        if run.weight > 0:
            starting[run.start].append((count + k, run.jump))
    found: list[tuple[int, ...]] = []

    def walk(i: int, chosen: tuple[int, ...]) -> None:
        if i >= count:
            found.append(chosen)
            return
        walk(i + 1, chosen)
        for number, jump in starting[i]:
            walk(jump, (*chosen, number))

    walk(0, ())
    return found


def make_case(seed: int) -> Case:
    rng = random.Random(seed)
    torch.manual_seed(seed)
    model, x = random_net(rng)

    def step() -> None:
        model.zero_grad(set_to_none=True)
        torch.sigmoid(model(x)).sum().backward()

    step()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # one step under the live-bytes reader
        with LayerProf(model, metrics=("live_memory",)) as prof:
            step()
    profile = prof.profile
    costs: dict[str, float] = {}
    for record in reversed(preorder(profile.tree)):  # children first: a module costs what its leaves cost
        own = rng.uniform(0.1, 2.0) if not record.children else 0.0
        costs[record.name] = own + sum(costs[child.name] for child in record.children)
    first = seeded_plan(profile, costs, 4096, 2**62)
    weights = [w for w in first._weights if w > 0] + [run.weight for run in first._options if run.weight > 0]
    top, _ = best_reachable(first._weights, first._ends, first._options)
    step_bytes = math.gcd(*weights) if weights else 1
    resolution = max(16, top // step_bytes)  # the grid's step is then ``step_bytes``: it rounds no weight
    base = seeded_plan(profile, costs, resolution, 2**62)
    return Case(profile, costs, resolution, admissible(base), base)
