"""The checkpoint planner on a zoo of real models, against two peers, one thread.

    python benchmarks/checkpoint_plan.py [--models resnet50,bert] [--repeats 31] [--max-repeats 81] [--scale bench]
                                         [--same-process] [--split PAIRS]

For each model and budget (25 %, 50 %, 75 % of today's saved-for-backward bytes): layerprof's plan, predicted
against measured. Saved bytes: the memory meter's on the wrapped model. Extra step time, predicted: the profiled
forward time (the median over five steps, wall time) less the tail that checkpointing's early stop skips and the
profiler's own hooks on the calls inside (``meta["hook_ms"]`` each), plus the checkpoint wrapper's own cost as
``wrap_cost`` measures it. Measured: the median of paired differences, a step with the plan and a step without run
back to back in alternating order (A B, then B A: a linear drift cancels), in process CPU time so that other work on
a shared machine does not count (``paired.py``). Every timed step gets ``--repeats`` pairs; a plan's step then gets
more, two at a time, until the distribution-free 95 % confidence interval of its median difference (order
statistics) is at most 10 % of the predicted extra time (or 1 ms) either side, or it has ``--max-repeats`` pairs
(those run the plan's step against the plain one alone, without the peers' steps between them). The rule reads the
interval's width, never where the median lies, so it does not bias the figure; the noisy plans (the 75 % plans of
ResNet-50, DenseNet and the MLP, whose paired differences spread over ±30-100 % of themselves) get up to about three
times the pairs. Printed beside the figure: the interval and the pairs it took, the interquartile range of the
differences, and each step's minor page faults (median, plain / with the plan: the allocator's fresh pages are a
cost the planner does not model), their change priced at the process's cost of a fault (``page_fault_us``, timed at
the start of each model's process), and at the end how many plans are within once that is taken off the measure.
*within* is the issue's test, unchanged: the median against the prediction, 25 % or 2 ms; the count of intervals
wholly outside that band is printed too.

Beside the plan in the same run: wrapping every block of the model's natural repeated unit (every transformer
layer, ResNet bottleneck, dense layer), and on the sequential model ``torch.utils.checkpoint.checkpoint_sequential``
with the fewest segments that meet the budget, each paired with its own steps without (``--repeats`` pairs). For
the 75 % plans, each wrapped module's predicted recompute time against its recomputation as timed in backward (CPU
time, median over the pairs). Then the planning time of a synthetic 10,000-module tree.

``--split PAIRS``: after each plan's pairs, that many more with the plan's wrappers timed from inside
(``RecomputeTimer`` on CPU time), and a table of where the extra time went: the recomputations in backward against
the predicted recompute time, and the wrappers' own work (their forward beyond the regions', and the rest of the
extra time, in backward) against the predicted wrapper time, a call and in all, beside the process's calibration.
The recompute so measured holds the recomputation's saved-tensor hooks and the early stop's exception, which the
prediction prices in the wrapper's ``per_call_ms`` (about 0.1 ms a call on a 2-core CPU): a plan whose recompute
reads about that much a call above its prediction, and its wrappers as much below, is priced right.

Each model runs in a process of its own (spawned, one at a time), as a user's training process runs one model:
in one process the later models' steps carry what the earlier ones left (the allocator's free lists, the caches),
which moved the last model's measured extra time by up to a factor of two. ``--same-process`` runs them all in
this process, as before. Each process measures its own ``wrap_cost`` and ``hook_cost``, printed at the end.

``--keep-heap`` (glibc only): each model's process sets glibc's trim threshold after its profiled steps
(``heap_faults.keep_heap``), so that no step, plain or with a plan, takes fresh pages for the heap's top: the page
faults that glibc's trimming causes (ALBERT's 25 % plan's recomputation, 2,500-5,000 a step; ResNet-50's, DenseNet's
and the MLP's plain steps, 6,000-22,000) are out of the figures. A diagnosis of what the allocator adds to a miss;
the default is the process a user runs.
"""
from __future__ import annotations

