"""CheckpointPlan: the modules to recompute to fit a budget of saved-for-backward memory, and its application.

Besides modules, a plan can wrap a run of consecutive children of an ``nn.Sequential`` under one checkpoint, named
``parent[first:stop]`` (``runs.py``). Here the inner Sequential's first three layers: its last Tanh, whose output
backward needs anyway, is left out of the checkpoint.

>>> import torch, layerprof
>>> net = torch.nn.Sequential(torch.nn.Linear(8, 256), torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.Tanh(),
...                           torch.nn.Linear(256, 256), torch.nn.Tanh()), torch.nn.Linear(256, 1))
>>> x = torch.randn(64, 8)
>>> with layerprof.LayerProf(net, metrics=("memory",)) as prof:
...     for _ in range(2):  # memory in the first step, clean times from the second
...         net(x).sum().backward()
...         prof.step()
>>> plan = prof.checkpoint_plan(0.75)
>>> plan.modules, plan.saved_bytes_before, plan.saved_bytes_after <= plan.budget_bytes
(['1[0:3]'], 198656, True)
>>> with plan.applied(net):
...     net(x).sum().backward()
"""
from __future__ import annotations

import contextlib
import copy
import math
from collections import Counter
from dataclasses import dataclass
from itertools import starmap
from typing import Any, Callable, Iterator

from torch import nn
from torch.nn.modules.batchnorm import _NormBase
from torch.nn.utils.prune import BasePruningMethod

from .._check import check_bool, check_int
from .._gc import gc_paused
from .._torch import compiled_module_type, global_forward_hooks
from .._warn import warn_user
from ..metrics.checkpoint_bytes import STORAGES_ATTRIBUTE, saved_after, saved_peak
from ..metrics.memory import TIMELINE_ATTRIBUTE
from ..record.records import CallTiming, ModuleRecord, preorder
from ..render.checkpoint import plan_text, wrapped_count
from ..render.units import format_counted
from .apply import is_wrapped, unwrap, wrap, wrap_runs
from .budget import parse_budget
from .candidates import Candidate, Priced, candidates, descendant_calls, require_figures
from .cast_cost import cast_cost
from .gaps import gap_savings
from .peak import PeakModel, PeakPrediction, step_peak
from .peak_budget import choose_under_peak
from .profiled_as import FirstCall
from .runs import RunOption, parse_run, run_options
from .structure import structure_differs
from .wrap_cost import WrapCost, check_wrap_cost
from .solver import DEFAULT_RESOLUTION, Run, best_reachable, ends_of, frontier, iter_frontier, solve

__all__ = ["CheckpointPlan", "ChosenModule", "FrontierPoint", "make_plan", "outermost_recomputed", "require_step_peak"]

# ``verify.py``'s ``verify_plan``, put here as that module loads (``layerprof`` loads it): it profiles the step
# with the collector, which reaches this module through the profile, so this module cannot import it.
VERIFIER: list[Callable[..., Any]] = []
_UNKNOWN_PEAK = 2**63 - 1  # a plan whose step peak cannot be predicted: never within a peak budget


def _no_grad_calls(root: ModuleRecord) -> int:
    """The root's calls in the memory meter's step made with gradients off."""
    return getattr(root, "checkpoint_no_grad_calls", None) or 0


def _trained_after_first(root: ModuleRecord) -> bool:
    """Whether steps after the memory meter's (the first profiled) were timed, or its calls were all made with
    gradients off: an evaluation pass first, training after it."""
    return (root.steps or 0) > 1 or _no_grad_calls(root) >= (root.calls or 0) > 0


def _gradients_on_only(root: ModuleRecord) -> bool:
    """Whether the memory meter's step called the model with gradients on only (no call under no_grad). Unknown (an
    older file without the count): False."""
    no_grad = getattr(root, "checkpoint_no_grad_calls", None)
    return no_grad == 0 and bool(root.calls)


def _for_side_effects(candidate: Candidate) -> bool:
    """Whether the candidate is excluded only because recomputing it has side effects (allow_side_effects)."""
    return candidate.excluded is not None and candidate.excluded.startswith("side effects")


def outermost_recomputed(root: ModuleRecord) -> list[str]:
    """The modules the model itself recomputes in backward (its own checkpointing), the outermost of each nest,
    in pre-order. A module counts where its own call was re-run; or, not re-run itself, where it is not the root and
    its two or more called children re-ran as one forward (``_rerun_together``): Hugging Face's
    ``GradientCheckpointingLayer`` checkpoints the layer's ``forward`` (transformers 5.24; 5.17 its ``__call__``),
    so the layer's hooks run once and its children's again (``collect/recompute.py``). A parent of a single re-run
    child is not told apart from a module that merely calls a checkpointed one: the child is named."""
    found: list[str] = []
    stack = [root]
    while stack:
        record = stack.pop()
        if record.calls and not record.recompute_ms:
            continue  # nothing below it was re-run (an uncalled container holds no sum: look into it)
        if _rerun(record):
            found.append(record.name)
            continue
        called = _called_below(record)
        if record is not root and record.calls and len(called) > 1 and _rerun_together(called):
            found.append(record.name)
            continue
        stack.extend(reversed(record.children))
    return found


def _own_calls(record: ModuleRecord) -> list[CallTiming]:
    """The record's calls in the last recorded step; where it skipped that step (an auxiliary head run every other
    step), on a live profile, those of the last step it ran in, which say whether the model re-ran it itself."""
    return record.call_times or list(starmap(CallTiming, record.__dict__.get("_earlier_timings", ())))


def _rerun(record: ModuleRecord) -> bool:
    """Whether one of the record's own calls ran again in backward."""
    return bool(record.recompute_ms) and any(timing.recompute for timing in _own_calls(record))


def _rerun_together(called: list[ModuleRecord]) -> bool:
    """Whether the modules of ``called`` (a parent's called children) all ran again in backward as one recomputed
    forward: the first of them to re-run in a step is the first that ran forward there. A checkpointed forward
    re-runs its children in their order; children checkpointed each by itself (an encoder's layers) re-run last
    first, as backward reaches each, and only they were recomputed, not their parent."""
    if not all(map(_rerun, called)):
        return False
    # Compared in one step: the one most of them re-ran in (the latest of those). A module that skipped the last
    # step reads an earlier one's calls (``_own_calls``), where it can stand alone: first both ways, which says
    # nothing (an encoder whose layers are checkpointed one by one, one dropped in the last step).
    steps = [{timing.step for timing in _own_calls(record) if timing.recompute} for record in called]
    counted = Counter(step for found in steps for step in found)
    step, together = max(counted.items(), key=lambda item: (item[1], item[0]))
    if together < 2:
        return False
    compared = [record for record, found in zip(called, steps) if step in found]

    def first(recompute: bool) -> ModuleRecord:
        return min(compared, key=lambda record: min(
            (timing.forward_start_ms for timing in _own_calls(record)
             if timing.step == step and timing.recompute == recompute), default=float("inf")))

    return first(False) is first(True)


