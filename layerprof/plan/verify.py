"""Verifying a checkpoint plan: apply it, run the step, and set what was measured beside what was predicted.

>>> import torch, layerprof, warnings
>>> from layerprof.plan.verify import verify_plan
>>> net = torch.nn.Sequential(torch.nn.Linear(8, 64), torch.nn.Sequential(torch.nn.Linear(64, 64),
...                           torch.nn.Tanh(), torch.nn.Linear(64, 64), torch.nn.Tanh()), torch.nn.Linear(64, 1))
>>> x = torch.randn(16, 8)
>>> step = lambda: net(x).sum().backward()
>>> with warnings.catch_warnings():
...     warnings.simplefilter("ignore")
...     with layerprof.LayerProf(net, metrics=("memory",)) as prof:
...         step()
...     result = verify_plan(prof.checkpoint_plan(0.75), net, step, repeats=1)
>>> result.measured_saved_bytes == result.predicted_saved_bytes, "forward" in net[1].__dict__
(True, False)
"""
from __future__ import annotations

import statistics
import time
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
from torch import nn

from ..collect.profiler import LayerProf
from ..metrics.checkpoint_bytes import STORAGES_ATTRIBUTE, saved_after
from ..metrics.live_bytes import read_step
from ..record.records import ModuleRecord, preorder
from ..render.checkpoint import verification_text
from .apply import RecomputeTimer
from .fault_cost import page_fault_us
from .plan import VERIFIER, CheckpointPlan, outermost_recomputed, saved_today
from .profiled_as import profiled_as
from .runs import parse_run

try:
    import resource
except ImportError:  # Windows: no page fault counts
    resource = None  # type: ignore[assignment]

__all__ = ["Verification", "verify_plan"]


@dataclass(frozen=True)
class Verification:
    """Predicted against measured for one plan on one step. Times are medians over ``repeats`` steps, with and
    without the plan interleaved. ``recompute_ms``: each wrapped module or run -> (predicted, measured), measured
    as the wall time its recomputation in backward took per step (the checkpoint's early stop included: what it
    does not re-run is not timed), in the timed steps with the plan (no profiler on them), the median.
    ``cuda_peak_bytes``: (before, after) ``max_memory_allocated`` of a step on CUDA, else None. ``page_faults``:
    (before, after) the process's minor page faults a step, the median (None where the system does not count them):
    a plan can make the allocator hand the recomputation fresh pages, or spare it some, which the prediction
    leaves out. ``fault_us``: what a minor page fault costs in this process, µs (``fault_cost.py``, timed after
    the steps; None where faults are not counted), and ``fault_ms`` the plan's change in faults at that price, ms a
    step: the part of a miss the allocator explains. ``peak_bytes``: (before, after) the step's peak, measured in
    a plain step (no profiler) without and with the plan: ``max_memory_allocated`` on CUDA, on the CPU the most
    bytes of tensors made in the step alive at once (``LiveBytesReader``; only where the plan predicts the peak, from
    a profile with ``live_memory``, else None); ``predicted_peak_bytes`` and
    ``profiled_peak_bytes``: the plan's prediction of it and the peak its profile measured, on the same scale
    (None where the profile was taken without a reader for its device: on the CPU, without ``live_memory``).
    ``measured_saved_bytes``: what the step saved for backward with the plan, of one micro-batch where the step
    accumulates several (each forward's backward run before the next forward), as the plan's profile is of one.
    ``budget_bytes`` is the plan's budget of saved bytes, ``peak_budget_bytes`` its budget of the step's peak (one is
    None): ``meets_budget`` holds the measured saved bytes, or the measured peak with the plan, against it.
    ``recomputed_since``: the outermost modules the model recomputed itself in the verified step and not in the
    profiled one, outside the plan's (its own checkpointing turned on since the profile: the plan was made for
    another model, and its figures do not hold). ``batch_sizes``: (profiled, verified) the batch size of the first
    tensor the model was called with in the plan's profile and in the verified step, where both are known: a plan's
    bytes and budget are of the profiled batch, and a step of another batch saves about that many times more or
    less."""

    predicted_saved_bytes: int
    measured_saved_bytes: int
    budget_bytes: int | None
    predicted_extra_ms: float
    measured_extra_ms: float
    step_ms_before: float
    step_ms_after: float
    recompute_ms: dict[str, tuple[float, float]] = field(default_factory=dict)
    cuda_peak_bytes: tuple[int, int] | None = None
    page_faults: tuple[float, float] | None = None
    fault_us: float | None = None
    peak_bytes: tuple[int, int] | None = None
    predicted_peak_bytes: int | None = None
    profiled_peak_bytes: int | None = None
    peak_budget_bytes: int | None = None
    recomputed_since: tuple[str, ...] = ()
    batch_sizes: tuple[int, int] | None = None

    @property
    def meets_budget(self) -> bool:
        if self.peak_budget_bytes is not None:
            return self.peak_bytes is not None and self.peak_bytes[1] <= self.peak_budget_bytes
        return self.budget_bytes is not None and self.measured_saved_bytes <= self.budget_bytes

    def __str__(self) -> str:
        return verification_text(self)  # (the command line's lines; repr keeps the fields)

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        # IPython shows a cell's last value by this: the text, not the ~470 characters of the fields' repr.
        printer.text(str(self))

    @property
    def fault_ms(self) -> float | None:
        """The plan's change in page faults a step at ``fault_us`` a fault (ms), or None where not counted."""
        if self.page_faults is None or self.fault_us is None:
            return None
        return (self.page_faults[1] - self.page_faults[0]) * self.fault_us / 1e3


