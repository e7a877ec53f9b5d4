"""Overhead, accuracy and checkpoint plans of layerprof on a CUDA GPU (CUDA events, one synchronize per step).

    python benchmarks/gpu.py [--repeats 20] [--models resnet50,bert,deep] [--plan-repeats 10] [--overhead-only |
        --plans-only]

Models: torchvision resnet50 at batch 32 (224x224), BERT-base (12 layers, hidden 768) at batch 8, sequence 128,
built from its config (no download), and a deep stack of 1,501 small modules (launch-bound: the cost per module).

- Overhead: rounds of a plain step and a step of one ``LayerProf`` alternating hook-free and profiled steps
  (steady state, the reading after the step included: its ``prof.step()``), then in a shuffled order a step inside a
  fresh ``with LayerProf(model)`` (one-shot, set-up, reading and tear-down included; and the same making every
  CUDA event anew, as before the process-wide event pool), inside torch.profiler (CPU and CUDA activity, Python
  stacks) and under the seed tool's full backward hooks; each step ends with ``torch.cuda.synchronize()``; medians
  of wall time over the plain median, and the extra µs per module.
- Accuracy (at ``--accuracy-scale`` times the batch, by default 4 for ResNet-50 and 16 for BERT, so that the step
  is compute-bound: on a launch-bound step the events' elapsed GPU time holds the idle gaps between launches, which
  kernel time does not): layerprof inside a torch.profiler session with CUDA activity on the very same steps; a module's
  reference time is the GPU time of the kernels launched inside its forward (its ``record_function`` range,
  annotate=True) and inside its backward range, as a share of the step, compared with layerprof's shares for
  modules above 1 % of the step.
- Plans: checkpoint plans at 75, 50 and 25 % of the saved bytes from a five-step profile, verified
  (``verify_plan``): saved bytes predicted and measured, ``max_memory_allocated`` of a step before and after; the
  extra step time predicted, and measured as the CPU harness does (``benchmarks/paired.py``: pairs of a step with the
  plan and one without in alternating order, wall time between synchronizes, more pairs until the median's 95 %
  interval is narrow), against the issue's band (25 % or 2 ms).

Needs a CUDA device; exits with a message (status 2) where there is none.
"""
from __future__ import annotations

import argparse
import contextlib
import random
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any, Callable, Iterator

import torch
from torch import nn

from layerprof import LayerProf, schedule
from layerprof.collect import clock as clock_module

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.paired import cuda_timed, extend, narrow_enough, run_pairs, within  # noqa: E402


def resnet50(scale: int = 1) -> tuple[nn.Module, Callable[[], torch.Tensor]]:
    import torchvision

    model = torchvision.models.resnet50(weights=None).cuda()
    x = torch.randn(32 * scale, 3, 224, 224, device="cuda")
    return model, lambda: model(x).sum()


def bert_base(scale: int = 1) -> tuple[nn.Module, Callable[[], torch.Tensor]]:
    import transformers

    config = transformers.BertConfig(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    model = transformers.BertModel(config).cuda()
    ids = torch.randint(0, config.vocab_size, (8 * scale, 128), device="cuda")
    return model, lambda: model(input_ids=ids).last_hidden_state.float().pow(2).mean()


MODELS = {"resnet50": resnet50, "bert": bert_base}
# Batch multiples that make the accuracy check's step compute-bound under both profilers (H100, 2026-11-26: ResNet-50
# at 4 agreed within 0.61 points; BERT at 4 was still launch-bound; 16 not yet run).
ACCURACY_SCALES = {"resnet50": 4, "bert": 16}


def _step(model: nn.Module, loss_fn: Callable[[], torch.Tensor]) -> float:
    model.zero_grad(set_to_none=True)
    torch.cuda.synchronize()
    start = time.perf_counter()
    loss_fn().backward()
    torch.cuda.synchronize()
    return time.perf_counter() - start


class TorchProfiler:
    """torch.profiler around the step, CPU and CUDA activity with Python stacks (module-level attribution)."""

    def __init__(self, model: nn.Module) -> None:
        from torch.profiler import ProfilerActivity, profile

        self.profiler = profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], with_stack=True)

    def __enter__(self) -> TorchProfiler:
        self.profiler.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        torch.cuda.synchronize()
        self.profiler.__exit__(*exc)


