"""``--checkpoint-budget`` and ``--checkpoint-peak``: plan which modules to recompute, print the plan and verify it on
the model (``show``: print the plan of a saved profile, on its saved bytes)."""
from __future__ import annotations

import argparse
import contextlib
import functools
import sys
import warnings
from typing import Any, Callable, ContextManager

from torch import nn

from .._machine import environment_in, other_machine
from ..metrics import DEFAULT_METRICS
from ..plan.budget import parse_budget
from ..plan.plan import CheckpointPlan
from ..plan.verify import verify_plan
from ..profile import OTHER_MACHINE_WARNING, Profile
from ..render.checkpoint import verification_text
from .errors import RunError, UsageError, one_line
from .run import training_step

__all__ = ["check_budget_options", "check_checkpoint_options", "plan_lines", "plan_and_verify", "planned",
           "plot_options"]


def check_budget_options(options: argparse.Namespace) -> None:
    """The budget reads (one of ``--checkpoint-budget`` and ``--checkpoint-peak``), and ``--allow-side-effects``
    comes with one."""
    budget, peak = options.checkpoint_budget, getattr(options, "checkpoint_peak", None)
    if budget is not None and peak is not None:
        raise UsageError("--checkpoint-budget and --checkpoint-peak: give one (the memory saved for backward, or the "
                         "step's peak)")
    if budget is None and peak is None:
        for flag, given in (("--allow-side-effects", options.allow_side_effects),
                            ("--wrap-cost", getattr(options, "wrap_cost", None) is not None)):
            if given:
                raise UsageError(f"{flag} is for a checkpoint plan: add --checkpoint-budget 50%")
        return
    flag, text, name = ("--checkpoint-budget", budget, "budget") if peak is None else ("--checkpoint-peak", peak, "peak")
    try:
        parse_budget(text, 1, name=name)
    except (TypeError, ValueError) as exc:
        raise UsageError(f"{flag}: {exc}") from None


def planned(options: argparse.Namespace) -> bool:
    """Whether the run plans checkpoints (``--checkpoint-budget`` or ``--checkpoint-peak``)."""
    return options.checkpoint_budget is not None or getattr(options, "checkpoint_peak", None) is not None


def check_checkpoint_options(options: argparse.Namespace) -> None:
    """Before the model is built: the budget reads, the run trains, and the memory meter runs (reading live
    tensor bytes on the CPU for ``--checkpoint-peak``, which says so)."""
    if options.plot_kind == "checkpoint" and not planned(options):
        raise UsageError("--plot-kind checkpoint draws the plans for a budget: add --checkpoint-budget 50%")
    check_budget_options(options)
    if not planned(options):
        return
    flag = "--checkpoint-budget" if options.checkpoint_budget is not None else "--checkpoint-peak"
    if options.eval or options.no_backward:
        raise UsageError(f"{flag} plans a training step: drop --eval and --no-backward")
    metrics = list(DEFAULT_METRICS if options.metrics is None else options.metrics)
    if flag == "--checkpoint-peak" and not str(options.device).startswith("cuda") and "live_memory" not in metrics:
        # The step's peak at every module boundary: CUDA's allocator has it, the CPU's only the live-bytes reader.
        print("layerprof: --checkpoint-peak profiles with --metrics live_memory (the CPU's live tensor bytes, "
              "which predict the step's peak; it slows the profiled step, 2-3x where ops are small)",
              file=sys.stderr)
        options.metrics = [name for name in metrics if name != "memory"] + ["live_memory"]
    # ``--metrics live_memory`` instead predicts the step's peak on the CPU too (CUDA has its allocator): not by
    # default, a dispatch mode on every op slows the profiled step.
    elif not {"memory", "live_memory"} & set(metrics):
        options.metrics = [*metrics, "memory"]


def plan_lines(profile: Profile, options: argparse.Namespace) -> tuple[CheckpointPlan, list[str]]:
    """The plan for ``--checkpoint-budget`` and its text."""
    given = getattr(options, "wrap_cost", None)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        plan = profile.checkpoint_plan(**_budget(options), allow_side_effects=options.allow_side_effects,
                                       wrap_cost="measured" if given is None else given)
    for warning in caught:
        text = str(warning.message)
        if text.startswith(OTHER_MACHINE_WARNING):  # its advice is the Python API's: the shell's instead
            other = other_machine(environment_in(profile.meta))
            print(f"layerprof: note: this profile was measured on another machine ({other}), and the plan's extra "
                  "time holds this machine's checkpoint-wrapper price: give that machine's with --wrap-cost "
                  "MS_CALL,MS_TENSOR (layerprof.plan.wrap_cost.wrap_cost() run there)", file=sys.stderr)
        else:
            warnings.warn_explicit(warning.message, warning.category, warning.filename, warning.lineno)
    lines = [str(plan)]
    if plan.reachable_allowing_side_effects is not None:
        lines.append("  (--allow-side-effects lets the plan recompute them)")
    return plan, lines


def plan_and_verify(profile: Profile, model: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any],
                    options: argparse.Namespace,
                    precision: Callable[[], ContextManager[Any]] = contextlib.nullcontext) -> str:
    """The plan's text and, below it, predicted against measured on the model, its step's forward inside
    ``precision()`` as the profiled one's (``run.autocast_step``)."""
    plan, lines = plan_lines(profile, options)
    if not plan.modules:
        return "\n".join(lines)

    try:
        result = verify_plan(plan, model, functools.partial(training_step, model, args, kwargs, precision),
                             repeats=3)
    except Exception as exc:
        raise RunError(f"verifying the checkpoint plan raised {one_line(exc)}") from exc
    lines.append(verification_text(result))
    return "\n".join(lines)


def plot_options(options: argparse.Namespace) -> dict[str, Any]:
    """What ``--plot-kind checkpoint`` passes to the plot: the budget and whether side effects are allowed (none
    without ``--checkpoint-budget``: ``show`` then marks the plan for half the saved memory, the plot's default)."""
    if getattr(options, "plot_kind", None) != "checkpoint" or not planned(options):
        return {}
    return {**_budget(options), "allow_side_effects": options.allow_side_effects}


def _budget(options: argparse.Namespace) -> dict[str, Any]:
    """``budget=`` or ``peak=`` of ``checkpoint_plan``, as the options give it."""
    peak = getattr(options, "checkpoint_peak", None)
    return {"budget": options.checkpoint_budget} if peak is None else {"peak": peak}
