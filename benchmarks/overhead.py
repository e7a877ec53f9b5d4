"""Overhead of LayerProf and its peers: median profiled step / median plain step, interleaved, one thread.

    python benchmarks/overhead.py [--repeats 30] [--models resnet18,bert,deep] [--variants ...] [--clock cpu|wall]

Models: torchvision resnet18 at batch 2 (224x224), a 2-layer BERT (hidden 128, sequence 32, batch 8) from a config,
and 500 x Sequential(Linear(16, 16), ReLU) (1,501 modules) for the cost per module per step. Measured side by side
in one run, each round interleaving a plain step with every variant (the twin's variants in the orders of a
balanced design: over a cycle of rounds each comes first, and right after each other one, equally often, because a
step carries over what the one before it left in the caches and the allocator):

- layerprof steady: one LayerProf whose schedule alternates hook-free and profiled steps (what a loop pays);
- layerprof one-shot: a fresh ``with LayerProf(model)`` around the step, set-up and tear-down included (the
  design card's usage); "one-shot + read" also reads every record's ``call_times`` after the block (made when
  first read, so the one-shot figure alone would hide that work);
- the peers, each around one step the way their users run them: torch.profiler (CPU activity, with_stack=True),
  DeepSpeed's flops profiler (start/stop/end_profile; skipped when deepspeed is not installed), and the seed
  tool's mechanism (forward hooks plus register_full_backward_(pre_)hook per module).

After every step, outside the timed region, the young garbage-collector generations are collected, so that
what one variant leaves for the collector (torch.profiler leaves reference cycles) is not paid by the next
variant's step; a variant's collections during its own step still count.

Steps are timed with this process's CPU time by default (``--clock cpu``, ``time.process_time``): on a shared
machine other work steals the CPU in bursts, which moves wall-clock ratios by tens of percent, while the CPU a
step takes on one thread stays put; ``--clock wall`` times with ``time.perf_counter``.
"""
from __future__ import annotations

import argparse
import gc
import os
import platform
import random
import statistics
import time
from typing import Any, Callable

import torch
from torch import nn

import layerprof
from layerprof import LayerProf


class FullBackwardHookTimer:
    """The existing approach, for comparison: module forward hooks plus register_full_backward_(pre_)hook."""

    def __init__(self, model: nn.Module) -> None:
        self.model = model
        self.times: dict[str, list[float]] = {}
        self.handles: list[Any] = []

    def __enter__(self) -> FullBackwardHookTimer:
        for name, module in self.model.named_modules():
            starts: list[float] = []

            def pre(m: nn.Module, a: Any, starts: list[float] = starts) -> None:
                starts.append(time.perf_counter())

            def post(m: nn.Module, a: Any, o: Any, starts: list[float] = starts, name: str = name) -> None:
                self.times.setdefault(name, []).append(time.perf_counter() - starts.pop())

            def bpre(m: nn.Module, g: Any, starts: list[float] = starts) -> None:
                starts.append(time.perf_counter())

            def bpost(m: nn.Module, gi: Any, go: Any, starts: list[float] = starts, name: str = name) -> None:
                if starts:
                    self.times.setdefault(name + ".bwd", []).append(time.perf_counter() - starts.pop())

            self.handles += [
                module.register_forward_pre_hook(pre),
                module.register_forward_hook(post),
                module.register_full_backward_pre_hook(bpre),
                module.register_full_backward_hook(bpost),
            ]
        return self

    def __exit__(self, *exc: Any) -> None:
        for handle in self.handles:
            handle.remove()


class OneShotRead:
    """A one-shot ``with LayerProf(model)`` whose profile is then read once: every record's ``call_times``, which a
    record makes from the collected tuples when first read (the work a one-shot block no longer does)."""

    def __init__(self, model: nn.Module) -> None:
        self.prof = LayerProf(model)

    def __enter__(self) -> OneShotRead:
        self.prof.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.prof.__exit__(*exc)
        for record in self.prof.profile.records.values():
            record.call_times


def resnet18() -> tuple[nn.Module, Callable[[], torch.Tensor]]:
    import torchvision

    model = torchvision.models.resnet18(weights=None)
    x = torch.randn(2, 3, 224, 224)
    return model, lambda: model(x).sum()


def bert() -> tuple[nn.Module, Callable[[], torch.Tensor]]:
    import transformers

    config = transformers.BertConfig(hidden_size=128, num_hidden_layers=2, num_attention_heads=2,
                                     intermediate_size=512, vocab_size=1000, hidden_dropout_prob=0.0,
                                     attention_probs_dropout_prob=0.0)
    model = transformers.BertModel(config)
    ids = torch.randint(0, 1000, (8, 32))
    return model, lambda: model(input_ids=ids).last_hidden_state.sum()


