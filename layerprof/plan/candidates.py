"""The planner's view of a profile: one candidate per module, with what wrapping it frees and costs, or why it
cannot be wrapped. Reads records only."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..record.records import ModuleRecord, preorder
from .cast_cost import CastCost
from .wrap_cost import WrapCost

__all__ = ["Candidate", "Priced", "candidates", "descendant_calls", "grad_calls", "less_hooks", "reader_ops",
           "require_figures", "skipped_tail_ms", "tail_of"]


class Priced:
    """What wrapping a module gains and costs, from its ``freed_bytes``, ``kept_bytes``, ``recompute_ms`` and
    ``wrap_ms`` (shared by the planner's candidates and the modules a plan chose)."""

    freed_bytes: int
    kept_bytes: int
    recompute_ms: float
    wrap_ms: float

    @property
    def net_bytes(self) -> int:
        return self.freed_bytes - self.kept_bytes

    @property
    def cost_ms(self) -> float:
        """What wrapping adds per step: the recomputed forward and the wrapper's own cost."""
        return self.recompute_ms + self.wrap_ms


@dataclass(frozen=True)
class Candidate(Priced):
    """A module in pre-order: ``net_bytes`` = freed - kept (what wrapping it saves), ``recompute_ms`` = its
    forward time per step (every call, children included; the median over steps) less the tail that checkpoint's
    early stop does not re-run (``skipped_tail_ms``) and less the profiler's hooks on the calls inside it
    (``hook_ms`` each, ``layerprof.collect.hook_cost``) and the live-bytes reader's on the ops inside it
    (``op_ms`` each, ``layerprof.collect.live_op_cost``), ``wrap_ms`` = the checkpoint's own cost per step (its calls
    and saved tensors priced by a WrapCost), ``excluded`` = why it may not be wrapped, if so."""

    name: str
    type: str
    parent: int
    freed_bytes: int
    kept_bytes: int
    recompute_ms: float
    calls: float
    excluded: str | None
    wrap_ms: float = 0.0  # the checkpoint's own cost per step, beyond the recomputation (wrap_cost.py)
    # The profiler's own time taken off (hooks and reader) over the forward it was taken from, for a module timed at
    # TIMED_MS or more (else None): above 1, more than the forward holds, which only a host figure read high gives.
    deducted_share: float | None = None


TIMED_MS = 0.05  # a module's forward, less the early stop's tail, from which its deducted share is read


def require_figures(root: ModuleRecord) -> None:
    """A ValueError saying what to do when the profile lacks the memory meter's figures. A root never called (a
    ``ModuleDict`` holding two models, each called in the step) has none of its own: its children's are used."""
    holders = [root] if root.calls or not root.children else list(root.children)
    if all(getattr(record, "checkpoint_freed_bytes", None) is None for record in holders):
        why = ("it was recorded by a layerprof without checkpoint figures" if getattr(root, "saved_bytes", None)
               is not None else "it has no memory figures")
        raise ValueError(
            f"checkpoint_plan needs the saved-for-backward bytes of every module, and {why}: profile a training "
            "step (forward and backward) with LayerProf(model, metrics=(\"memory\", \"shapes\")) and plan on that"
        )


def _net_bytes(record: ModuleRecord) -> int:
    return int(getattr(record, "checkpoint_freed_bytes", None) or 0) - int(
        getattr(record, "checkpoint_kept_bytes", None) or 0)


def _why_excluded(record: ModuleRecord, allow_side_effects: bool) -> str | None:
    def count(field: str) -> int:
        return int(getattr(record, field, None) or 0)

    if not record.calls:
        return "not called"
    if count("foreign_calls"):
        return "shared: called from a module that does not contain it"
    if count("checkpoint_inplace_inputs"):
        return "modifies an input in place"
    if count("checkpoint_inputs_changed_later"):
        return "its input is modified in place after it returns (x += block(x))"
    if count("checkpoint_cache_updates"):
        # Not a side effect to allow: the re-run would attend over the keys its forward already appended (a
        # sliding window's cache then no longer fits the mask; a full one gives other gradients or none).
        return ("updates a key/value cache it is handed (a recompute would find it extended): pass use_cache=False "
                "for training, as gradient_checkpointing_enable() does")
    if count("checkpoint_side_effects") and not allow_side_effects:
        return ("side effects on recompute (a buffer its forward updates: BatchNorm running statistics, spectral "
                "norm); allow_side_effects=True to allow")
    if _net_bytes(record) <= 0:
        return "frees nothing"
    return None


def _forward_ms(record: ModuleRecord) -> float:
    """The forward time per step: the median over the profiled steps where there were several (a burst of
    other work on the machine in one step does not move it), else the mean."""
    median = getattr(record, "forward_ms_median", None)
    return float(median if median is not None else record.forward_ms or 0.0)


def less_hooks(record: ModuleRecord, forward_ms: float, hooks_ms: float) -> float:
    """A module's recompute time from its profiled forward ``forward_ms`` (its statistic over steps, less the
    early stop's tail) and the profiler's hooks inside it (``hooks_ms``, host time).

    On the CPU wall clock the forward holds the hooks: ``forward_ms - hooks_ms``. Where CUDA events timed it, the
    forward is the GPU's elapsed time E, and the record holds the host's time W beside it (``host_forward_ms``;
    its median over steps, as E is). A recomputation in a plain step takes about the
    larger of its kernels' time and the host's time without the hooks, W - h. Where E exceeds W + h the GPU was
    behind the host throughout and E is its kernels' time: E. Where E is at most W, the GPU waited on the host
    (a launch-bound step, the hooks' host time in the events) and its kernels took at most E: W - h, which the
    H100 bore out (2026-11-27: ResNet-50 b32 and BERT-base b8 s128, the wrapped modules' recomputations 8.65 and
    14.22 ms measured, 8.05 and 13.59 by the host less the hooks, 16.60 and 19.65 by the events). Between the
    two, linearly."""
    median = getattr(record, "host_forward_ms_median", None)
    host = median if median is not None else getattr(record, "host_forward_ms", None)
    if host is None:
        return forward_ms - hooks_ms
    # Less the same early-stop tail as the events (in the events' time; the host's share of it is not known).
    host_ms = float(host) - (_forward_ms(record) - forward_ms)
    bare_host = host_ms - hooks_ms
    return max(bare_host, min(forward_ms, 2.0 * forward_ms - host_ms - hooks_ms))


def grad_calls(record: ModuleRecord) -> float:
    """The calls a step that a wrapper checkpoints: those made with gradients on. Called with them off, a wrapper
    calls the forward as it is (``apply.py``), without the checkpoint's set-up, and costs nothing to price."""
    no_grad = float(getattr(record, "checkpoint_no_grad_calls", None) or 0)
    return max(0.0, float(record.calls or 0) - no_grad)


def grad_share(record: ModuleRecord) -> float:
    """The share of the module's calls a checkpoint re-runs: those made with gradients on (``grad_calls``). A call
    under ``no_grad`` (a reference model's pass in DPO, a teacher or EMA pass through the same modules) saves
    nothing and is never recomputed, but its time is in the module's forward."""
    calls = float(record.calls or 0)
    return 1.0 if calls <= 0 else grad_calls(record) / calls


def _saved_tensors(record: ModuleRecord) -> int:
    return int(getattr(record, "checkpoint_saved_tensors", None) or 0)


def _once(record: ModuleRecord) -> Any:
    """The one forward call of a module called once a step (its start orders it among its siblings), else None."""
    if record.calls != 1:
        return None
    found = [timing for timing in record.call_times if not timing.recompute]
    return found[0] if len(found) == 1 else None


# Leaf types whose forward saves only its input and parameters, before it computes: when such a layer makes the
# region's last save, the recomputation stops before it runs. Matched by class name (records hold names).
_SAVES_BEFORE_COMPUTING = frozenset({
    "Linear", "Conv1d", "Conv2d", "Conv3d", "ConvTranspose1d", "ConvTranspose2d", "ConvTranspose3d",
    "Conv1D",  # Hugging Face's GPT-2 projection
    "AvgPool1d", "AvgPool2d", "AvgPool3d", "AdaptiveAvgPool1d", "AdaptiveAvgPool2d", "AdaptiveAvgPool3d",
})


def skipped_tail_ms(record: ModuleRecord) -> float:
    """The forward time at the end of ``record`` that checkpointing does not re-run. Non-reentrant checkpoint
    stops the recomputation once the last tensor backward needs is saved again, so what runs after the region's
    last save is skipped: going back from its last child in call order, leaves that save nothing, then a leaf
    that saves only its input and weights before computing (a Linear, a convolution: ``_SAVES_BEFORE_COMPUTING``)
    and stops there; a child with children of its own is looked into the same way. Read only where the module
    and the children in question run once a step (call order from the last step's call times) and the module's
    own code (outside its children) saves nothing; else what was found so far (0 at the top)."""
    skipped = 0.0
    while record.children and _once(record) is not None:
        if _saved_tensors(record) > sum(_saved_tensors(child) for child in record.children):
            return skipped  # the module's own code saves tensors too, at places the records do not order
        ordered = []
        for child in record.children:
            if not child.calls:
                continue
            call = _once(child)
            if call is None:
                return skipped
            ordered.append((call.forward_start_ms, child))
        ordered.sort(key=lambda pair: pair[0])
        part, inner = tail_of([child for _, child in ordered])
        skipped += part
        if inner is None:
            return skipped
        record = inner
    return skipped


def tail_of(children: list[ModuleRecord]) -> tuple[float, ModuleRecord | None]:
    """Going back from the last of ``children`` (in call order): the forward time the early stop skips among
    them, and the child with children of its own to look into next (None where the tail stopped)."""
    skipped = 0.0
    for child in reversed(children):
        if child.children:
            return skipped, child
        if _saved_tensors(child) == 0:
            skipped += _forward_ms(child)
            continue
        if child.type in _SAVES_BEFORE_COMPUTING:
            skipped += _forward_ms(child)
        return skipped, None
    return skipped, None


def reader_ops(record: ModuleRecord) -> int:
    """Ops the live-bytes reader saw in the module's forward per step (0 where it did not count them)."""
    return int(getattr(record, "live_forward_ops", None) or 0)


def descendant_calls(records: list[ModuleRecord], parents: list[int]) -> list[int]:
    """For each record of a pre-order list, the calls a step of the modules below it. A shared module's calls
    from a module that does not contain it (``foreign_calls``) run in that caller's forward, which the records
    do not name: left out everywhere, so that a time is never taken off a module they did not run in."""
    below = [0] * len(records)
    for i in range(len(records) - 1, 0, -1):
        own = max(0, int(records[i].calls or 0) - int(getattr(records[i], "foreign_calls", None) or 0))
        below[parents[i]] += below[i] + own
    return below


def candidates(root: ModuleRecord, allow_side_effects: bool = False, cost: WrapCost | None = None,
               hook_ms: float = 0.0, op_ms: float = 0.0, cast: CastCost | None = None) -> list[Candidate]:
    """Every module of the tree in pre-order as a Candidate: ``recompute_ms`` its forward time less the tail
    that checkpointing's early stop skips and less ``hook_ms`` for every call of a module inside it (the
    profiler's own time in that forward, which a recomputation does not pay) and less ``op_ms`` for every op the
    live-bytes reader saw in it (``live_forward_ops``, where the reader ran in the timed step); ``cost`` prices
    the wrapper (None: not counted). ``cast``: on a CPU profile under autocast, what a layer that saves before it
    computes re-runs when wrapped by itself, its casts (``cast_cost.py``): it is priced by the bytes it frees, not
    by its forward, whose product the early stop skips."""
    records = preorder(root)
    index = {id(record): i for i, record in enumerate(records)}
    parents = [-1 if record.parent is None else index[id(record.parent)] for record in records]
    below = descendant_calls(records, parents)
    found = []
    for i, record in enumerate(records):
        forward = _forward_ms(record) - skipped_tail_ms(record)
        hooks, reader = hook_ms * below[i], op_ms * reader_ops(record)
        recompute = less_hooks(record, forward, hooks) - reader  # (in the order the runs' sums take them off)
        if cast is not None and not record.children and record.type in _SAVES_BEFORE_COMPUTING:
            recompute = min(recompute, cast.of(_net_bytes(record), grad_calls(record)))
        deducted = forward - recompute
        share = grad_share(record)
        if share != 1.0:  # calls made with gradients off are in the forward time, not re-run
            recompute *= share
        found.append(Candidate(
            name=record.name, type=record.type, parent=parents[i],
            freed_bytes=int(getattr(record, "checkpoint_freed_bytes", None) or 0),
            kept_bytes=int(getattr(record, "checkpoint_kept_bytes", None) or 0),
            recompute_ms=max(0.0, recompute), calls=record.calls,
            excluded=_why_excluded(record, allow_side_effects),
            # (a call under no_grad skips the wrapper's set-up: the calls with gradients on are priced)
            wrap_ms=0.0 if cost is None else cost.of(grad_calls(record), _saved_tensors(record)),
            deducted_share=deducted / forward if forward >= TIMED_MS else None,
        ))
    return found