class FullBackwardHooks:
    """The seed tool's mechanism: forward pre/post hooks and full backward (pre-)hooks on every module, each
    stamping the wall clock (no synchronize: what such a tool does on a GPU)."""

    def __init__(self, model: nn.Module) -> None:
        self.model = model
        self.handles: list[Any] = []

    def __enter__(self) -> FullBackwardHooks:
        stamps: list[float] = []

        def stamp(*args: Any) -> None:
            stamps.append(time.perf_counter())

        for module in self.model.modules():
            self.handles += [module.register_forward_pre_hook(stamp), module.register_forward_hook(stamp),
                             module.register_full_backward_pre_hook(stamp), module.register_full_backward_hook(stamp)]
        return self

    def __exit__(self, *exc: Any) -> None:
        for handle in self.handles:
            handle.remove()


def deep_stack() -> tuple[nn.Module, Callable[[], torch.Tensor]]:
    """500 x Sequential(Linear(16, 16), ReLU): 1,501 modules, launch-bound: the cost per module."""
    model = nn.Sequential(*[nn.Sequential(nn.Linear(16, 16), nn.ReLU()) for _ in range(500)]).cuda()
    x = torch.randn(4, 16, device="cuda")
    return model, lambda: model(x).sum()


MODELS["deep"] = deep_stack


def _with_new_events(model: nn.Module) -> LayerProf:
    """A one-shot block that makes every CUDA event anew, as before the process-wide pool (the steady profiler's
    clock keeps its own pool's list)."""
    clock_module._POOLS.clear()
    return LayerProf(model)


def overhead(name: str, repeats: int) -> None:
    """Rounds of a plain step, a steady profiled step, and in a shuffled order a one-shot ``with LayerProf``,
    torch.profiler and the seed tool's hooks around a step; median wall time of each over the plain median."""
    model, loss_fn = MODELS[name]()
    twin, twin_loss = MODELS[name]()  # the variants' model: the steady profiler stays on the first
    for _ in range(3):
        _step(model, loss_fn)
        _step(twin, twin_loss)
    variants: dict[str, Callable[[nn.Module], Any]] = {
        "one-shot": LayerProf, "one-shot, new events": _with_new_events, "torch.profiler": TorchProfiler,
        "seed hooks": FullBackwardHooks}
    times: dict[str, list[float]] = {key: [] for key in ("plain", "steady", "twin", *variants)}
    prof = LayerProf(model, schedule=schedule(wait=1, active=1))
    order = list(variants)
    raised: dict[str, str] = {}
    prof.start()
    try:
        for index in range(repeats):
            times["plain"].append(_step(model, loss_fn))
            prof.step()
            took = _step(model, loss_fn)
            start = time.perf_counter()
            prof.step()  # the step's reading (a synchronize, then the events read), as a one-shot block's exit has it
            times["steady"].append(took + time.perf_counter() - start)
            times["twin"].append(_step(twin, twin_loss))
            random.Random(index).shuffle(order)
            for key in order:
                if key in raised:
                    continue
                try:
                    times[key].append(_wrapped_step(twin, twin_loss, variants[key]))
                except RuntimeError as error:  # the seed tool's hooks on an in-place op (ResNet's ReLU)
                    raised[key] = str(error).split(".")[0]
                    times.pop(key)
    finally:
        prof.stop()
    base, twin_base = statistics.median(times["plain"]), statistics.median(times["twin"])
    ratios = {"steady": statistics.median(times["steady"]) / base}
    ratios.update({key: statistics.median(times[key]) / twin_base for key in variants if key not in raised})
    modules = sum(1 for _ in model.modules())
    per_module = {key: (statistics.median(times[key]) - twin_base) * 1e6 / modules
                  for key in variants if key not in raised}
    print(f"{name}: plain {base * 1e3:.2f} ms (twin {twin_base * 1e3:.2f}); "
          + ", ".join(f"{key} {ratio:.3f}x" for key, ratio in ratios.items())
          + f"; one-shot over steady {ratios['one-shot'] / ratios['steady']:.3f}; extra per module (µs): "
          + ", ".join(f"{key} {value:.1f}" for key, value in per_module.items())
          + f"; layerprof one-shot / torch.profiler extra: "
          f"{(ratios['one-shot'] - 1) / max(ratios['torch.profiler'] - 1, 1e-9):.2f}"
          + "".join(f"; {key} raises: {message}" for key, message in raised.items()), flush=True)
    del twin