def deep_stack(depth: int = 500) -> tuple[nn.Module, Callable[[], torch.Tensor]]:
    model = nn.Sequential(*[nn.Sequential(nn.Linear(16, 16), nn.ReLU()) for _ in range(depth)])
    x = torch.randn(4, 16)
    return model, lambda: model(x).sum()


class TorchProfiler:
    """torch.profiler around the step, CPU activity and Python stacks (what gives module-level attribution)."""

    def __init__(self, model: nn.Module) -> None:
        self.profiler = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], with_stack=True)

    def __enter__(self) -> TorchProfiler:
        self.profiler.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.profiler.__exit__(*exc)


class DeepSpeedFlops:
    """DeepSpeed's flops profiler around the step: start_profile, the step, stop_profile, end_profile."""

    def __init__(self, model: nn.Module) -> None:
        from deepspeed.profiling.flops_profiler import FlopsProfiler

        self.profiler = FlopsProfiler(model)

    def __enter__(self) -> DeepSpeedFlops:
        self.profiler.start_profile()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.profiler.stop_profile()
        self.profiler.get_total_flops()
        self.profiler.end_profile()


def _deepspeed_available() -> bool:
    try:
        import deepspeed.profiling.flops_profiler  # noqa: F401
    except Exception as error:  # noqa: BLE001 - an optional peer: any import failure means "not measured"
        print(f"DeepSpeed's flops profiler is not measured: {type(error).__name__}: {str(error)[:80]}")
        return False
    return True


_clock: Callable[[], float] = time.process_time


def balanced_orders(keys: list[str], seed: int = 0) -> list[list[str]]:
    """Orders of ``keys`` in which each key comes first equally often and follows every other key equally often
    (a Williams design: the rows of a Latin square whose first row runs 0, 1, n-1, 2, n-2, ...; for an odd count
    with their mirror images too): n orders for an even count of keys, 2n for an odd one. Which key is which symbol
    is a seeded shuffle. Rounds cycle through them: balanced over a whole number of cycles."""
    count = len(keys)
    if count < 2:
        return [list(keys)]
    first, low, high = [0], 1, count - 1
    while len(first) < count:
        first.append(low)
        low += 1
        if len(first) < count:
            first.append(high)
            high -= 1
    rows = [[(symbol + shift) % count for symbol in first] for shift in range(count)]
    if count % 2:
        rows += [row[::-1] for row in rows]
    names = list(keys)
    random.Random(seed).shuffle(names)
    return [[names[symbol] for symbol in row] for row in rows]


def step_time(model: nn.Module, loss_fn: Callable[[], torch.Tensor], wrapper: Callable[[nn.Module], Any] | None) -> float:
    model.zero_grad(set_to_none=True)
    start = _clock()
    if wrapper is None:
        loss_fn().backward()
    else:
        with wrapper(model):
            loss_fn().backward()
    return _clock() - start


def timed(loss_fn: Callable[[], torch.Tensor], model: nn.Module) -> float:
    model.zero_grad(set_to_none=True)
    start = _clock()
    loss_fn().backward()
    return _clock() - start


