"""The checkpoint plan as text and as a frontier plot (saved memory against extra time per step)."""
from __future__ import annotations

import functools
import html
import inspect
import platform
from pathlib import Path
from typing import Any, Sequence

from .plot_save import finish_plot, plot_suffix
from .plot_style import new_axes, plain_text
from .units import format_bytes, format_counted, format_ms, format_percent, format_signed_bytes, format_signed_ms

__all__ = ["plan_text", "verification_text", "plot_checkpoint", "frontier_svg", "wrapped_count", "peak_place",
           "FAULTS_SHOWN"]

RECOMPUTED_SHOWN = 4  # names of modules the model checkpoints itself that a plan's text lists
# On glibc a recomputation's fresh pages are the heap's top, given back to the system later in the step and taken
# again in the next (BENCHMARKS.md, "Session 13"): what keeps it, said where a plan adds faults.
@functools.lru_cache(maxsize=None)
def glibc() -> bool:
    """Whether this process runs on glibc (read when first needed: off glibc ``libc_ver`` reads the executable)."""
    return platform.libc_ver()[0] == "glibc"


KEEP_HEAP = ("  (glibc gives the top of its heap back to the system and takes it again each step; after the first "
             "steps, ctypes.CDLL(\"libc.so.6\").mallopt(-1, 2**30), M_TRIM_THRESHOLD, keeps it, and the process its peak heap)")
FAULTS_SHOWN = 256  # page faults a step (1 MiB of 4 KiB pages) a plan must add or spare for the text to say so
PEAK_KEPT = 0.95  # a plan whose recomputation brings the saved bytes back to this share of today's: noted


def plan_text(plan: Any) -> str:
    """A short printable plan: totals, then one line per module with why it was chosen (its wrapper priced by the
    work before its calls, and cold, as the knapsack chose, where the two differ)."""
    before, after = plan.saved_bytes_before, plan.saved_bytes_after
    peak_budget = getattr(plan, "peak_budget_bytes", None)
    budget = (f"peak budget {format_bytes(peak_budget)}" if peak_budget is not None
              else f"budget {format_bytes(plan.budget_bytes)}")
    lines = [
        f"Checkpoint plan for {plan.model_type}: saved for backward {format_bytes(before)} -> {format_bytes(after)} "
        f"({format_percent(after, before)}), {budget}, "
        f"+{format_ms(plan.extra_ms)} per step, {wrapped_count(plan.chosen)} wrapped",
    ]
    if plan.note:
        lines.append(f"note: {plan.note}")
    if getattr(plan, "host_figures_high", False):
        lines.append(
            f"note: for {len(plan.over_deducted)} of the {plan.timed_modules} modules timed, the profiler's own time "
            "taken off their recomputation (hook_ms a module call inside; meta[\"live_op_ms\"] a live reader's op) "
            "exceeds their profiled forward, which a figure measured right does not: the host figures read high "
            "(measured once a process, in a burst of load), and those recomputations are priced at 0 ms. Plan again "
            "in a new process; for a live profile, profile several steps (prof.step() after each), whose times the "
            "reader does not hold")
    lines += _peak_kept(plan)
    lines += _step_peak(plan)
    recomputed = getattr(plan, "already_recomputed", ())
    if recomputed:
        lines.append(f"note: the model already recomputes {format_counted(len(recomputed), 'module')} in backward "
                     f"(its own checkpointing): {_names_shown(recomputed)}; today's saved memory is with that, and a "
                     "wrapper around them nests")
    width = max([len(c.name) for c in plan.chosen] + [6])
    for c in plan.chosen:
        rate = "inf" if c.cost_ms <= 0 else f"{format_bytes(c.bytes_per_ms)}/ms"
        lines.append(f"  {c.name or '<model>':<{width}}  {c.type:<20} frees {format_bytes(c.net_bytes):>10}  "
                     f"recomputes {format_ms(c.recompute_ms):>9} + wrapper {format_ms(c.wrap_ms):>9}  {rate}"
                     f"{_cold(c.wrap_ms, getattr(c, 'cold_wrap_ms', None))}")
    if plan.excluded:
        reasons: dict[str, int] = {}
        for why in plan.excluded.values():
            short = why.split(":")[0].split(" (")[0].split(";")[0]  # "side effects on recompute", "shared", ...
            reasons[short] = reasons.get(short, 0) + 1
        counts = ", ".join(f"{count} {reason}" for reason, count in sorted(reasons.items(), key=lambda r: -r[1]))
        lines.append(f"  excluded: {format_counted(len(plan.excluded), 'module')} ({counts}; plan.excluded names "
                     "them)")
    return "\n".join(lines)