def _wrapped_step(model: nn.Module, loss_fn: Callable[[], torch.Tensor], wrapper: Callable[[nn.Module], Any]) -> float:
    model.zero_grad(set_to_none=True)
    torch.cuda.synchronize()
    start = time.perf_counter()
    with wrapper(model):
        loss_fn().backward()
        torch.cuda.synchronize()
    return time.perf_counter() - start


@contextlib.contextmanager
def events_price(prof: Any) -> Iterator[None]:
    """Plans made inside price recomputations as layerprof did before 2026-11-27 (session 26): each module's
    forward by the CUDA events, nothing taken off for the hooks (the host's forward times and the hooks' figure
    put aside, and put back after)."""
    hosts = {name: record.__dict__.pop("host_forward_ms", None) for name, record in prof.records.items()}
    meta = prof.profile.meta
    before = meta.get("hook_ms")
    meta["hook_ms"] = 0.0
    try:
        yield
    finally:
        for name, value in hosts.items():
            if value is not None:
                prof.records[name].host_forward_ms = value
        if before is None:
            meta.pop("hook_ms", None)
        else:
            meta["hook_ms"] = before


def plan(name: str, repeats: int, both_prices: bool = False) -> None:
    """Checkpoint plans at 25, 50 and 75 % of the saved bytes, applied and verified: saved bytes predicted and
    measured, max_memory_allocated before and after, extra step time predicted and measured (medians).
    ``both_prices``: each budget's plan made again as before session 26 (``events_price``) and measured too, in
    the same run."""
    import warnings

    from layerprof import verify_plan

    model, loss_fn = MODELS[name]()

    def step() -> None:
        model.zero_grad(set_to_none=True)
        loss_fn().backward()

    for _ in range(3):
        step()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with LayerProf(model, metrics=("memory", "shapes"), schedule=schedule(wait=1, active=5)) as prof:
            for _ in range(6):
                step()
                prof.step()
    prof.checkpoint_plan(0.5, allow_side_effects=True)  # the hooks' figure measured first (meta["hook_ms"])
    made = []
    for budget in (0.75, 0.5, 0.25):
        made.append((budget, "", prof.checkpoint_plan(budget, allow_side_effects=True)))
        if both_prices:
            with events_price(prof):
                made.append((budget, " (events' price)", prof.checkpoint_plan(budget, allow_side_effects=True)))
    for budget, label, checkpoint_plan in made:
        result = verify_plan(checkpoint_plan, model, step, repeats=1)

        def planned(checkpoint_plan: Any = checkpoint_plan) -> None:
            with checkpoint_plan.applied(model):
                step()

        # The extra time as the CPU harness measures it (benchmarks/paired.py), in wall time between synchronizes:
        # pairs in alternating order, then more until the median's 95 % interval is within 10 % of the prediction
        # (or 1 ms) either side, or about three times the pairs (an even count: as many in each order).
        pairs = run_pairs(step, {"plan": planned}, repeats, timed=cuda_timed)["plan"]
        extend(step, planned, pairs, narrow_enough(checkpoint_plan.extra_ms), 3 * repeats + repeats % 2,
               timed=cuda_timed)
        low, high = pairs.ci
        verdict = "within" if within(checkpoint_plan.extra_ms, pairs.median) else "outside"
        peak = result.cuda_peak_bytes or (0, 0)
        drop = (prof.tree.saved_bytes - (checkpoint_plan.saved_peak_bytes or 0)) / 2**20
        print(f"{name} plan {budget:.0%}{label}: {len(checkpoint_plan.modules)} wrapped; saved "
              f"{prof.tree.saved_bytes / 2**20:.1f} -> {checkpoint_plan.saved_bytes_after / 2**20:.1f} MiB predicted, "
              f"{result.measured_saved_bytes / 2**20:.1f} measured; CUDA peak {peak[0] / 2**20:.1f} -> "
              f"{peak[1] / 2**20:.1f} MiB: {(peak[0] - peak[1]) / 2**20:.1f} less, {drop:.1f} predicted (saved bytes "
              f"before less the plan's peak of saved bytes, {checkpoint_plan.saved_peak_at or 'end of forward'}); "
              f"peak with the plan {peak[1] / 2**20:.1f} MiB measured, {(checkpoint_plan.predicted_peak_bytes or 0) / 2**20:.1f} "
              f"predicted ({checkpoint_plan.predicted_peak_phase} {checkpoint_plan.predicted_peak_at}; profiled "
              f"{(checkpoint_plan.profiled_peak_bytes or 0) / 2**20:.1f}); extra {checkpoint_plan.extra_ms:.2f} ms predicted, "
              f"{pairs.median:.2f} measured (95 % interval {low:.2f} .. {high:.2f}, {len(pairs.differences)} pairs; "
              f"step {pairs.base_ms:.2f} ms): {verdict} 25 % or 2 ms", flush=True)
        # Where a miss lies: the recomputations themselves (wall time of each in backward, verify_plan's one step),
        # or the rest of the extra (the wrappers' set-up, packing and unpacking, priced by wrap_cost on the host).
        forwards = sum(predicted for predicted, _ in result.recompute_ms.values())
        rerun = sum(measured for _, measured in result.recompute_ms.values())
        print(f"{name} plan {budget:.0%}{label} split: recomputations {forwards:.2f} ms predicted, {rerun:.2f} "
              "measured; "
              f"the rest {checkpoint_plan.extra_ms - forwards:.2f} ms predicted, {pairs.median - rerun:.2f} measured",
              flush=True)