def measure(name: str, factory: Callable[[], tuple[nn.Module, Callable[[], torch.Tensor]]], repeats: int,
            wrappers: dict[str, Callable[[nn.Module], Any] | None], metrics: tuple[str, ...] | None = None,
            swap: bool = False) -> dict[str, float]:
    """Interleaved rounds: plain step, steady-state profiled step, then on the twin a plain step and one step under
    each other variant, in the round's order of a balanced design (each ratio is to the plain step of the model it
    ran on).

    Steady state: one LayerProf whose schedule alternates hook-free and profiled steps (wait=1, active=1), so the
    plain and the profiled step of a round run back to back; hooks go on and off in prof.step(), outside the
    timed region, which is the per-step cost a training loop pays. One-shot: a new ``with LayerProf`` per step,
    setup and teardown included.
    """
    model, loss_fn = factory()
    torch.manual_seed(0)
    twin, twin_loss = factory()
    twin.load_state_dict(model.state_dict())
    if swap:  # the copy made second takes the steady profiler, the first the other variants (``--swap``)
        (model, loss_fn), (twin, twin_loss) = (twin, twin_loss), (model, loss_fn)
    wrappers = dict(wrappers)
    raised: list[str] = []
    for key, wrapper in list(wrappers.items()):
        try:
            for _ in range(3):
                step_time(twin, twin_loss, wrapper)
        except RuntimeError as error:
            print(f"{name}: {key} raises {str(error)[:90]}...", flush=True)
            del wrappers[key]
            raised.append(key)
    # The peers run on the twin, so the twin's own plain step is their baseline ("plain" in wrappers): two copies
    # of a model can differ by a few percent in speed (where their tensors landed in memory).
    samples: dict[str, list[float]] = {
        key: [] for key in ["plain", "layerprof_steady", "twin_plain", *(k for k in wrappers if k != "plain")]
    }
    # A profiled model cannot be profiled twice at once: the other variants run on an identical twin.
    steady = LayerProf(model, schedule=layerprof.schedule(wait=1, active=1), metrics=metrics)
    steady.start()
    try:
        orders = balanced_orders(list(wrappers))
        for round_ in range(repeats):
            # The model's pair, in turns plain step first and steady step first: the first of the two runs after
            # the twin's last step of the round before, on the other copy's tensors, and reads slower (BERT's plain
            # step, always first until session 18, read 5-7 % above the twin's plain step, whichever copy held the
            # steady profiler: ``--swap``), which read the steady ratio low by as much.
            if round_ % 2 == 0:
                samples["plain"].append(timed(loss_fn, model))  # a wait step: no hook on the model
                steady.step()
                gc.collect(1)
                samples["layerprof_steady"].append(timed(loss_fn, model))
                steady.step()
                gc.collect(1)
            else:
                steady.step()  # (the wait step's end, untimed: the profiled step comes first)
                samples["layerprof_steady"].append(timed(loss_fn, model))
                steady.step()
                gc.collect(1)
                samples["plain"].append(timed(loss_fn, model))
                gc.collect(1)
            # The twin's variants in an order of a balanced design (``balanced_orders``): each follows each other
            # one equally often, because a step carries over what the one before it left (the one-shot block's step
            # right after torch.profiler's ran 14.2 ms on BERT, after a plain step 13.1), and a seeded shuffle had
            # placed them unevenly (with seven steps a round, the one-shot block after a peer's step in 14 of 30
            # rounds and the twin's plain step in 5).
            for key in orders[round_ % len(orders)]:
                samples["twin_plain" if key == "plain" else key].append(step_time(twin, twin_loss, wrappers[key]))
                # What a variant left for the collector is collected here, untimed: else the first step after it
                # to allocate enough pays (torch.profiler's garbage cost the next one-shot step 1.4 ms on BERT).
                gc.collect(1)
    finally:
        steady.stop()
    medians = {key: statistics.median(values) for key, values in samples.items()}
    modules = len(list(model.modules()))
    result = {"modules": modules, "plain_ms": medians["plain"] * 1e3, "twin_plain_ms": medians["twin_plain"] * 1e3}
    for key in samples:
        if key not in ("plain", "twin_plain"):
            base = medians["plain" if key == "layerprof_steady" else "twin_plain"]
            result[f"{key}_ratio"] = medians[key] / base
            result[f"{key}_us_per_module"] = (medians[key] - base) / modules * 1e6
    for key in raised:
        result[f"{key}_ratio"] = float("nan")  # raised on this model
    print(name, {k: round(v, 3) for k, v in result.items()}, flush=True)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--metrics", default=None,
                        help="comma-separated metrics for the steady-state profiler, e.g. flops (default: the defaults)")
    parser.add_argument("--models", default="resnet18,bert,deep", help="comma-separated subset of resnet18,bert,deep")
    parser.add_argument("--variants", default=None,
                        help="comma-separated subset of the twin's variants to run (default: all; the twin's plain "
                             "step always runs), e.g. layerprof_oneshot: the one-shot step without the peers' steps "
                             "around it")
    parser.add_argument("--swap", action="store_true",
                        help="give the steady profiler the copy made second and the other variants the first: two "
                             "copies of a model can differ by a few percent in speed, which the two ratios then "
                             "divide out differently")
    parser.add_argument("--clock", choices=("cpu", "wall"), default="cpu",
                        help="time steps with this process's CPU time (default) or the wall clock")
    args = parser.parse_args()
    global _clock
    _clock = time.process_time if args.clock == "cpu" else time.perf_counter
    metrics = None if args.metrics is None else tuple(m for m in args.metrics.split(",") if m)
    chosen = set(args.models.split(","))
    torch.set_num_threads(1)
    torch.manual_seed(0)
    wrappers: dict[str, Callable[[nn.Module], Any] | None] = {
        "plain": None,
        "layerprof_oneshot": LayerProf,
        "layerprof_oneshot_read": OneShotRead,
        "full_backward_hooks": FullBackwardHookTimer,
        "torch_profiler_stack": TorchProfiler,
    }
    if _deepspeed_available():
        wrappers["deepspeed_flops"] = DeepSpeedFlops
    if args.variants is not None:
        kept = {key for key in args.variants.split(",") if key}
        unknown = kept - set(wrappers)
        if unknown:
            parser.error(f"--variants: unknown {sorted(unknown)}; choose from {sorted(k for k in wrappers if k != 'plain')}")
        wrappers = {key: wrapper for key, wrapper in wrappers.items() if key == "plain" or key in kept}
    print(f"torch {torch.__version__}, 1 thread, median of {args.repeats} interleaved steps, {args.clock} clock, "
          f"metrics={metrics}")
    print(f"machine: {machine()}")
    results = {}
    if "resnet18" in chosen:
        results["resnet18"] = measure("resnet18 b2", resnet18, args.repeats, wrappers, metrics, args.swap)
    if "bert" in chosen:
        results["bert"] = measure("bert 2x128 s32 b8", bert, args.repeats, wrappers, metrics, args.swap)
    if "deep" in chosen:
        results["deep"] = measure("500 x Sequential(Linear(16,16), ReLU)", deep_stack, args.repeats, wrappers, metrics,
                                  args.swap)
    print_targets(results)
    print(f"load average at the end: {', '.join(f'{load:.1f}' for load in os.getloadavg())}")