def _split(chosen: list[Candidate | RunOption]) -> tuple[set[str], list[RunOption]]:
    """A plan's choices as the names of the modules it wraps and the runs it wraps."""
    return {o.name for o in chosen if isinstance(o, Candidate)}, [o for o in chosen if isinstance(o, RunOption)]


def _run_named(at: str | None, runs: list[RunOption]) -> str | None:
    """``at`` as the plan names it: a run is found by its first child, which the plan does not wrap by itself, and
    named as the run."""
    if at is None:
        return None
    return next((run.name for run in runs if run.children[0] == at), at)


def _called_below(record: ModuleRecord) -> list[ModuleRecord]:
    """The modules ``record`` calls directly: its called children, and those of children never called (a
    ModuleList iterated in its forward)."""
    found: list[ModuleRecord] = []
    for child in record.children:
        if child.calls:
            found.append(child)
        else:
            found.extend(_called_below(child))
    return found


# The most options (modules and runs) ``_cheapest_fitting`` walks the frontier for: each point it reads walks the
# table, about 90 ns an option (9,901 Linear layers in 1,100 Sequentials, with their 29,700 runs: 3.5 ms a point,
# 6 s over the 1,752 points below the plan). DenseNet-121, the case it is for, has about 500.
_FITTING_OPTIONS = 4_000

# Wrappers that hold the model as an attribute, which prefixes its modules' names: DistributedDataParallel and
# DataParallel (``module``), torch.compile's OptimizedModule (``_orig_mod``), and PEFT's PeftModel
# (``get_peft_model``: ``base_model``, a LoraModel or another tuner, holds the model as ``model``).
_WRAPPER_ATTRIBUTES = ("module", "_orig_mod", "base_model.model")


def _held_at(model: nn.Module, attribute: str) -> nn.Module | None:
    """The module ``model`` holds at the dotted ``attribute``, None where it holds none there."""
    for part in attribute.split("."):
        found = model._modules.get(part)
        if not isinstance(found, nn.Module):
            return None
        model = found
    return model


def _resolves(model: nn.Module, name: str) -> bool:
    """Whether a plan's module or run name names a module of ``model``."""
    run = parse_run(name)
    try:
        model.get_submodule(name if run is None else run[0])
    except AttributeError:
        return False
    return True


def _unprefixed(name: str, attribute: str) -> str | None:
    """``name`` as the model a wrapper holds under ``attribute`` names it ("module.1" -> "1", "module[0:2]" ->
    "[0:2]", "module" -> ""), None where ``name`` is not below it."""
    if name == attribute:
        return ""
    if name.startswith(attribute + "."):
        return name[len(attribute) + 1:]
    return name[len(attribute):] if name.startswith(attribute + "[") else None


def _a(word: str) -> str:
    """The article before ``word``: "an OptimizedModule", "a Sequential"."""
    return "an" if word[:1].lower() in "aeiou" else "a"


# Torch's own forward pre-hooks that compute a weight from its parts before each call (the older weight_norm and
# spectral_norm, and torch.nn.utils.prune's masks): re-running them is the recomputation itself (spectral norm's
# buffer updates count as side effects).
_WEIGHT_HOOKS = ("WeightNorm", "SpectralNorm")


def _computes_a_weight(hook: Any) -> bool:
    return type(hook).__name__ in _WEIGHT_HOOKS or isinstance(hook, BasePruningMethod)


# The forward hook Hugging Face's gradient_checkpointing_enable() (enable_input_require_grads) and PEFT put on the
# input embeddings: ``output.requires_grad_(True)``, the same again in a recomputation.
_REQUIRE_GRADS_HOOKS = ("make_inputs_require_grads", "make_inputs_require_grad")


def _runs_again_safely(hook: Any) -> bool:
    """A forward hook that may run again in a recomputation: one that computes a weight, one of
    torch.distributed's (FSDP2's pre- and post-forward hooks, which gather the parameters again for it), or
    Hugging Face's (or PEFT's) that makes the embeddings' output require grad."""
    source = str(getattr(hook, "__module__", None) or "")
    return _computes_a_weight(hook) or source.startswith("torch.distributed.") or (
        getattr(hook, "__name__", None) in _REQUIRE_GRADS_HOOKS and source.startswith(("transformers.", "peft.")))


def _regions(modules: dict[str, nn.Module], sequentials: dict[int, tuple[nn.Module, dict[tuple[int, int], str]]]
             ) -> list[tuple[str, nn.Module, bool]]:
    """The regions to wrap as ``(name, module, called_inside)``: each wrapped module, and each child of a wrapped run.
    ``called_inside``: the module is called inside its checkpoint, so its own hooks run again in backward (a run's
    children); a wrapped module's own hooks run in its ``__call__``, outside (its forward is what is wrapped)."""
    regions = [(name, module, False) for name, module in modules.items()]
    for sequential, runs in sequentials.values():
        for (first, stop), name in runs.items():
            parent = parse_run(name)[0]
            regions.extend((f"{parent}.{i}" if parent else str(i), sequential[i], True) for i in range(first, stop))
    return regions


def _shown(names: list[str]) -> str:
    shown = ", ".join(repr(name) for name in names[:5])
    return shown + (f" and {len(names) - 5} more" if len(names) > 5 else "")