def accuracy(name: str, steps: int, scale: int) -> None:
    from torch.profiler import ProfilerActivity, profile

    model, loss_fn = MODELS[name](scale)
    for _ in range(3):
        _step(model, loss_fn)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as session:
        with LayerProf(model, annotate=True) as prof:
            for _ in range(steps):
                _step(model, loss_fn)
                prof.step()
    # The ranges are named by qualified name, the root by its type (annotate.py); backward ones with a suffix.
    labels = {qualified or record.type: qualified for qualified, record in prof.records.items()}
    gpu_ms: dict[str, float] = defaultdict(float)
    for event in session.key_averages():
        base, backward = event.key.removesuffix(" (backward)"), event.key.endswith(" (backward)")
        if base in labels:
            key = labels[base] + (" (backward)" if backward else "")
            gpu_ms[key] += getattr(event, "device_time_total", 0.0) / 1e3 / steps
    root = prof.tree
    total_ref = gpu_ms.get(root.name, 0.0) + gpu_ms.get(f"{root.name} (backward)", 0.0)
    print(f"{name}: root {root.total_ms:.2f} ms a step by layerprof, {total_ref:.2f} ms of kernels by torch.profiler")
    # Each step's root time: a one-off stall (one step's pause inside one call) moves the mean above, and the
    # module it falls in, by as much as a step that turned launch-bound would spread over every module.
    totals = prof.profile.meta["step_ms"]
    print(f"{name}: root per step (ms): forward {', '.join(f'{ms:.1f}' for ms in totals['forward'] or [])}; "
          f"backward {', '.join(f'{ms:.1f}' for ms in totals['backward'] or [])}")
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
    parser.add_argument("--models", default="resnet50,bert,deep")
    parser.add_argument("--plan-repeats", type=int, default=10,
                        help="pairs of steps with and without each plan (at least; up to three times as many)")
    parser.add_argument("--accuracy-scale", type=int, default=None,
                        help="batch multiple for the accuracy check, for every model (by default ResNet-50's 4 and "
                             "BERT's 16): a compute-bound step (at batch 32 and 8 the steps are launch-bound, and "
                             "elapsed GPU time is not kernel time; on an H100 BERT at 4 still was: 89 ms elapsed "
                             "against 55 ms of kernels, its shares 9-11 points from torch.profiler's)")
    parser.add_argument("--overhead-only", action="store_true", help="skip the accuracy check and the plans")
    parser.add_argument("--plans-only", action="store_true", help="the checkpoint plans alone")
    parser.add_argument("--both-prices", action="store_true",
                        help="each plan also made and measured as priced before session 26 (by the events alone)")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("benchmarks/gpu.py needs a CUDA device; none is available here (torch "
              f"{torch.__version__}). Run it on a machine with a GPU.", file=sys.stderr)
        sys.exit(2)
    torch.backends.cudnn.benchmark = True
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}")
    for name in args.models.split(","):
        if args.plans_only:
            plan(name, args.plan_repeats, args.both_prices)
            continue
        overhead(name, args.repeats)
        if name != "deep" and not args.overhead_only:
            accuracy(name, args.steps, args.accuracy_scale or ACCURACY_SCALES[name])
            plan(name, args.plan_repeats, args.both_prices)


if __name__ == "__main__":
    main()