def machine() -> str:
    """The machine the figures were measured on: CPU model, cores, host, and how loaded it was at the start."""
    model = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as cpuinfo:
            model = next((line.split(":", 1)[1].strip() for line in cpuinfo if line.startswith("model name")), model)
    except OSError:
        pass
    loads = ", ".join(f"{load:.1f}" for load in os.getloadavg())
    return f"{model}, {os.cpu_count()} cores, host {platform.node()}, load average {loads}"


def print_targets(results: dict[str, dict[str, float]]) -> None:
    """The figures the cost issue states its targets in: ratios to the plain step and to torch.profiler of the
    same run, absolute times beside them."""
    print("\nTargets (ratios of this run; absolute times in brackets):")
    peer = "torch_profiler_stack"
    for key, label in (("resnet18", "resnet18 b2"), ("bert", "BERT 2x128"), ("deep", "deep stack")):
        r = results.get(key)
        if r is None:
            continue
        plain, twin = r["plain_ms"], r["twin_plain_ms"]
        steady, oneshot, torchprof = (r["layerprof_steady_ratio"], r["layerprof_oneshot_ratio"],
                                      r.get(f"{peer}_ratio", float("nan")))
        print(f"  {label}: plain step {plain:.2f} ms (twin {twin:.2f} ms); steady {steady:.3f} ({steady * plain:.2f} "
              f"ms), one-shot {oneshot:.3f} ({oneshot * twin:.2f} ms), torch.profiler {torchprof:.3f} "
              f"({torchprof * twin:.2f} ms)")
        read = r.get("layerprof_oneshot_read_ratio")
        if read is not None:
            print(f"    one-shot + reading every call_times {read:.3f} ({read * twin:.2f} ms), / steady step "
                  f"{read / steady:.3f}")
        print(f"    one-shot step / steady step {oneshot / steady:.3f}; one-shot overhead / steady overhead "
              f"{(oneshot - 1) / (steady - 1) if steady != 1 else float('nan'):.2f}; overhead / torch.profiler's: "
              f"one-shot {(oneshot - 1) / (torchprof - 1) if torchprof != 1 else float('nan'):.2f}, steady "
              f"{(steady - 1) / (torchprof - 1) if torchprof != 1 else float('nan'):.2f}")
        per = r.get(f"{peer}_us_per_module")
        if key == "deep" and per:
            print(f"    per module per step: in-step (steady) {r['layerprof_steady_us_per_module']:.1f} µs, one-shot "
                  f"{r['layerprof_oneshot_us_per_module']:.1f} µs, torch.profiler one-shot {per:.1f} µs; in-step / "
                  f"torch.profiler {r['layerprof_steady_us_per_module'] / per:.2f}, one-shot / torch.profiler "
                  f"{r['layerprof_oneshot_us_per_module'] / per:.2f}")


if __name__ == "__main__":
    main()