import argparse
import multiprocessing
import os
import random
import statistics
import sys
import time
import warnings
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any, Callable

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from layerprof import LayerProf  # noqa: E402
from layerprof.plan.apply import RecomputeTimer as WrapperTimer, unwrap, wrap  # noqa: E402
from layerprof.plan.fault_cost import page_fault_us  # noqa: E402
from layerprof.plan.runs import parse_run  # noqa: E402
from tests.checkpoint_zoo import ZOO, zoo_step  # noqa: E402

from benchmarks.heap_faults import keep_heap  # noqa: E402
from benchmarks.paired import band, extend, narrow_enough, pair_order, run_pairs, within  # noqa: E402

BUDGETS = (0.25, 0.5, 0.75)
PROFILED_STEPS = 6  # the forward times predicted are medians over the last five
RECOMPUTE_CHECK = 0.75  # the budget whose plans get a per-module recompute check


def saved_bytes(model: nn.Module, step: Callable[[], Any]) -> int:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with LayerProf(model, metrics=("memory",)) as prof:
            step()
    return int(prof.tree.saved_bytes)


class RecomputeTimer:
    """Times each chosen module's forward while it is recomputed in backward, and in the forward of a plain
    step, by an instance ``forward`` put under the plan's wrapper (CPU time; a recomputation that checkpoint
    stops early, by raising, is timed too)."""

    def __init__(self, model: nn.Module, names: list[str]) -> None:
        self.recompute: dict[str, list[float]] = {name: [] for name in names}
        self.forward: dict[str, list[float]] = {name: [] for name in names}
        self._modules = []  # a module, or each child of a run (named parent[first:stop]), under the entry's name
        for name in names:
            run = parse_run(name)
            parts = [model.get_submodule(name)] if run is None else list(model.get_submodule(run[0]))[run[1]:run[2]]
            self._modules += [(module, name) for module in parts]
        self._step: dict[str, float] = {}

    def _timed(self, name: str, forward: Callable[..., Any]) -> Callable[..., Any]:
        def run(*args: Any, **kwargs: Any) -> Any:
            start = time.process_time()
            try:
                return forward(*args, **kwargs)
            finally:
                key = name + ("/backward" if torch._C._current_graph_task_id() != -1 else "/forward")
                self._step[key] = self._step.get(key, 0.0) + (time.process_time() - start) * 1e3
        return run

    def __enter__(self) -> "RecomputeTimer":
        self._owns = [module.__dict__.get("forward") for module, _ in self._modules]
        for module, name in self._modules:
            module.forward = self._timed(name, module.forward)  # type: ignore[method-assign]
        return self

    def __exit__(self, *exc: Any) -> None:
        for (module, _), own in zip(self._modules, self._owns):
            if own is None:
                del module.forward
            else:
                module.forward = own  # type: ignore[method-assign]

    def record(self, recomputed: bool) -> None:
        """Keep the step's figures: the recomputation of a step with the plan, the forward of one without."""
        for name in self.recompute:
            if recomputed:
                self.recompute[name].append(self._step.get(name + "/backward", 0.0))
            else:
                self.forward[name].append(self._step.get(name + "/forward", 0.0))
        self._step.clear()


def recompute_check(model: nn.Module, step: Callable[[], Any], plan: Any, repeats: int) -> list[dict[str, Any]]:
    """Each chosen module: predicted recompute time, its forward in a plain step and its recomputation in a step
    with the plan (medians over ``repeats`` pairs, CPU time)."""
    names = list(plan.modules)
    with RecomputeTimer(model, names) as timer:
        for repeat in range(repeats + 1):
            step()
            timer.record(recomputed=False)
            with plan.applied(model):
                step()
            timer.record(recomputed=True)
    return [dict(name=c.name, type=c.type, predicted=c.recompute_ms, wrap=c.wrap_ms,
                 forward=statistics.median(timer.forward[c.name][1:]),
                 recompute=statistics.median(timer.recompute[c.name][1:])) for c in plan.chosen]