def _warn_rerun(modules: dict[str, nn.Module], sequentials: dict[int, tuple[nn.Module, dict[tuple[int, int], str]]],
                side_effects_allowed: bool) -> None:
    """Warn where what runs again in backward does something twice a step: forward hooks of modules called inside
    the regions to wrap (a checkpoint re-runs the forward, hooks and all), and, unless the plan allows side effects,
    modules keeping running statistics (BatchNorm) that the profiled step did not update (it ran in eval mode),
    so the plan did not exclude them, and that a step in training mode updates a second time as they re-run."""
    hooked: list[str] = []
    statistics: list[str] = []
    # Hooks registered for every module (register_module_forward_hook) run for the modules inside too.
    everywhere = [hook for hook in global_forward_hooks() if not _runs_again_safely(hook)]
    for name, region, called_inside in _regions(modules, sequentials):
        for inner, module in region.named_modules(prefix=name):
            hooks = [*module._forward_hooks.values(), *module._forward_pre_hooks.values()]
            if (called_inside or module is not region) and (
                    everywhere or any(not _runs_again_safely(hook) for hook in hooks)):
                hooked.append(inner)
            if isinstance(module, _NormBase) and module.track_running_stats:
                statistics.append(inner)
    if hooked:
        warn_user(
            f"the plan wraps modules that carry forward hooks ({_shown(hooked)}"
            f"{'; hooks registered for every module among them' if everywhere else ''}): a checkpoint runs their "
            "forward again in backward, hooks included, so those hooks can run twice a step (a list a hook appends to "
            "grows twice); take the hooks off, or have them do nothing in the re-run, which runs during backward",
            UserWarning)
    if statistics and not side_effects_allowed:
        warn_user(
            f"the plan wraps modules that keep running statistics ({_shown(statistics)}), which the profiled step did "
            "not update (the model ran in eval mode, or their statistics were frozen), so the plan did not exclude "
            "them: in a step in training mode their forward runs again in backward and updates the statistics a "
            "second time. Plan on a profile of a step in the mode you train in (model.train()), which excludes them, "
            "or make the plan with allow_side_effects=True to wrap them knowingly",
            UserWarning)


def _wrapper_hint(model: nn.Module, names: list[str]) -> str:
    """Where a plan's names do not resolve on ``model`` for a wrapper between them: the plan made for the model a
    ``DistributedDataParallel`` (or ``torch.compile``) wraps and applied to the wrapper, or made for the wrapper
    (names that start with ``module.``) and applied to the model inside. "" where neither explains it."""
    for attribute in _WRAPPER_ATTRIBUTES:
        inner = _held_at(model, attribute)
        if inner is not None and all(_resolves(inner, name) for name in names):
            return (f"; the plan was made for the model this {type(model).__name__} wraps: apply it to "
                    f"model.{attribute}")
        inside = [_unprefixed(name, attribute) for name in names]
        if all(name is not None and _resolves(model, name) for name in inside):
            wrappers = ("those of a PEFT model (get_peft_model) do" if attribute == "base_model.model" else
                        "those of a DistributedDataParallel or a compiled model do")
            return (f"; the plan was made for a model that wraps this one (its names start with {attribute!r}, as "
                    f"{wrappers}): apply it to that wrapper, or plan on a profile of this "
                    f"{type(model).__name__} itself")
    compiled = _compiled_on_path(model, names)
    if compiled:
        return (f"; {compiled!r} of this model was compiled since the profile (model.{compiled} = "
                f"torch.compile(...) puts an OptimizedModule in its place): apply the plan before compiling, or "
                f"compile in place with model.{compiled}.compile(), which keeps the module")
    return ""


def _eager_names(model: nn.Module) -> list[str]:
    """The qualified names of ``model``'s modules, those under a submodule compiled since the profile
    (``parent.child = torch.compile(child)`` puts an OptimizedModule there, the module under its ``_orig_mod``) read
    as they were: compiling after profiling is what the docs advise, and it leaves the structure as profiled."""
    compiled_type = compiled_module_type()
    found = list(model.named_modules())
    compiled = {name for name, module in found if compiled_type is not None and isinstance(module, compiled_type)}
    if not compiled:
        return [name for name, _ in found]
    names = []
    for name, _ in found:
        parts = name.split(".")
        names.append(".".join(part for at, part in enumerate(parts)
                              if part != "_orig_mod" or ".".join(parts[:at]) not in compiled))
    return names


def _compiled_on_path(model: nn.Module, names: list[str]) -> str | None:
    """The name of a submodule on the path of one of the plan's names that ``torch.compile`` replaced with its
    wrapper (whose only child is ``_orig_mod``), or None."""
    for name in names:
        run = parse_run(name)
        path = name if run is None else run[0]
        module: nn.Module | None = model
        walked: list[str] = []
        for part in [*(path.split(".") if path else []), None]:
            if walked and module is not None and "_orig_mod" in module._modules and part != "_orig_mod":
                return ".".join(walked)
            if part is None or module is None:
                break
            module = module._modules.get(part)
            walked.append(part)
    return None


@dataclass(frozen=True)
class ChosenModule(Priced):
    """Why a module is in the plan: the bytes wrapping it frees (net of the inputs it keeps), the forward time
    it re-runs in backward per step, and the checkpoint's own cost per step (``wrap_ms``: each call priced by the
    other work between it and the last wrapped call, ``gaps.py``; ``cold_wrap_ms``: every call priced cold, as
    the knapsack chose it)."""

    name: str
    type: str
    freed_bytes: int
    kept_bytes: int
    recompute_ms: float
    wrap_ms: float = 0.0
    run: int = 0  # for a run of a Sequential's children (``parent[first:stop]``): how many; 0 for a module
    cold_wrap_ms: float = 0.0

    @property
    def bytes_per_ms(self) -> float:
        return self.net_bytes / self.cost_ms if self.cost_ms > 0 else float("inf")


@dataclass(frozen=True)
class FrontierPoint:
    """One Pareto-optimal plan: saved bytes left, extra forward time per step, the modules wrapped, and the step's
    peak predicted with it (None where the profile cannot predict it: see ``CheckpointPlan``)."""

    saved_bytes: int
    extra_ms: float
    modules: tuple[str, ...]
    predicted_peak_bytes: int | None = None