def _on_cuda(model: nn.Module) -> bool:
    return torch.cuda.is_available() and any(p.is_cuda for p in model.parameters())


def _live_peak(step: Callable[[], Any]) -> int:
    return read_step(step).peak


def _cuda_peak(step: Callable[[], Any]) -> int:
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    step()
    torch.cuda.synchronize()
    return int(torch.cuda.max_memory_allocated())


def verify_plan(plan: CheckpointPlan, model: nn.Module, step: Callable[[], Any], repeats: int = 5) -> Verification:
    """Apply ``plan`` to ``model``, profile one ``step()`` (a forward and backward of the model) with the memory
    meter, time ``repeats`` steps with and without it, and remove the plan (also on error). A ValueError where
    ``step`` runs no backward through the model."""
    if not callable(step):
        raise TypeError(f"step must be a callable that runs one training step, got {type(step).__name__}")
    if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
        raise ValueError(f"repeats must be a positive int, got {repeats!r}")
    on_cuda = _on_cuda(model)
    sync = torch.cuda.synchronize if on_cuda else None
    # On the CPU only where the plan predicts the peak (a profile with live_memory): the reader slows the step.
    step_peak = _cuda_peak if on_cuda else _live_peak if plan.predicted_peak_bytes is not None else None
    before_peak = step_peak(step) if step_peak is not None else None
    with plan.applied(model):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # one step under the memory meter: its times are not the point here
            try:
                with LayerProf(model, metrics=("memory",)) as prof:
                    step()
            except RuntimeError as error:
                if "was called through torch.compile(" not in str(error):
                    raise
                raise ValueError(
                    f"verify_plan: step() calls a torch.compile() wrapper of the model, which verify_plan cannot "
                    f"profile (its saved bytes are measured with the model's module hooks, which a compiled wrapper "
                    f"runs around, not inside). Pass a step that calls the {type(model).__name__} itself, eagerly: "
                    "the plan applied to compiled._orig_mod takes effect under compile too, and the bytes it frees "
                    "are the same") from error
            _require_backward(prof.profile.tree)
            measured = _saved_at_once(prof.profile)  # (a step it cannot measure is refused before any timing)
            since = _recomputed_since(plan, prof.profile)
            batches = _batch_sizes(plan, prof.profile)
        after_peak = step_peak(step) if step_peak is not None else None
    before: list[tuple[float, int]] = []
    after: list[tuple[float, int]] = []
    recomputed: dict[str, list[float]] = {name: [] for name in plan.modules}
    for _ in range(repeats):
        before.append(_timed(step, sync))
        with plan.applied(model), RecomputeTimer(sync) as timer:
            after.append(_timed(step, sync))
        for name, times in recomputed.items():
            times.append(timer.ms.get(name, 0.0))
    recompute = {chosen.name: (chosen.recompute_ms, statistics.median(recomputed[chosen.name]))
                 for chosen in plan.chosen}
    step_before, step_after = (statistics.median(ms for ms, _ in times) for times in (before, after))
    faults = None if resource is None else tuple(statistics.median(f for _, f in times) for times in (before, after))
    return Verification(
        predicted_saved_bytes=plan.saved_bytes_after, measured_saved_bytes=measured,
        budget_bytes=plan.budget_bytes, predicted_extra_ms=plan.extra_ms, measured_extra_ms=step_after - step_before,
        step_ms_before=step_before, step_ms_after=step_after, recompute_ms=recompute,
        cuda_peak_bytes=(before_peak, after_peak) if on_cuda else None,
        peak_bytes=None if before_peak is None or after_peak is None else (before_peak, after_peak),
        predicted_peak_bytes=plan.predicted_peak_bytes, profiled_peak_bytes=plan.profiled_peak_bytes,
        peak_budget_bytes=plan.peak_budget_bytes,
        page_faults=faults, fault_us=None if resource is None else page_fault_us(),  # type: ignore[arg-type]
        recomputed_since=since, batch_sizes=batches,
    )