def _peak_kept(plan: Any) -> list[str]:
    """A note where the plan's peak of saved bytes, reached when backward recomputes a wrapped call, is about
    today's: the plan lowers what is held from forward to backward, not the step's peak, and the allocator may map
    fresh pages for the recomputation every step (ALBERT's and GPT-2's whole-stack wrappers: 2,500-4,500 page
    faults a step at the benchmark's size; BERT's: none)."""
    peak, where = getattr(plan, "saved_peak_bytes", None), getattr(plan, "saved_peak_at", None)
    before = plan.saved_bytes_before
    if peak is None or where is None or not before or peak < PEAK_KEPT * before:
        return []
    return [f"note: when backward recomputes {where or '<model>'}, {format_bytes(peak)} is saved at once, "
            f"{format_percent(peak, before)} of today's {format_bytes(before)}: the step's peak memory stays about where "
            "it is (a plan lowers what is held from forward to backward, not the peak), and the allocator may map fresh "
            "pages for the recomputation every step (page faults, not in the predicted time)"]


def _step_peak(plan: Any) -> list[str]:
    """The step's peak, profiled and predicted with the plan, and where the prediction puts it; nothing where the
    profile's reader did not cover the step's device."""
    predicted = getattr(plan, "predicted_peak_bytes", None)
    if predicted is None:
        return []
    profiled, budget = plan.profiled_peak_bytes, getattr(plan, "peak_budget_bytes", None)
    within = "" if budget is None else (
        f", {'within' if predicted <= budget else 'OVER'} the peak budget of {format_bytes(budget)}")
    return [f"step peak: {format_bytes(profiled)} profiled -> {format_bytes(predicted)} predicted "
            f"({format_signed_bytes(predicted - profiled)}){within}, "
            f"{peak_place(plan.predicted_peak_phase, plan.predicted_peak_at)}"]


def peak_place(phase: str, at: str | None) -> str:
    """Where a predicted peak is: "in forward", "in the backward of layer.3", "when layer.3 is recomputed"."""
    name = "<model>" if at == "" else at
    if phase == "recompute":
        return f"when {name} is recomputed"
    if phase == "backward" and name is not None:
        return f"in the backward of {name}"
    return "in forward" if phase == "forward" else f"in {phase}"


def _cold(ms: float, cold: float | None) -> str:
    """"  (4.10 ms priced cold)" where pricing each wrapper call by the work before it made a module's wrapper
    ``ms`` less than ``cold`` (the knapsack's price), else ""."""
    if cold is None or format_ms(cold) == format_ms(ms):
        return ""
    return f"  ({format_ms(cold)} priced cold)"


def _names_shown(names: Sequence[str]) -> str:
    """The first ``RECOMPUTED_SHOWN`` module names (the root as ``<model>``), and how many more."""
    shown = ", ".join(name or "<model>" for name in names[:RECOMPUTED_SHOWN])
    return shown + (f" and {len(names) - RECOMPUTED_SHOWN} more" if len(names) > RECOMPUTED_SHOWN else "")


