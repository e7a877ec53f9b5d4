"""The checkpoint plan as text and as a frontier plot (saved memory against extra time per step)."""
from __future__ import annotations

from typing import Any

from .plot_style import new_axes
from .units import format_bytes, format_ms, format_percent

__all__ = ["plan_text", "plot_checkpoint"]


def plan_text(plan: Any) -> str:
    """A short printable plan: totals, then one line per module with why it was chosen."""
    before, after = plan.saved_bytes_before, plan.saved_bytes_after
    lines = [
        f"Checkpoint plan for {plan.model_type}: saved for backward {format_bytes(before)} -> {format_bytes(after)} "
        f"({format_percent(after, before)}), budget {format_bytes(plan.budget_bytes)}, "
        f"+{format_ms(plan.extra_ms)} recomputed per step, {len(plan.modules)} modules",
    ]
    if plan.note:
        lines.append(f"note: {plan.note}")
    width = max([len(c.name) for c in plan.chosen] + [6])
    for c in plan.chosen:
        rate = "inf" if c.recompute_ms <= 0 else f"{format_bytes(c.bytes_per_ms)}/ms"
        lines.append(f"  {c.name or '<model>':<{width}}  {c.type:<20} frees {format_bytes(c.net_bytes):>10}  "
                     f"recomputes {format_ms(c.recompute_ms):>9}  {rate}")
    if plan.excluded:
        lines.append(f"  excluded: {len(plan.excluded)} modules (plan.excluded says why)")
    return "\n".join(lines)


def plot_checkpoint(profile: Any, metric: str = "total", budget: Any = 0.5, ax: Any = None, **options: Any) -> Any:
    """The frontier of checkpoint plans: saved-for-backward memory against recompute time per step, today's
    point and the plan for ``budget`` marked. ``profile``: a Profile (planned here with ``options``) or a
    CheckpointPlan."""
    plan = profile if hasattr(profile, "pareto") else profile.checkpoint_plan(budget, **options)
    points = plan.pareto()
    ax = new_axes(ax, (6.4, 4.2))
    scale = 2**20
    saved = [p.saved_bytes / scale for p in points]
    extra = [p.extra_ms for p in points]
    ax.step(extra, saved, where="post", color="0.35", linewidth=1.2, gid="checkpoint:frontier")
    ax.scatter(extra, saved, s=10, color="0.35", zorder=3, gid="checkpoint:points")
    ax.scatter([0.0], [plan.saved_bytes_before / scale], s=60, marker="o", color="tab:blue", zorder=4,
               label=f"today: {format_bytes(plan.saved_bytes_before)}", gid="checkpoint:today")
    if plan.feasible:
        ax.scatter([plan.extra_ms], [plan.saved_bytes_after / scale], s=80, marker="*", color="tab:red", zorder=5,
                   label=f"plan: {format_bytes(plan.saved_bytes_after)}, +{format_ms(plan.extra_ms)}",
                   gid="checkpoint:chosen")
    ax.axhline(plan.budget_bytes / scale, color="tab:red", linestyle=":", linewidth=1,
               label=f"budget {format_bytes(plan.budget_bytes)}", gid="checkpoint:budget")
    ax.set_xlabel("recomputed forward time per step (ms)")
    ax.set_ylabel("saved for backward (MiB)")
    ax.set_title(f"{plan.model_type}: checkpoint plans (Pareto frontier)")
    ax.grid(True, linewidth=0.3)
    ax.legend(fontsize=8, frameon=False)
    return ax