class CheckpointPlan:
    """The result of ``Profile.checkpoint_plan``. Numbers are per step as profiled.

    Attributes: ``modules`` (qualified names to wrap, and runs ``parent[first:stop]`` of an nn.Sequential's
    children, no two nested), ``chosen`` (a ChosenModule for each),
    ``budget_bytes``, ``saved_bytes_before`` (today), ``saved_bytes_after`` (predicted), ``extra_ms`` (predicted
    extra time per step: the recomputed forwards and the wrappers' own cost, each wrapper call priced by the other
    work between it and the last wrapped call), ``cold_extra_ms`` (the same with every wrapper call priced cold:
    what the knapsack minimised, additive, an upper bound of ``extra_ms``), ``wrap_cost`` (the WrapCost that
    priced the wrappers, None if not counted), ``hook_ms`` (the profiler's own time per module call taken off each
    ancestor's recompute time: on the CPU wall clock from its forward, on CUDA events from the host's time of it,
    ``candidates.less_hooks``; 0 where it was not measured, as under ``sync=True``), ``feasible`` (whether the
    budget is met), ``least_reachable_bytes`` (the least
    saved memory any plan reaches), ``reachable_allowing_side_effects`` (where the budget is out of reach and
    allowing side effects would reach less: that least, else None), ``excluded`` (module -> why it may not be
    wrapped), ``note``, ``already_recomputed`` (the outermost modules the model recomputes in backward itself,
    such as Hugging Face's gradient checkpointing: today's saved memory is with that, and a wrapper around one of
    them nests checkpoints), ``saved_peak_bytes`` (the most bytes held for backward at once in a step with the plan:
    at the end of forward, ``saved_bytes_after``, or when backward recomputes a wrapped call, which saves its
    region's tensors again while the calls before it still hold theirs; None on a profile without storages, one
    loaded from a file) and ``saved_peak_at`` (the wrapped module or run where it is reached, None at the end of
    forward). Where it comes to about ``saved_bytes_before`` (one wrapper around a whole encoder), the plan does
    not lower the step's peak: its text says so. The step's peak itself, where the memory meter read the step's
    device (CUDA, or the CPU with ``metrics=("live_memory",)``; else None): ``profiled_peak_bytes`` (measured in the
    profiled step) and ``predicted_peak_bytes`` (with the plan, ``peak.py``), reached in ``predicted_peak_phase``
    (``"forward"``, ``"backward"``, ``"recompute"`` or ``"between calls"``) at ``predicted_peak_at`` (the module
    whose backward or recomputation holds it, else None). ``profiled_as``: the profiled model's mode and dtype
    (``{"training": bool, "dtype": "float32"}``, None for either a profile does not hold): the first wrapped call
    of a step after ``apply`` warns where the model then differs, since what its modules save does
    (``profiled_as.py``).

    A plan made against the step's peak (``checkpoint_plan(peak=...)``, ``peak_budget.py``) has ``budget_kind``
    ``"peak"`` (else ``"saved"``), ``peak_budget_bytes`` (else None) and ``budget_bytes`` None; ``feasible`` says
    whether a plan weighed predicts a peak within it, ``plans_weighed`` how many were, and
    ``least_reachable_peak_bytes`` and ``least_peak_modules`` the least predicted peak of those and the modules
    and runs that reach it (the profiled peak and None where the budget is not below it).
    """

    def __init__(self, root: ModuleRecord, found: list[Candidate], budget_bytes: int | None, resolution: int,
                 wrap_cost: WrapCost | None = None, hook_ms: float = 0.0, runs: list[RunOption] | None = None,
                 peak_budget_bytes: int | None = None) -> None:
        self.model_type = root.type
        self.side_effects_allowed = False  # (``make_plan`` sets what it was given)
        self.profiled_as: dict[str, Any] = {}  # (and this)
        self.wrap_cost = wrap_cost
        self.hook_ms = hook_ms
        self.budget_bytes = budget_bytes
        self.peak_budget_bytes = peak_budget_bytes
        self.budget_kind = "saved" if peak_budget_bytes is None else "peak"
        self.saved_bytes_before = saved_today(root)
        self.already_recomputed = outermost_recomputed(root)
        self.excluded = {c.name: c.excluded for c in found if c.excluded and c.excluded not in ("not called",
                                                                                                 "frees nothing")}
        # Modules whose profiler time taken off (hooks, the live reader) exceeds the forward it came from, and of
        # how many timed: see ``host_figures_high``.
        timed = [c for c in found if c.deducted_share is not None]
        self.over_deducted = [c.name for c in timed if c.deducted_share > 1.0]  # type: ignore[operator]
        self.timed_modules = len(timed)
        self._found = found
        self._resolution = resolution
        self._weights = [0 if c.excluded else max(0, c.net_bytes) for c in found]
        self._costs = [c.cost_ms for c in found]
        self._ends = ends_of([c.parent for c in found])
        self._runs = list(runs or ())
        self._options = [Run(r.start, r.jump, max(0, r.net_bytes), r.cost_ms) for r in self._runs]
        # The storages of the profiled step, on a live profile: what wrapping a set frees, exactly (else the
        # additive figure, which errs high where wrapped siblings share inputs).
        self._tables = root.__dict__.get(STORAGES_ATTRIBUTE)
        # Chosen options -> saved_after of them, while the plan is made (None after).
        self._replayed: dict[tuple[int, ...], int] | None = {}
        self._timeline = timeline = root.__dict__.get(TIMELINE_ATTRIBUTE)
        self._peak_model = PeakModel(self._tables, timeline) if self._tables and timeline is not None else None
        reachable, most = best_reachable(self._weights, self._ends, self._options)
        self.least_reachable_bytes = self._saved_after(most, reachable)
        self.least_reachable_peak_bytes: int | None = None
        self.least_peak_modules: list[str] | None = None
        self.plans_weighed = 0
        self.note: str | None = None
        if budget_bytes is None:
            assert peak_budget_bytes is not None
            solution, self.note = self._under_peak(peak_budget_bytes)
            out_of_reach = False
        else:
            need = self.saved_bytes_before - budget_bytes
            solution = solve(self._weights, self._costs, self._ends, need, resolution, self._options)
            if self._tables and need > 0:
                if solution is not None:
                    solution = self._cheaper_within(solution, need, budget_bytes)
                solution = self._cheapest_fitting(solution, budget_bytes)
            # Out of reach because modules with side effects are excluded: what allowing them reaches (else None).
            out_of_reach = solution is None and need > 0 and self.saved_bytes_before > 0
        self.feasible = solution is not None
        self.reachable_allowing_side_effects = self._allowing_side_effects(found) if out_of_reach else None
        if self.saved_bytes_before == 0 and root.backward_ms and _gradients_on_only(root):
            # Gradients on and a backward, yet nothing saved: not an evaluation step, whatever the step count says.
            self.note = ("the profiled step ran its forward with gradients on and a backward, yet saved nothing for "
                         "it (were its tensors empty, a batch of 0, or did its ops keep nothing but parameters?): "
                         "nothing to wrap")
        elif self.saved_bytes_before == 0 and root.backward_ms and _trained_after_first(root):
            # The memory meter counts the first profiled step; later ones ran backward (an evaluation pass first).
            # Those are the timed steps (root.steps), the meter's left out: 2 steps profiled hold steps == 1, the
            # meter's step then told apart by its calls, all made with gradients off.
            self.note = ("the memory meter's step (the first profiled) saved nothing for backward, though later "
                         "steps ran backward: was it an evaluation step, under torch.no_grad? Profile a training "
                         "step first: nothing to wrap")
        elif self.saved_bytes_before == 0 and _gradients_on_only(root):  # (no backward: nothing required grad)
            self.note = ("the profiled step saved nothing for backward: the model ran with gradients on, but nothing "
                         "in it required grad (its parameters frozen with requires_grad_(False), its inputs not "
                         "requiring grad: a frozen backbone under a head that trains), so autograd held nothing there "
                         "and no checkpoint frees anything: nothing to wrap")
        elif self.saved_bytes_before == 0:
            self.note = ("the profiled step saved nothing for backward (was its forward run under torch.no_grad or "
                         "inference_mode?): nothing to wrap")
        elif budget_bytes is None:
            pass  # the peak budget's note, above
        elif need <= 0:
            self.note = (f"the budget ({budget_bytes} bytes) is not below today's saved memory "
                         f"({self.saved_bytes_before} bytes): nothing to wrap")
        elif out_of_reach:
            hint = ""
            if self.reachable_allowing_side_effects is not None:
                held = sum(1 for c in found if _for_side_effects(c))
                hint = (f"; with allow_side_effects=True ({format_counted(held, 'module')} excluded for side effects "
                        f"on recompute, such as BatchNorm's running statistics) a plan reaches "
                        f"{self.reachable_allowing_side_effects} bytes")
            caches = sum(1 for c in found if c.excluded is not None and c.excluded.startswith("updates a key/value"))
            if caches:  # not allowed: the model is to be run without its cache
                hint += (f"; {format_counted(caches, 'module')} updating a key/value cache they are handed are "
                         "excluded: profile with use_cache=False (as gradient_checkpointing_enable() sets it) to "
                         "let a plan wrap them")
            self.note = (f"the budget ({budget_bytes} bytes) cannot be met: the least saved memory any plan "
                         f"reaches is {self.least_reachable_bytes} bytes{hint}. Plan for that or more")
        chosen = [self._option(i) for i in (solution.chosen if solution is not None else ())]
        records = preorder(root)
        # On CUDA events (records with the host's forward beside) the gaps are the GPU's time, which holds the
        # hooks only where it waited on the host: none taken off there, as before the host's time was recorded.
        on_events = any(getattr(r, "host_forward_ms", None) is not None for r in records)
        saving = {} if wrap_cost is None else gap_savings({r.name: r for r in records}, [o.name for o in chosen],
                                                          wrap_cost, 0.0 if on_events else hook_ms)
        self.chosen = [ChosenModule(o.name, "Sequential" if isinstance(o, RunOption) else o.type, o.freed_bytes,
                                    o.kept_bytes, o.recompute_ms, max(0.0, o.wrap_ms - saving.get(o.name, 0.0)),
                                    len(o.children) if isinstance(o, RunOption) else 0, o.wrap_ms)
                       for o in chosen]
        self.modules = [c.name for c in self.chosen]
        self._module_names = [r.name for r in records]  # the profiled model's, checked as the plan applies
        self.saved_bytes_after = self._saved_after(solution.chosen if solution is not None else (),
                                                   sum(c.net_bytes for c in self.chosen))
        self.saved_peak_bytes, self.saved_peak_at = None, None
        wrapped, runs = _split(chosen)
        if self._tables:
            self.saved_peak_bytes, at = saved_peak(self._tables, wrapped, [o.children for o in runs])
            self.saved_peak_at = _run_named(at, runs)
        self._predict_peak(root, wrapped, runs)
        self.extra_ms = float(sum(c.cost_ms for c in self.chosen))
        self.cold_extra_ms = float(sum(c.recompute_ms + c.cold_wrap_ms for c in self.chosen))
        self._applied: list[tuple[nn.Module, Any]] = []
        self._replayed = None  # (not kept for the frontier: its thousands of points are replayed once each)

    def _predict_peak(self, root: ModuleRecord, wrapped: set[str], runs: list[RunOption]) -> None:
        """The step's peak measured in the profile and predicted with the plan (``peak.py``), where the memory
        meter's reader covered the step's device."""
        self.profiled_peak_bytes = self.predicted_peak_bytes = None
        self.predicted_peak_phase = self.predicted_peak_at = None
        if self._peak_model is None:
            return
        prediction = self._peak_model.predict(wrapped, [o.children for o in runs])
        if prediction is None:
            return
        self.profiled_peak_bytes = step_peak(self._timeline)
        self.predicted_peak_bytes, self.predicted_peak_phase = prediction.peak_bytes, prediction.phase
        self.predicted_peak_at = _run_named(prediction.at, runs)

    def _peak_of(self, chosen: tuple[int, ...]) -> PeakPrediction:
        """The predicted step peak of a choice of options (unknown, read as no fit: a wrapped call on another
        device)."""
        assert self._peak_model is not None
        wrapped, runs = _split([self._option(i) for i in chosen])
        found = self._peak_model.predict(wrapped, [o.children for o in runs])
        return found if found is not None else PeakPrediction(_UNKNOWN_PEAK, "unknown", None)

    def _known_peak(self, chosen: tuple[int, ...]) -> int | None:
        if self._peak_model is None:
            return None
        found = self._peak_of(chosen).peak_bytes
        return None if found == _UNKNOWN_PEAK else found

    def _under_peak(self, peak_budget: int) -> tuple[Any, str | None]:
        """The cheapest plan weighed (``peak_budget.py``) whose predicted step peak is at most ``peak_budget``, or
        None; and the note to give (the budget is not below today's peak, or no plan weighed reaches it)."""
        model = self._peak_model
        assert model is not None
        profiled = step_peak(self._timeline)
        if peak_budget >= profiled:
            self.least_reachable_peak_bytes = profiled
            return solve(self._weights, self._costs, self._ends, 0), (
                f"the peak budget ({peak_budget} bytes) is not below the profiled step's peak ({profiled} bytes): "
                "nothing to wrap")
        def held_across(interval: int) -> list[bool]:
            names = model.held_across(interval)
            return [c.name in names for c in self._found] + [run.children[-1] in names for run in self._runs]

        inside = model.saved_inside()
        bounds = ([inside.get(c.name, 0.0) for c in self._found] +
                  [sum(inside.get(name, 0.0) for name in run.children) for run in self._runs])
        choice = choose_under_peak(self._weights, self._costs, self._ends, self._options, self._resolution,
                                   peak_budget, self._peak_of, held_across, model.profiled_interval(), profiled,
                                   bounds)
        self.plans_weighed = choice.considered
        self.least_reachable_peak_bytes = choice.lowest_peak.peak_bytes
        self.least_peak_modules = [self._option(i).name for i in choice.lowest.chosen]
        if choice.chosen is not None:
            return choice.chosen, None
        if not choice.lowest.chosen:
            return None, (f"the peak budget ({peak_budget} bytes) cannot be met: none of the {choice.considered} plans "
                          f"weighed lowers the step's peak below today's ({profiled} bytes)")
        stopped = "" if choice.complete else f" (the walk stopped at MAX_WEIGHED, {choice.considered} predictions)"
        return None, (f"the peak budget ({peak_budget} bytes) cannot be met: the least predicted step peak of the "
                      f"{choice.considered} plans weighed is {choice.lowest_peak.peak_bytes} bytes, wrapping "
                      f"{format_counted(len(self.least_peak_modules), 'module')} (plan.least_peak_modules names them)"
                      f"{stopped}")

    def _allowing_side_effects(self, found: list[Candidate]) -> int | None:
        """The least saved memory a plan reaches with the modules excluded for side effects allowed, where that is
        less than without them; else None."""
        held = [_for_side_effects(c) for c in found]
        if not any(held):
            return None
        weights = [max(0, c.net_bytes) if hold else weight for c, hold, weight in zip(found, held, self._weights)]
        reachable, most = best_reachable(weights, self._ends, self._options)
        allowed = self._saved_after(most, reachable)
        return allowed if allowed < self.least_reachable_bytes else None

    def _option(self, number: int) -> Candidate | RunOption:
        """A solution's option: a module's candidate, or a run (numbered after the modules)."""
        count = len(self._found)
        return self._found[number] if number < count else self._runs[number - count]

    def _saved_after(self, chosen: tuple[int, ...], freed: int) -> int:
        if self._tables:
            # A plan made cheaper within the budget is replayed again at the end.
            found = None if self._replayed is None else self._replayed.get(chosen)
            if found is None:
                options = [self._option(i) for i in chosen]
                found = saved_after(self._tables, {o.name for o in options if isinstance(o, Candidate)},
                                    [o.children for o in options if isinstance(o, RunOption)])
                if self._replayed is not None:
                    self._replayed[chosen] = found
            return found
        return self.saved_bytes_before - freed

    def _cheaper_within(self, solution: Any, need: int, budget_bytes: int) -> Any:
        """The additive model frees less than wrapping does where wrapped siblings share inputs: while the exact
        figure leaves room under the budget, solve again for less and keep a cheaper plan that still fits."""
        for _ in range(8):
            room = budget_bytes - self._saved_after(solution.chosen, solution.freed)
            if room <= 0:
                break
            need -= room
            trial = solve(self._weights, self._costs, self._ends, need, self._resolution, self._options)
            if trial is None or trial.cost >= solution.cost or self._saved_after(trial.chosen, trial.freed) > budget_bytes:
                break
            solution = trial
        return solution

    def _cheapest_fitting(self, solution: Any, budget_bytes: int) -> Any:
        """The cheapest point of the frontier (``pareto()``) whose exact saved bytes fit the budget, where it costs
        less than ``solution`` (or ``solution`` is None). The knapsack weighs its options additively, which frees
        less than wrapping does where wrapped siblings share inputs (DenseNet's layers), and solving again for less
        (``_cheaper_within``) stops at the first level that does not pay: without this a frontier point could meet
        the budget for less than the plan, as ``pareto()`` and the frontier plot then showed. Not on a tree of more
        than ``_FITTING_OPTIONS`` options, where reading the frontier would cost seconds: the plan stands."""
        if len(self._found) + len(self._runs) > _FITTING_OPTIONS:
            return solution
        bound = math.inf if solution is None else solution.cost
        # What a choice frees is at most its options' freed bytes (the inputs it keeps only take from that): a point
        # that cannot fit by that is passed over without replaying the step.
        freed = [o.freed_bytes for o in self._found] + [o.freed_bytes for o in self._runs]
        most = self.saved_bytes_before - budget_bytes
        for point in iter_frontier(self._weights, self._costs, self._ends, self._resolution, self._options):
            if point.cost >= bound:
                break  # cheapest first: none after it costs less
            if (sum(freed[i] for i in point.chosen) >= most
                    and self._saved_after(point.chosen, point.freed) <= budget_bytes):
                return point
        return solution

    # -- the frontier ----------------------------------------------------------------------------------------
    def pareto(self) -> list[FrontierPoint]:
        """Every Pareto-optimal plan, from wrapping nothing (today) to the least saved memory reachable: saved
        bytes left against extra time per step, least memory last. The times are the knapsack's, every wrapper
        call priced cold (upper bounds; the chosen plan's ``cold_extra_ms`` is its point)."""
        points = [
            FrontierPoint(self._saved_after(s.chosen, s.freed), s.cost, tuple(self._option(i).name for i in s.chosen),
                          self._known_peak(s.chosen))
            for s in frontier(self._weights, self._costs, self._ends, self._resolution, self._options)
        ]
        kept: list[FrontierPoint] = []
        for point in points:  # the exact figures can make a costlier point no better: drop it
            if not kept or point.saved_bytes < kept[-1].saved_bytes:
                kept.append(point)
        return kept

    # -- applying --------------------------------------------------------------------------------------------
    def _resolve(self, model: nn.Module
                 ) -> tuple[dict[str, nn.Module], dict[int, tuple[nn.Module, dict[tuple[int, int], str]]]]:
        """The modules to wrap by name, and the Sequentials with the runs to wrap in each: (first, stop) -> name."""
        if not isinstance(model, nn.Module):
            raise TypeError(f"apply takes the nn.Module the plan was made for, got {type(model).__name__}")
        modules: dict[str, nn.Module] = {}
        sequentials: dict[int, tuple[nn.Module, dict[tuple[int, int], str]]] = {}
        types = {c.name: c.type for c in self.chosen}
        for name in self.modules:
            run = parse_run(name)
            try:
                module = model.get_submodule(name if run is None else run[0])
            except AttributeError:
                raise ValueError(
                    f"model: the plan wraps module {name!r}, which this {type(model).__name__} does not have; apply "
                    f"the plan to the model it was made for (a {self.model_type}){_wrapper_hint(model, self.modules)}"
                ) from None
            if type(module).__name__ != types[name]:
                shown = f"module {name!r}" if run is None else (
                    f"the parent {run[0]!r} of run {name!r}" if run[0] else f"the model, parent of run {name!r},")
                found = type(module).__name__
                raise ValueError(
                    f"model: {shown} is {_a(found)} {found}, the plan was made for {_a(types[name])} {types[name]}; "
                    f"apply the plan to the model it was made for (a {self.model_type})"
                    f"{_wrapper_hint(model, self.modules)}"
                )
            if is_wrapped(module):
                # Another plan applied to this model, or a copy of a model made or pickled while a plan was applied
                # (``_Wrapper.__deepcopy__``), which keeps its wrappers and has no plan to remove() them.
                raise ValueError(
                    f"model: module {name!r} is already wrapped by a checkpoint plan: remove() that plan first; a "
                    f"copy made or loaded while a plan was applied keeps its wrappers, and "
                    f"del model.get_submodule({(name if run is None else run[0])!r}).forward takes one off")
            if run is None:
                modules[name] = module
                continue
            if type(module) is not nn.Sequential or run[2] > len(module):
                raise ValueError(
                    f"model: the plan wraps the run {name!r} of an nn.Sequential, which {run[0]!r} of this model is "
                    f"not ({type(module).__name__} of {len(list(module.children()))} children); apply the plan to "
                    f"the model it was made for (a {self.model_type})")
            if "forward" in vars(module):
                # A run's wrapper is the Sequential's forward, which would drop this one (a module's keeps it).
                parent = f"the Sequential {run[0]!r}" if run[0] else "the model (a Sequential)"
                raise ValueError(
                    f"model: the plan wraps the run {name!r} of {parent}, whose instance has a forward of its own "
                    "(put there by another tool, such as accelerate's hooks, or by hand), which a run's wrapper "
                    "would replace: plan without runs (prof.checkpoint_plan(..., runs=False)), whose wrappers keep "
                    "a module's forward, or take that forward off first")
            sequentials.setdefault(id(module), (module, {}))[1][run[1:]] = name
        self._check_structure(model)
        return modules, sequentials

    def _check_structure(self, model: nn.Module) -> None:
        """Refuse a model whose modules under a wrapped one are not the profiled model's, and warn where others
        differ (``structure.py``). Plans from before the names were kept (unpickled) are not checked."""
        profiled = self.__dict__.get("_module_names")
        if profiled is None:
            return
        wrapped: dict[str, list[str]] = {}
        for name in self.modules:
            run = parse_run(name)
            if run is None:
                wrapped[name] = [name]
                continue
            # The run's children by their keys in the Sequential (indices, or the names of an OrderedDict's).
            prefix = f"{run[0]}." if run[0] else ""
            keys = list(model.get_submodule(run[0])._modules)[run[1]:run[2]]
            wrapped[name] = [f"{prefix}{key}" for key in keys]
        refusal, warning = structure_differs(profiled, _eager_names(model), wrapped)
        if refusal is not None:
            raise ValueError(refusal)
        if warning is not None:
            warn_user(warning, UserWarning)

    def __deepcopy__(self, memo: dict[int, Any]) -> CheckpointPlan:
        """A deep copy of an applied plan is applied to the copies of its modules made in the same deep copy (a
        model that keeps its plan, copied for an EMA: the copy's plan removes the copy's wrappers), and not
        applied where the plan is copied alone: its modules' copies would be orphans, and ``apply`` would refuse
        ("already applied"). (Copied after the model in one deep copy: a module keeps its own attributes after
        its submodules.) Pickled, a plan keeps what it wrapped, as copies: pickle it with its model, or remove() it
        first."""
        copied = type(self).__new__(type(self))
        memo[id(self)] = copied
        for key, value in self.__dict__.items():
            if key == "_applied":
                value = [entry for entry in value if id(entry[0]) in memo]
            copied.__dict__[key] = copy.deepcopy(value, memo)
        return copied

    def apply(self, model: nn.Module) -> CheckpointPlan:
        """Wrap the chosen modules of ``model`` in non-reentrant ``torch.utils.checkpoint`` (all or none);
        ``remove()`` undoes it."""
        if self._applied:
            raise RuntimeError("this plan is already applied; call remove() before applying it again")
        modules, sequentials = self._resolve(model)
        _warn_rerun(modules, sequentials, self.side_effects_allowed)
        # The model's mode and dtype, checked in the step (a trainer sets them after apply): none kept by an
        # unpickled older plan.
        first_call = FirstCall(model, self.__dict__.get("profiled_as"))
        try:
            for name, module in modules.items():
                self._applied.append((module, wrap(module, label=name, first_call=first_call)))
            for module, runs in sequentials.values():
                self._applied.append((module, wrap_runs(module, list(runs), labels=runs, first_call=first_call)))
        except BaseException:
            self.remove()
            raise
        return self

    def remove(self) -> None:
        """Take the wrapping off: the modules are exactly as before ``apply`` (a no-op when not applied). A forward
        another tool put over a wrapper while the plan was applied stays, with the wrapper inside it turned off (a
        warning says so)."""
        applied, self._applied = self._applied, []
        for module, own in reversed(applied):
            unwrap(module, own)

    @contextlib.contextmanager
    def applied(self, model: nn.Module) -> Iterator[nn.Module]:
        """``with plan.applied(model):`` the model with the plan applied inside the block, removed after."""
        self.apply(model)
        try:
            yield model
        finally:
            self.remove()

    @property
    def is_applied(self) -> bool:
        return bool(self._applied)

    def verify(self, model: nn.Module, step: Callable[[], Any], repeats: int = 5) -> Any:
        """``layerprof.verify_plan(plan, model, step, repeats)``: apply the plan to ``model``, measure ``step()``
        (a forward and backward) with and without it, take it off, and return the Verification, measured beside
        predicted (``print`` it for the text the command line prints)."""
        return VERIFIER[0](self, model, step, repeats)

    # -- reading ---------------------------------------------------------------------------------------------
    @property
    def host_figures_high(self) -> bool:
        """Whether the host figures taken off recomputations (``hook_ms``, ``meta["live_op_ms"]``) read high: at
        least 3 modules, and a tenth of those timed, lose more than their profiled forward to them. Measured right,
        the share stays below 1 (0.80-0.93 at most on the tests' zoo of live profiles); a figure read in a burst of
        load prices those recomputations at 0 ms."""
        over = len(self.over_deducted)
        return over >= 3 and over >= 0.1 * self.timed_modules

    def to_dict(self) -> dict[str, Any]:
        """The plan as plain numbers and names."""
        return {
            "modules": list(self.modules), "budget_kind": self.budget_kind, "budget_bytes": self.budget_bytes,
            "peak_budget_bytes": self.peak_budget_bytes, "least_reachable_peak_bytes": self.least_reachable_peak_bytes,
            "least_peak_modules": self.least_peak_modules, "plans_weighed": self.plans_weighed,
            "saved_bytes_before": self.saved_bytes_before, "saved_bytes_after": self.saved_bytes_after,
            "extra_ms": self.extra_ms, "cold_extra_ms": self.cold_extra_ms, "feasible": self.feasible,
            "least_reachable_bytes": self.least_reachable_bytes,
            "reachable_allowing_side_effects": self.reachable_allowing_side_effects,
            "chosen": [{"name": c.name, "type": c.type, "freed_bytes": c.freed_bytes, "kept_bytes": c.kept_bytes,
                        "net_bytes": c.net_bytes, "recompute_ms": c.recompute_ms, "wrap_ms": c.wrap_ms,
                        "cold_wrap_ms": c.cold_wrap_ms, "run": c.run}
                       for c in self.chosen],
            "excluded": dict(self.excluded), "note": self.note, "hook_ms": self.hook_ms,
            "over_deducted": list(self.over_deducted),
            "already_recomputed": list(self.already_recomputed),
            "saved_peak_bytes": self.saved_peak_bytes, "saved_peak_at": self.saved_peak_at,
            "profiled_peak_bytes": self.profiled_peak_bytes, "predicted_peak_bytes": self.predicted_peak_bytes,
            "predicted_peak_phase": self.predicted_peak_phase, "predicted_peak_at": self.predicted_peak_at,
        }

    def __str__(self) -> str:
        return plan_text(self)

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        # IPython shows a cell's last value by this: the plan's lines (what ``print`` gives), as a Verification
        # shows; repr keeps to one line.
        printer.text(str(self))

    def __repr__(self) -> str:
        if self.peak_budget_bytes is not None:
            return (f"<CheckpointPlan {self.model_type}: {wrapped_count(self.chosen)}, step peak "
                    f"{self.profiled_peak_bytes} -> {self.predicted_peak_bytes} bytes (peak budget "
                    f"{self.peak_budget_bytes}), +{self.extra_ms:.3f} ms>")
        return (f"<CheckpointPlan {self.model_type}: {wrapped_count(self.chosen)}, "
                f"saved {self.saved_bytes_before} -> "
                f"{self.saved_bytes_after} bytes (budget {self.budget_bytes}), +{self.extra_ms:.3f} ms>")