def split_check(model: nn.Module, step: Callable[[], Any], plan: Any, calls: int, repeats: int
                ) -> dict[str, float]:
    """Where a plan's extra time goes, ``repeats`` pairs (a plain step, a step with the plan, alternating order),
    in process CPU time: the median extra time, and in the steps with the plan the wrappers' own forward work
    (their checkpoint calls less the regions' forward) and the recomputations in backward (the regions' forward
    run again: the early stop's exception and the recomputation's saved-tensor hooks included), medians over the
    steps, summed over the plan's wrappers; the rest of the extra time is the wrappers' work in backward outside
    the recomputations. Beside them the plan's predicted recompute and wrapper time, and ``calls``, its wrappers'
    calls a step."""
    differences, wrapper_forward, recomputed = [], [], []
    for index in range(repeats + 1):
        timer = WrapperTimer(clock=time.process_time)
        order = (False, True) if pair_order(index) else (True, False)
        times = {}
        for with_plan in order:
            start = time.process_time()
            if with_plan:
                with plan.applied(model), timer:
                    step()
            else:
                step()
            times[with_plan] = (time.process_time() - start) * 1e3
        if index:  # the first pair warms up
            differences.append(times[True] - times[False])
            wrapper_forward.append(sum(timer.wrapper_forward_ms.values()))
            recomputed.append(sum(timer.ms.values()))
    extra, forward, recompute = (statistics.median(v) for v in (differences, wrapper_forward, recomputed))
    return dict(extra=extra, wrapper_forward=forward, recompute=recompute, rest=extra - forward - recompute,
                predicted_recompute=sum(c.recompute_ms for c in plan.chosen),
                predicted_wrap=sum(c.wrap_ms for c in plan.chosen),
                cold_wrap=sum(c.cold_wrap_ms for c in plan.chosen), calls=calls)


def wrapper_calls(records: Any, plan: Any) -> int:
    """The checkpoint calls a step of ``plan``'s wrappers: a module's calls, or a run's Sequential's."""
    return sum(int(records[name if parse_run(name) is None else parse_run(name)[0]].calls) for name in plan.modules)


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