def verification_text(result: Any) -> str:
    """A Verification as text: saved bytes and step time measured against predicted, then each wrapped module's
    recomputation per step, predicted against measured, the page faults a step where the plan changes them by
    ``FAULTS_SHOWN`` or more (priced at the cost of a fault timed in the process, and the measured extra time less
    that), and on CUDA the peak allocated memory."""
    error = (result.measured_saved_bytes - result.predicted_saved_bytes) / max(1, result.predicted_saved_bytes)
    met = "" if getattr(result, "peak_budget_bytes", None) is not None else (
        f", budget {'met' if result.meets_budget else 'NOT met'}")  # a peak budget: on the peak's line
    lines = [
        f"verified: saved {format_bytes(result.measured_saved_bytes)} measured against "
        f"{format_bytes(result.predicted_saved_bytes)} predicted ({error:+.1%}){met}; "
        f"step {format_ms(result.step_ms_before)} -> "
        f"{format_ms(result.step_ms_after)} ({format_signed_ms(result.measured_extra_ms)} measured, "
        f"{format_signed_ms(result.predicted_extra_ms)} predicted)"
    ]
    if result.recompute_ms:
        width = max(len(name or "<model>") for name in result.recompute_ms)
        lines.append("  recomputed per step, measured against predicted:")
        lines += [f"    {name or '<model>':<{width}}  {format_ms(measured):>9} against {format_ms(predicted):>9}"
                  for name, (predicted, measured) in result.recompute_ms.items()]
    batches = getattr(result, "batch_sizes", None)
    if batches is not None and batches[0] != batches[1]:
        profiled, verified = batches
        lines.append(f"  note: the verified step's batch is {verified}, the profiled step's {profiled}: the plan's "
                     f"predicted bytes, time and budget are those of a batch of {profiled} (what a step saves grows "
                     f"with its batch: {result.measured_saved_bytes / max(1, result.predicted_saved_bytes):.2f} "
                     "times the predicted bytes here). Profile a step of the batch you train with and plan on that "
                     "profile (a budget such as '50%' is then of its saved bytes)")
    since = getattr(result, "recomputed_since", ())
    if since:
        lines.append(f"  note: the model recomputes {format_counted(len(since), 'module')} of its own in backward "
                     f"that its profiled step did not ({_names_shown(since)}): its own checkpointing was turned on "
                     "since the profile, so these figures are not the plan's. Profile the model as it trains now and "
                     "plan on that profile (the planner counts what the model already recomputes)")
    faults = result.page_faults
    if faults is not None and abs(faults[1] - faults[0]) >= FAULTS_SHOWN:
        more = faults[1] > faults[0]
        lines.append(f"  page faults a step: {faults[0]:,.0f} -> {faults[1]:,.0f} (the allocator "
                     f"{'hands the recomputation fresh pages' if more else 'needs fewer fresh pages'}, which the "
                     "prediction leaves out)")
        if more and glibc():
            lines.append(KEEP_HEAP)
        lines += _faults_priced(result)
    lines += _measured_peak(result)
    return "\n".join(lines)


def _measured_peak(result: Any) -> list[str]:
    """The step's peak without and with the plan as measured, set beside the prediction where there is one."""
    peaks = getattr(result, "peak_bytes", None)
    if peaks is None:
        return []
    before, after = peaks
    what = "CUDA max_memory_allocated" if result.cuda_peak_bytes is not None else "step peak (live tensor bytes)"
    line = f"{what}: {format_bytes(before)} -> {format_bytes(after)} measured"
    predicted, profiled = result.predicted_peak_bytes, result.profiled_peak_bytes
    if predicted is not None and profiled is not None:
        line += (f"; {format_bytes(predicted)} predicted ({(after - predicted) / max(1, predicted):+.1%} off), "
                 f"a change of {format_signed_bytes(after - before)} measured against "
                 f"{format_signed_bytes(predicted - profiled)} predicted")
    budget = getattr(result, "peak_budget_bytes", None)
    if budget is not None:
        line += f"; peak budget {format_bytes(budget)} {'met' if result.meets_budget else 'NOT met'}"
    if profiled is not None and abs(before - profiled) > max(0.01 * profiled, 2**20):
        # The prediction starts from the profiled step's peak. CUDA's counts every tensor alive, so memory freed or
        # taken outside the step since (an earlier model collected, an optimizer's state made) moves a plain step's
        # peak away from it; the live bytes count the step's own tensors, which differ only where the steps do.
        why = ("memory held outside the step changed since the profile (or the profiled step made one-time "
               "allocations)" if result.cuda_peak_bytes is not None else "the profiled step's peak differs from a "
               "plain step's (one-time allocations in the profiled step, or steps that differ)")
        return [line, f"  today's peak measured {format_bytes(before)} against {format_bytes(profiled)} profiled: "
                      f"{why}; the changes compare, the peaks are off by that much"]
    return [line]