def _recomputed_since(plan: CheckpointPlan, profile: Any) -> tuple[str, ...]:
    """The outermost modules the model recomputed itself in the verified step (``profile``) that its profiled step
    did not recompute (``plan.already_recomputed``), leaving out the plan's wrapped modules and runs and what is
    inside them: a model whose own checkpointing was turned on since (``gradient_checkpointing_enable()``)."""
    ours = []
    for name in plan.modules:
        run = parse_run(name)
        if run is None:
            ours.append(name)
        else:
            parent, first, stop = run
            ours += [child.name for child in profile.records[parent].children[first:stop]]
    before = set(plan.already_recomputed)

    def inside(name: str) -> bool:
        return any(not mine or name == mine or name.startswith(mine + ".") for mine in ours)

    return tuple(name for name in outermost_recomputed(profile.tree) if name not in before and not inside(name))


def _batch_sizes(plan: CheckpointPlan, profile: Any) -> tuple[int, int] | None:
    """(profiled, verified): the batch size of the plan's profile and of the verified step (``profile``), where both
    are known."""
    profiled = (plan.__dict__.get("profiled_as") or {}).get("batch_size")
    verified = profiled_as(profile.meta).get("batch_size")
    return None if profiled is None or verified is None else (profiled, verified)


def _saved_at_once(profile: Any) -> int:
    """The bytes the verified step saved for backward: its forwards' sum, or, where each forward after the first
    began once every earlier one's backward had run (gradient accumulation), the most one forward saved (the sum
    was never held: 4 micro-batches read 4 times the plan's bytes, and its budget missed). A ValueError where only
    some forwards of the step did (which forwards were held together is not known here)."""
    root = profile.tree
    memory = profile.meta.get("memory")
    after = memory.get("forwards_after_backward", 0) if isinstance(memory, dict) else 0
    tables = root.__dict__.get(STORAGES_ATTRIBUTE) or []
    if not after:
        return saved_today(root)
    if after == len(tables) - 1:
        return max(saved_after([table], set()) for table in tables)
    raise ValueError(
        f"step: verify_plan's step ran {len(tables)} forwards that saved for backward, {after} of them after every "
        "earlier one's backward had run, and others while an earlier one's saved tensors were held: its saved "
        "bytes are neither one micro-batch's nor a sum held at once. Verify with a step of one forward and its "
        "backward (the step the plan was made on), or of micro-batches each run to its backward")


def _require_backward(root: ModuleRecord) -> None:
    """A ValueError where the profiled step ran no backward through the model: the recomputations a plan adds run
    there, so a forward alone measures none of its cost (it read as a plan that costs nothing)."""
    if not any(record.backward_ms for record in preorder(root)):
        raise ValueError("step: verify_plan needs a step that runs backward through the model (the plan's "
                         "recomputations run there), and this one ran none: call .backward() on the loss inside "
                         "step, e.g. step = lambda: model(x).sum().backward()")


def _minor_faults() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt if resource is not None else 0


def _timed(step: Callable[[], Any], sync: Callable[[], Any] | None = None) -> tuple[float, int]:
    """A step's wall time (ms) and the minor page faults the process took in it. ``sync`` (on CUDA,
    ``torch.cuda.synchronize``) runs before the clock starts and before it stops, so that the step's kernels are
    inside its time and the work queued before it is not."""
    if sync is not None:
        sync()
    faults = _minor_faults()
    start = time.perf_counter()
    step()
    if sync is not None:
        sync()
    elapsed = (time.perf_counter() - start) * 1e3
    return elapsed, _minor_faults() - faults


VERIFIER[:] = [verify_plan]  # (what plan.verify() calls)