def run_model(name: str, scale: str, repeats: int, cap: int, split: int = 0, keep: bool = False,
              warmup: int = 0, profiled: int = PROFILED_STEPS) -> list[dict[str, Any]]:
    entry = ZOO[name]
    fault_us = page_fault_us()
    model, step = zoo_step(name, scale)
    for _ in range(warmup):  # plain steps before the profile (``--warmup``)
        step()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with LayerProf(model, metrics=("memory",)) as prof:
            for _ in range(profiled):  # the memory meter runs in the first step; times from the others
                step()
                prof.step()
    if keep:
        keep_heap()  # after the model's first steps, so that glibc's mmap threshold is where they moved it
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
        timed: dict[str, Callable[[], Any]] = {}

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
                                   predicted_ms=plan.extra_ms, cold_ms=plan.cold_extra_ms,
                                   blocks_saved=every_block_saved, blocks=len(blocks), fault_us=fault_us)
        if entry.sequential:
            row.update(sequential_peer(model, step, plan.budget_bytes, timed))
        times = run_pairs(step, timed, repeats)
        mine = extend(step, planned, times["plan"], narrow_enough(plan.extra_ms), max(cap, repeats))
        row.update(base_ms=mine.base_ms, plan_ms=mine.median, plan_q1=mine.quartiles[0],
                   plan_q3=mine.quartiles[1], plan_ci=mine.ci, pairs=len(mine.differences),
                   faults=mine.median_faults, blocks_ms=times["blocks"].median)
        if "sequential" in times:
            row["sequential_ms"] = times["sequential"].median
        if budget == RECOMPUTE_CHECK and plan.modules:
            row["recompute"] = recompute_check(model, step, plan, max(3, repeats // 3))
        if split and plan.modules:
            row["split"] = split_check(model, step, plan, wrapper_calls(prof.records, plan), split)
        rows.append(row)
        print(format_row(row), flush=True)
    return rows


def sequential_peer(model: nn.Sequential, step: Callable[[], Any], budget: int, timed: dict[str, Any]
                    ) -> dict[str, Any]:
    """checkpoint_sequential with the fewest segments whose measured saved bytes meet the budget."""
    x = torch.randn(256 if model[0].out_features > 64 else 16, model[0].in_features)  # the zoo's batch
    for segments in range(1, len(model) + 1):
        runner = _Sequential(model, segments)

        def run(runner: nn.Module = runner) -> Any:  # as the zoo's step does, so that the pair differs only here
            model.zero_grad(set_to_none=True)
            torch.manual_seed(1)
            runner(x).float().pow(2).mean().backward()
            return [None if p.grad is None else p.grad.clone() for p in model.parameters()]

        saved = saved_bytes(runner, run)
        if saved <= budget:
            timed["sequential"] = run
            return {"sequential_segments": segments, "sequential_saved": saved}
    return {"sequential_segments": None, "sequential_saved": None}


def _mib(value: int | None) -> str:
    return "-" if value is None else f"{value / 2**20:.2f}"


def clearly_outside(row: dict[str, Any]) -> bool:
    """Whether the whole 95 % interval of a plan's measured extra time misses the 25 % (or 2 ms) band around the
    prediction: a miss the noise of the measurement does not explain."""
    predicted, (low, high) = row["predicted_ms"], row["plan_ci"]
    tolerance = band(predicted)
    return high < predicted - tolerance or low > predicted + tolerance


def format_row(row: dict[str, Any]) -> str:
    error = (row["measured"] - row["predicted"]) / row["predicted"] * 100 if row["predicted"] else 0.0
    seq = ("-" if row.get("sequential_segments") is None else
           f"{_mib(row['sequential_saved'])} MiB, +{row['sequential_ms']:.1f} ms ({row['sequential_segments']} seg)")
    return (f"| {row['model']} | {row['budget']:.0%} | {_mib(row['today'])} | {_mib(row['budget_bytes'])} | "
            f"{row['modules']} | {_mib(row['predicted'])} | {_mib(row['measured'])} ({error:+.1f} %) | "
            f"{'yes' if row['measured'] <= row['budget_bytes'] else 'NO'} | {row['predicted_ms']:.1f}{_cold(row)} | "
            f"{row['plan_ms']:.1f} | {row['plan_ci'][0]:.1f} to {row['plan_ci'][1]:.1f} ({row['pairs']}) | "
            f"{row['plan_q1']:.1f} to {row['plan_q3']:.1f} | "
            f"{'yes' if within(row['predicted_ms'], row['plan_ms']) else 'NO'} | "
            f"{row['faults'][0]:.0f} / {row['faults'][1]:.0f} ({fault_ms(row):+.1f} ms) | "
            f"{_mib(row['blocks_saved'])} MiB, +{row['blocks_ms']:.1f} ms ({row['blocks']}) | "
            f"{seq} | {row['base_ms']:.0f} |")


def fault_ms(row: dict[str, Any]) -> float:
    """The plan's change in page faults a step (median, with the plan less without) at the process's cost of a
    fault (``page_fault_us``), ms."""
    return (row["faults"][1] - row["faults"][0]) * row["fault_us"] / 1e3


def _cold(row: dict[str, Any]) -> str:
    """" (cold 7.8)": the plan's extra time with every wrapper call priced cold, where the gaps between wrapped
    calls lowered the prediction."""
    cold = row.get("cold_ms", row["predicted_ms"])
    return f" (cold {cold:.1f})" if f"{cold:.1f}" != f"{row['predicted_ms']:.1f}" else ""


def format_recompute(rows: list[dict[str, Any]]) -> str:
    """The per-module recompute check of the 75 % plans, as a Markdown table."""
    lines = ["| model | module | type | predicted recompute ms | forward ms (plain step) | recomputed ms | "
             "wrapper ms (predicted) |", "|---|---|---|---|---|---|---|"]
    for row in rows:
        for module in row.get("recompute", ()):
            lines.append(f"| {row['model']} | {module['name'] or '(root)'} | {module['type']} | "
                         f"{module['predicted']:.2f} | {module['forward']:.2f} | {module['recompute']:.2f} | "
                         f"{module['wrap']:.2f} |")
    return "\n".join(lines)


def format_split(rows: list[dict[str, Any]]) -> str:
    """``--split``: each plan's extra time, predicted against measured, in its recomputation and its wrappers, with
    the wrappers' cost a call as measured in the plan's steps beside the process's calibration (``wrap_cost``: a
    call, and a saved tensor)."""
    lines = ["| model | budget | wrapper calls | recompute ms, predicted / measured | wrappers ms, predicted (cold) / "
             "measured (forward + backward) | a wrapper call ms, predicted / measured | calibration | extra ms, predicted / "
             "measured |", "|---|---|---|---|---|---|---|---|"]
    for row in rows:
        found = row.get("split")
        if not found:
            continue
        wrappers = found["wrapper_forward"] + found["rest"]
        calls = max(1, found["calls"])
        per_call, per_tensor = row["calibration"][:2]
        lines.append(
            f"| {row['model']} | {row['budget']:.0%} | {found['calls']} | {found['predicted_recompute']:.2f} / "
            f"{found['recompute']:.2f} | {found['predicted_wrap']:.2f} ({found.get('cold_wrap', 0.0):.2f}) / "
            f"{wrappers:.2f} ({found['wrapper_forward']:.2f}"
            f" + {found['rest']:.2f}) | {found['predicted_wrap'] / calls:.3f} / {wrappers / calls:.3f} | "
            f"{per_call:.3f} ms + {per_tensor * 1e3:.1f} us | {found['predicted_recompute'] + found['predicted_wrap']:.1f}"
            f" / {found['extra']:.1f} |")
    return "\n".join(lines)


HEADER = ("| model | budget | today MiB | budget MiB | modules | predicted MiB | measured MiB | meets | predicted "
          "extra ms | measured extra ms | 95 % interval ms (pairs) | noise (IQR) ms | within | page faults a step, "
          "plain / plan (their change priced) | every block | checkpoint_sequential | step ms |\n"
          "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")


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

    class _Root:  # what the plan reads of a root record
        type, name, steps = "Synthetic", "", 1
        saved_bytes = sum(c.freed_bytes for c in found)
        calls, recompute_ms, children = 1, None, ()

    start = time.perf_counter()
    CheckpointPlan(_Root(), found, _Root.saved_bytes // 2, 4096)  # type: ignore[arg-type]
    return time.perf_counter() - start


def live_planning_time(blocks: int = 1_100, width: int = 8) -> tuple[int, float, float]:
    """Modules, and seconds to plan a live profile of ``blocks`` Sequentials of ``width`` Linear(4, 4) layers at
    a 50 % budget (9,901 modules by default), over modules only and with every run of every Sequential (27 a
    Sequential here, 29,700 in all): what a user's ``prof.checkpoint_plan`` pays, the storages' tables included.
    Planned once before the timings (the profiler's hook cost is measured then, once per process)."""
    net = nn.Sequential(*[nn.Sequential(*[nn.Linear(4, 4) for _ in range(width)]) for _ in range(blocks)])
    x = torch.randn(2, 4, requires_grad=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # one step profiled: its times carry the meters' cost (not timed here)
        with LayerProf(net, metrics=("memory", "shapes")) as prof:
            net(x).sum().backward()
    prof.checkpoint_plan(0.5, wrap_cost=None, runs=False)
    timings = []
    for runs in (False, True):
        start = time.perf_counter()
        prof.checkpoint_plan(0.5, wrap_cost=None, runs=runs)
        timings.append(time.perf_counter() - start)
    return sum(1 for _ in net.modules()), timings[0], timings[1]


def _calibrated_run(name: str, scale: str, repeats: int, cap: int, split: int = 0, keep: bool = False,
                    warmup: int = 0, profiled: int = PROFILED_STEPS
                    ) -> tuple[list[dict[str, Any]], tuple[float, float, float]]:
    """One model's rows, and the wrapper's and the hooks' cost as this process measured them (they are cached per
    process, so measured once before the model runs, as its plans will use them)."""
    torch.set_num_threads(1)
    warnings.simplefilter("ignore")
    from layerprof.collect.hook_cost import hook_cost
    from layerprof.plan.wrap_cost import wrap_cost

    cost = wrap_cost()
    calibration = (cost.per_call_ms, cost.per_tensor_ms, hook_cost(LayerProf))
    rows = run_model(name, scale, repeats, cap, split, keep, warmup, profiled)
    for row in rows:
        row["calibration"] = calibration
    return rows, calibration


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default=",".join(ZOO))
    parser.add_argument("--repeats", type=int, default=31, help="pairs of every timed step (at least)")
    parser.add_argument("--max-repeats", type=int, default=81,
                        help="pairs of a plan's step at most, added while its 95 %% interval is wide")
    parser.add_argument("--scale", default="bench", choices=("tiny", "bench"))
    parser.add_argument("--same-process", action="store_true", help="run every model in this process")
    parser.add_argument("--split", type=int, default=0, metavar="PAIRS",
                        help="after each plan's pairs, this many more with the wrappers timed from inside: where "
                             "the extra time goes (recomputation, the wrappers' forward, the rest in backward)")
    parser.add_argument("--keep-heap", action="store_true",
                        help="glibc only: after each model's profiled steps, set the trim threshold (mallopt) so "
                             "that the heap's top is never given back: no step takes fresh pages for it (a "
                             "diagnosis: users' processes run with the default)")
    parser.add_argument("--warmup", type=int, default=0, metavar="STEPS",
                        help="plain steps each model runs before its profile (default 0: the profile's steps are "
                             "the process's first)")
    parser.add_argument("--profiled", type=int, default=PROFILED_STEPS, metavar="STEPS",
                        help=f"steps in the profile the plans are made from (default {PROFILED_STEPS}; the memory "
                             "meter reads the first, the times are medians over the rest)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    warnings.simplefilter("ignore")
    started = time.perf_counter()
    print(HEADER, flush=True)
    rows, calibrations = [], []
    for name in args.models.split(","):
        if args.same_process:
            found, calibration = _calibrated_run(name, args.scale, args.repeats, args.max_repeats, args.split,
                                                 args.keep_heap, args.warmup, args.profiled)
        else:
            with ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn")) as pool:
                found, calibration = pool.submit(_calibrated_run, name, args.scale, args.repeats,
                                                 args.max_repeats, args.split, args.keep_heap, args.warmup,
                                                 args.profiled).result()
        rows += found
        calibrations.append(f"{name} {calibration[0]:.3f} ms + {calibration[1] * 1e3:.1f} us, {calibration[2] * 1e3:.1f} us")
    hits = sum(within(row["predicted_ms"], row["plan_ms"]) for row in rows)
    cold_hits = sum(within(row["cold_ms"], row["plan_ms"]) for row in rows)
    outside = [f"{row['model']} {row['budget']:.0%}" for row in rows if clearly_outside(row)]
    print(f"\nextra time within 25 % of predicted (or 2 ms): {hits} of {len(rows)}; bytes within 5 %: "
          f"{sum(abs(row['measured'] - row['predicted']) <= 0.05 * row['predicted'] for row in rows)} of {len(rows)}")
    print(f"the same with every wrapper call priced cold (as the knapsack chose): {cold_hits} of {len(rows)}")
    print(f"the measured extra time less the plan's change in page faults priced (page_fault_us), within: "
          f"{sum(within(row['predicted_ms'], row['plan_ms'] - fault_ms(row)) for row in rows)} of {len(rows)}")
    print(f"95 % interval wholly outside 25 % (or 2 ms) of predicted: {len(outside)} of {len(rows)}"
          + (f" ({', '.join(outside)})" if outside else ""))
    if args.split:
        print(f"\nwhere the extra time goes, {args.split} pairs a plan (CPU time):\n")
        print(format_split(rows))
    print(f"\nrecompute per module, {RECOMPUTE_CHECK:.0%} plans:\n")
    print(format_recompute(rows))
    print("\nwrap_cost (a call + a saved tensor) and hook_cost (a module call inside a recomputed one), as each "
          "model's process measured them: " + "; ".join(calibrations))
    print(f"\nplanning a 10,000-module tree: {planning_time():.3f} s")
    modules, alone, with_runs = live_planning_time()
    print(f"planning a live profile of {modules:,} modules: {alone:.3f} s over modules, {with_runs:.3f} s with runs")
    print(f"run: {time.perf_counter() - started:.0f} s wall, {time.process_time():.0f} s CPU; load average "
          f"{' '.join(f'{value:.2f}' for value in os.getloadavg())}")


if __name__ == "__main__":
    main()