def _faults_priced(result: Any) -> list[str]:
    """The plan's change in page faults priced at the cost of a fault timed in the process, and the measured extra
    time less it, to set against the prediction; nothing where the cost was not timed."""
    fault_ms = getattr(result, "fault_ms", None)
    if fault_ms is None:
        return []
    return [f"  at {result.fault_us:.1f} µs a fault (timed here) that is {format_signed_ms(fault_ms)} a step; "
            f"less that, the plan costs {format_signed_ms(result.measured_extra_ms - fault_ms)} against "
            f"{format_signed_ms(result.predicted_extra_ms)} predicted"]


def wrapped_count(chosen: Any) -> str:
    """"2 modules", or "1 module and 3 runs" where runs of a Sequential's children are wrapped too."""
    runs = sum(1 for c in chosen if c.run)
    modules, runs_text = format_counted(len(chosen) - runs, "module"), format_counted(runs, "run")
    if not runs:
        return modules
    return f"{modules} and {runs_text}" if len(chosen) > runs else runs_text


def _check_planning(profile: Any, options: dict[str, Any]) -> None:
    """Options the frontier passes on to ``checkpoint_plan``; a TypeError naming the plot for any other (Python's
    would name checkpoint_plan, which the user did not call)."""
    planning = [name for name in inspect.signature(profile.checkpoint_plan).parameters if name != "budget"]
    for name in options:
        if name not in planning:
            raise TypeError(f"plot('checkpoint') got an unexpected keyword argument {name!r}; it takes budget=, "
                            f"ax=, path= and checkpoint_plan's {', '.join(f'{other}=' for other in planning)}")


def plot_checkpoint(profile: Any, metric: str = "total", budget: Any = None, ax: Any = None,
                    path: str | Path | None = None, **options: Any) -> Any:
    """The frontier of checkpoint plans: saved-for-backward memory against extra time per step (recomputation and
    wrappers), and where the profile predicts it the step's peak with each of them (``predicted_peak_bytes``);
    today's point and the plan for ``budget`` (or ``peak=``; by default half the saved memory) marked.
    ``profile``: a Profile (planned here with ``options``) or a CheckpointPlan. ``path``: a .png, .svg or .pdf file
    to write the figure to (see ``plot_sunburst``)."""
    plot_suffix(path)
    if metric != "total":  # (the plots' shared default; its axes are fixed)
        raise ValueError(f"plot('checkpoint') draws saved memory against extra time: metric= does not apply (got "
                         f"{metric!r})")
    if hasattr(profile, "pareto"):
        if budget is not None or options:  # (the plan given is the one marked: a budget would be dropped)
            given = ", ".join(f"{name}=" for name in ([] if budget is None else ["budget"]) + list(options))
            raise TypeError(f"plot('checkpoint') of a CheckpointPlan draws that plan: {given.replace(', ', ' and ')} "
                            "apply to a profile (prof.plot('checkpoint', budget=...))")
        plan = profile
    else:
        _check_planning(profile, options)
        plan = profile.checkpoint_plan(0.5 if budget is None and options.get("peak") is None else budget, **options)
    points = plan.pareto()
    created, ax = ax is None, new_axes(ax, (6.4, 4.2))
    scale = 2**20
    saved = [p.saved_bytes / scale for p in points]
    extra = [p.extra_ms for p in points]
    ax.step(extra, saved, where="post", color="0.35", linewidth=1.2, gid="checkpoint:frontier",
            label="saved for backward")
    ax.scatter(extra, saved, s=10, color="0.35", zorder=3, gid="checkpoint:points")
    ax.scatter([0.0], [plan.saved_bytes_before / scale], s=60, marker="o", color="tab:blue", zorder=4,
               label=f"today: {format_bytes(plan.saved_bytes_before)}", gid="checkpoint:today")
    peaks = _frontier_peaks(plan, points)
    if peaks is not None:
        ax.step(extra, [peak / scale for peak in peaks], where="post", color="tab:purple", linewidth=1.2,
                linestyle="--", label="step peak predicted", gid="checkpoint:peaks")
        ax.scatter([0.0], [plan.profiled_peak_bytes / scale], s=40, marker="o", color="tab:purple", zorder=4,
                   gid="checkpoint:today-peak")
    if plan.feasible:
        at = _on_frontier_ms(plan)
        ax.scatter([at], [plan.saved_bytes_after / scale], s=80, marker="*", color="tab:red", zorder=5,
                   label=f"plan: {format_bytes(plan.saved_bytes_after)}, {_plan_ms(plan)}", gid="checkpoint:chosen")
        if peaks is not None:
            ax.scatter([at], [plan.predicted_peak_bytes / scale], s=80, marker="*", color="tab:purple",
                       zorder=5, label=f"its step peak: {format_bytes(plan.predicted_peak_bytes)}",
                       gid="checkpoint:chosen-peak")
    line, label = _budget_line(plan, _data_top(plan, peaks))
    if line is None:  # far above the frontier: in the legend only, the frontier kept readable
        ax.plot([], [], color="tab:red", linestyle=":", linewidth=1, label=label, gid="checkpoint:budget")
    else:
        ax.axhline(line / scale, color="tab:red", linestyle=":", linewidth=1, label=label, gid="checkpoint:budget")
    ax.set_xlabel("extra time per step: recomputed forwards + wrappers (ms)")
    ax.set_ylabel("memory (MiB)" if peaks is not None else "saved for backward (MiB)")
    ax.set_title(f"{plain_text(plan.model_type)}: checkpoint plans (Pareto frontier)")
    ax.grid(True, linewidth=0.3)
    ax.legend(fontsize=8, frameon=False)
    return finish_plot(ax, path, created)


