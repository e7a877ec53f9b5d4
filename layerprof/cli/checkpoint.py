"""``--checkpoint-budget``: plan which modules to recompute, print the plan and verify it on the model (``show``:
print the plan of a saved profile)."""
from __future__ import annotations

import argparse
from typing import Any

from torch import nn

from ..metrics import DEFAULT_METRICS
from ..plan.budget import parse_budget
from ..plan.plan import CheckpointPlan
from ..plan.verify import verify_plan
from ..profile import Profile
from ..render.checkpoint import verification_text
from .errors import RunError, UsageError, one_line
from .run import loss_of

__all__ = ["check_budget_options", "check_checkpoint_options", "plan_lines", "plan_and_verify", "plot_options"]


def check_budget_options(options: argparse.Namespace) -> None:
    """The budget reads, and ``--allow-side-effects`` comes with one."""
    budget = options.checkpoint_budget
    if budget is None:
        if options.allow_side_effects:
            raise UsageError("--allow-side-effects is for a checkpoint plan: add --checkpoint-budget 50%")
        return
    try:
        parse_budget(_number(budget), 1)
    except (TypeError, ValueError) as exc:
        raise UsageError(f"--checkpoint-budget: {exc}") from None


def check_checkpoint_options(options: argparse.Namespace) -> None:
    """Before the model is built: the budget reads, the run trains, and the memory meter runs."""
    budget = options.checkpoint_budget
    if options.plot_kind == "checkpoint" and budget is None:
        raise UsageError("--plot-kind checkpoint draws the plans for a budget: add --checkpoint-budget 50%")
    check_budget_options(options)
    if budget is None:
        return
    if options.eval or options.no_backward:
        raise UsageError("--checkpoint-budget plans a training step: drop --eval and --no-backward")
    # ``--metrics live_memory`` instead predicts the step's peak on the CPU too (CUDA has its allocator): not by
    # default, a dispatch mode on every op slows the profiled step.
    if options.metrics is not None and not {"memory", "live_memory"} & set(options.metrics):
        options.metrics = [*options.metrics, "memory"]
    elif options.metrics is None:
        options.metrics = [*DEFAULT_METRICS, "memory"]


def _number(text: str) -> Any:
    """A budget as typed: "0.5" is a fraction, "1000000" bytes, anything else a size or a percentage."""
    try:
        return int(text)
    except ValueError:
        pass
    try:
        return float(text)
    except ValueError:
        return text


def plan_lines(profile: Profile, options: argparse.Namespace) -> tuple[CheckpointPlan, list[str]]:
    """The plan for ``--checkpoint-budget`` and its text."""
    plan = profile.checkpoint_plan(_number(options.checkpoint_budget), allow_side_effects=options.allow_side_effects)
    lines = [str(plan)]
    if plan.reachable_allowing_side_effects is not None:
        lines.append("  (--allow-side-effects lets the plan recompute them)")
    return plan, lines


def plan_and_verify(profile: Profile, model: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any],
                    options: argparse.Namespace) -> str:
    """The plan's text and, below it, predicted against measured on the model."""
    plan, lines = plan_lines(profile, options)
    if not plan.modules:
        return "\n".join(lines)

    def step() -> None:
        loss_of(model(*args, **kwargs)).backward()
        model.zero_grad(set_to_none=True)

    try:
        result = verify_plan(plan, model, step, repeats=3)
    except Exception as exc:
        raise RunError(f"verifying the checkpoint plan raised {one_line(exc)}") from exc
    lines.append(verification_text(result))
    return "\n".join(lines)


def plot_options(options: argparse.Namespace) -> dict[str, Any]:
    """What ``--plot-kind checkpoint`` passes to the plot: the budget and whether side effects are allowed (none
    without ``--checkpoint-budget``: ``show`` then marks the plan for half the saved memory, the plot's default)."""
    if getattr(options, "plot_kind", None) != "checkpoint" or options.checkpoint_budget is None:
        return {}
    return {"budget": _number(options.checkpoint_budget), "allow_side_effects": options.allow_side_effects}