def make_plan(root: ModuleRecord, budget: Any = None, allow_side_effects: bool = False,
              resolution: int = DEFAULT_RESOLUTION, wrap_cost: Any = "measured", hook_ms: float = 0.0,
              runs: bool = True, peak: Any = None, op_ms: float = 0.0, profiled_as: dict[str, Any] | None = None
              ) -> CheckpointPlan:
    """The plan for a profile's tree; see ``Profile.checkpoint_plan``. ``hook_ms``: the profiler's own time in
    each ancestor's forward per module call (the profile's ``meta["hook_ms"]``), taken off recompute times;
    ``op_ms``: the live-bytes reader's per op (``meta["live_op_ms"]``), taken off with each module's op count.
    ``profiled_as``: the profile's mode and dtype (``profiled_as.py``), compared with the model's in its step."""
    if (budget is None) == (peak is None):
        raise TypeError(
            "checkpoint_plan takes one budget: budget= for the memory saved for backward, or peak= for the step's "
            "peak memory (each in bytes, a size such as '2GiB', a percentage such as '50%' or a fraction such as "
            f"0.5 of today's); got {'neither' if budget is None else 'both'}")
    require_figures(root)
    allow_side_effects = check_bool("allow_side_effects", allow_side_effects)
    resolution = check_int("resolution", resolution, minimum=16)  # (grid steps)
    budget_bytes = peak_bytes = None
    if peak is None:
        budget_bytes = parse_budget(budget, saved_today(root))
    else:
        peak_bytes = parse_budget(peak, require_step_peak(root), name="peak")
    cost = check_wrap_cost(wrap_cost)
    runs = check_bool("runs", runs)
    # The candidates, runs and tables of a 10,000-module tree are some 100,000 objects: without the pause they
    # trigger a full collection over the profile's and the model's objects, which costs more than the plan.
    with gc_paused():
        found = candidates(root, allow_side_effects, cost, hook_ms, op_ms, _cast_of(root, profiled_as))
        options = None
        if runs:
            records = preorder(root)
            below = descendant_calls(records, [c.parent for c in found])
            options = run_options(records, found, below, root.__dict__.get(STORAGES_ATTRIBUTE), cost, hook_ms,
                                  op_ms)
        plan = CheckpointPlan(root, found, budget_bytes, resolution, cost, hook_ms, options, peak_bytes)
    plan.side_effects_allowed = allow_side_effects
    plan.profiled_as = dict(profiled_as or {})
    return plan