def _on_frontier_ms(plan: Any) -> float:
    """Where the plan sits on the frontier's time axis: its knapsack (cold) figure, the one ``pareto()`` gives
    every point in. Its ``extra_ms``, each wrapper priced by the work before it, is less where a wrapped call
    follows another closely, and drawn there the plan showed left of the frontier, cheaper than any plan."""
    return float(getattr(plan, "cold_extra_ms", plan.extra_ms))


def _plan_ms(plan: Any) -> str:
    """"+2.74 ms", and the cold figure it is drawn at where the two differ: "+2.74 ms (+3.1 ms priced cold)"."""
    text, cold = f"+{format_ms(plan.extra_ms)}", getattr(plan, "cold_extra_ms", None)
    if cold is None or format_ms(cold) == format_ms(plan.extra_ms):
        return text
    return f"{text} (+{format_ms(cold)} priced cold)"


def _frontier_peaks(plan: Any, points: list[Any]) -> list[int] | None:
    """Each frontier point's predicted step peak, where the plan predicts the peak of every one; else None."""
    if getattr(plan, "predicted_peak_bytes", None) is None:
        return None
    peaks = [getattr(point, "predicted_peak_bytes", None) for point in points]
    return None if any(peak is None for peak in peaks) else peaks


def _data_top(plan: Any, peaks: list[int] | None) -> int:
    """The highest point drawn besides the budget: today's saved bytes, or the step peaks where drawn."""
    return max([plan.saved_bytes_before, 1] + (peaks or []) + ([plan.profiled_peak_bytes] if peaks is not None else []))


def _budget_line(plan: Any, top: int) -> tuple[int | None, str]:
    """Where the plan's budget is drawn, and its label: the saved bytes' budget, or the step peak's. None where it
    is over 1.25 times the highest point drawn (``top``): a budget far above today's (``"1e9"``) would squash the
    frontier into the axis; its label then says it is off the chart."""
    peak = getattr(plan, "peak_budget_bytes", None)
    line, label = ((peak, f"peak budget {format_bytes(peak)}") if peak is not None
                   else (plan.budget_bytes, f"budget {format_bytes(plan.budget_bytes)}"))
    if line > 1.25 * top:
        return None, f"{label} (above the chart: nothing to wrap)"
    return line, label


def frontier_svg(plan: Any, width: int = 640, height: int = 300) -> str:
    """The frontier as an inline SVG (no script, for the HTML report): saved bytes against extra time, the step's
    predicted peak with each plan where known (dashed), today's point, the plan and its budget marked."""
    points = plan.pareto()
    peaks = _frontier_peaks(plan, points)
    highest = _data_top(plan, peaks)
    budget, budget_label = _budget_line(plan, highest)
    left, right, top, bottom = 70, 20, 20, 40
    most_ms = max([p.extra_ms for p in points] + [_on_frontier_ms(plan), 1e-9])
    most_bytes = highest if budget is None else max(highest, budget)

    def x(ms: float) -> float:
        return left + (width - left - right) * ms / most_ms

    def y(saved: float) -> float:
        return top + (height - top - bottom) * (1 - saved / most_bytes)

    def steps(values: list[int]) -> str:
        path = []
        for previous, point, value in zip([None, *values], points, values):
            if previous is not None:
                path.append(f"{x(point.extra_ms):.1f},{y(previous):.1f}")
            path.append(f"{x(point.extra_ms):.1f},{y(value):.1f}")
        return " ".join(path)

    parts = [
        f'<svg class="checkpoint-frontier" width="{width}" height="{height}" viewBox="0 0 {width} {height}" role="img" '
        f'aria-label="frontier of checkpoint plans" xmlns="http://www.w3.org/2000/svg">',
        f'<line x1="{left}" y1="{height - bottom}" x2="{width - right}" y2="{height - bottom}" stroke="#888"/>',
        f'<line x1="{left}" y1="{top}" x2="{left}" y2="{height - bottom}" stroke="#888"/>',
        f'<polyline points="{steps([p.saved_bytes for p in points])}" fill="none" stroke="#555" stroke-width="1.5">'
        "<title>saved for backward</title></polyline>",
        (f'<line x1="{left}" y1="{y(budget):.1f}" x2="{width - right}" y2="{y(budget):.1f}" '
         f'stroke="#d62728" stroke-dasharray="3,3"><title>{html.escape(budget_label)}</title></line>')
        if budget is not None else
        (f'<text x="{left + 6}" y="{top - 6}" font-size="11" fill="#d62728">{html.escape(budget_label)}</text>'),
        f'<circle cx="{x(0):.1f}" cy="{y(plan.saved_bytes_before):.1f}" r="5" fill="#1f77b4">'
        f"<title>today: {format_bytes(plan.saved_bytes_before)}</title></circle>",
    ]
    if peaks is not None:
        parts += [
            f'<polyline class="checkpoint-peaks" points="{steps(peaks)}" fill="none" stroke="#9467bd" '
            'stroke-width="1.5" stroke-dasharray="6,3"><title>step peak predicted with each plan</title></polyline>',
            f'<circle cx="{x(0):.1f}" cy="{y(plan.profiled_peak_bytes):.1f}" r="4" fill="#9467bd">'
            f"<title>today's step peak: {format_bytes(plan.profiled_peak_bytes)}</title></circle>",
        ]
    if plan.feasible:
        at = _on_frontier_ms(plan)
        parts.append(f'<circle cx="{x(at):.1f}" cy="{y(plan.saved_bytes_after):.1f}" r="6" '
                     f'fill="#d62728"><title>plan: {format_bytes(plan.saved_bytes_after)}, '
                     f"{html.escape(_plan_ms(plan))}</title></circle>")
        if peaks is not None:
            parts.append(f'<circle cx="{x(at):.1f}" cy="{y(plan.predicted_peak_bytes):.1f}" r="6" '
                         f'fill="#9467bd"><title>its step peak: {format_bytes(plan.predicted_peak_bytes)}</title>'
                         "</circle>")
    what = "memory" if peaks is not None else "saved for backward"
    if peaks is not None:
        parts.append(f'<text x="{width - right}" y="{top - 6}" text-anchor="end" font-size="11">solid: saved for '
                     "backward; dashed: step peak predicted</text>")
    parts += [
        f'<text x="{(left + width - right) / 2:.0f}" y="{height - 8}" text-anchor="middle" font-size="12">'
        f"extra time per step, up to {html.escape(format_ms(most_ms))}</text>",
        f'<text x="14" y="{(top + height - bottom) / 2:.0f}" text-anchor="middle" font-size="12" '
        f'transform="rotate(-90 14 {(top + height - bottom) / 2:.0f})">{what}, up to '
        f"{html.escape(format_bytes(most_bytes))}</text>",
        "</svg>",
    ]
    return "\n".join(parts)