def _cast_of(root: ModuleRecord, profiled: dict[str, Any] | None) -> Any:
    """What a stopped recomputation costs where the profile is of a CPU step under autocast (``cast_cost.py``),
    else None: on CUDA events the casts are kernels the host's calibration does not time."""
    autocast = (profiled or {}).get("autocast")
    if not isinstance(autocast, str) or autocast == "float32":
        return None
    if any(getattr(r, "host_forward_ms", None) is not None for r in preorder(root)):
        return None
    return cast_cost(autocast)


def saved_today(root: ModuleRecord) -> int:
    """The bytes the profiled step saved for backward: the root's, or for a root never called (a ``ModuleDict``
    of models, each called in the step) what its children's calls saved (its storage tables', exact where a
    storage is saved by two of them)."""
    if root.saved_bytes is not None or root.calls:
        return int(root.saved_bytes or 0)
    tables = root.__dict__.get(STORAGES_ATTRIBUTE)
    if tables:
        return saved_after(tables, set())
    return sum(int(getattr(child, "saved_bytes", None) or 0) for child in root.children)


def require_step_peak(root: ModuleRecord) -> int:
    """The profiled step's peak, which a peak budget's fractions are of; a ValueError saying what to record where
    the profile cannot predict a plan's peak."""
    tables, timeline = root.__dict__.get(STORAGES_ATTRIBUTE), root.__dict__.get(TIMELINE_ATTRIBUTE)
    if not tables:
        why = ("it holds no storage table (the memory meter keeps them on the profile it ran in, and a saved "
               "profile keeps them in its file; one saved by an older layerprof has none: profile again)")
    elif timeline is None or not PeakModel.predicts(tables, timeline):
        why = ("the memory meter had no reader for the step's device: on the CPU, profile with "
               "LayerProf(model, metrics=(\"live_memory\",)), which counts live tensor bytes; on CUDA "
               "metrics=(\"memory\",) reads the allocator")
    else:
        return step_peak(timeline)
    raise ValueError(f"peak: checkpoint_plan(peak=...) needs the step's memory at every module boundary, and {why}")
