"""DDP's gradient communication, timed through its communication hook: the ``ddp_comm`` meter.

DistributedDataParallel all-reduces gradients in buckets from hooks that its reducer puts on the parameters'
``AccumulateGrad`` nodes, so the communication starts inside the backward pass. layerprof times it by registering
a communication hook (``DistributedDataParallel.register_comm_hook``) that calls the real one (by default
torch's ``allreduce_hook``, which is what DDP does without a hook) and stamps, per bucket:

- ``launch_ms``: the time spent inside the hook call itself, on the autograd thread. It runs between two graph
  nodes, right after the ``AccumulateGrad`` node of the bucket's last gradient (the engine runs those first
  among ready nodes), and so **is** inside the backward interval of every module whose backward is still open
  then: the root's (except for the bucket holding the very last gradient), the parents', and sometimes the
  module's own (a Linear's bias gradient is accumulated before its weight-transpose node runs).
- ``comm_ms``: from the hook call to the completion of the bucket's future (the all-reduce done, DDP's result
  ready): the time the bucket was in flight, most of it overlapped with the backward of earlier layers.
- ``exposed_ms``: from the moment the last autograd node of the backward pass ran to the moment the last
  bucket completed (summed over the backward passes of a step, with gradient accumulation): the communication not hidden behind computation. It lies after the root's backward
  interval, inside ``loss.backward()``, and is in no module's ``backward_ms``.

On NCCL the future completes when the collective is enqueued on its stream, not when it finishes on the GPU,
so ``comm_ms`` and ``exposed_ms`` are host-side times there; ``launch_ms`` is exact everywhere.

DDP accepts one communication hook per model, for the model's lifetime: once installed, layerprof's hook stays
and passes straight through to the wrapped hook when no profiler is listening (one attribute check per bucket).
"""
from __future__ import annotations

import statistics
import threading
import warnings
import weakref
from time import perf_counter_ns
from typing import Any, Callable, Iterable

from torch import nn

from ..metrics.meter import Meter, register_meter
from ..record.records import ModuleRecord

__all__ = ["CommTimer", "CommMeter", "register_timed_comm_hook", "time_ddp_wrapper"]

# One timer per DDP model: DDP refuses a second register_comm_hook.
_TIMERS: "weakref.WeakKeyDictionary[nn.Module, CommTimer]" = weakref.WeakKeyDictionary()


class _Bucket:
    __slots__ = ("start", "launched", "done", "backward")

    def __init__(self, start: int, launched: int) -> None:
        self.start = start
        self.launched = launched
        self.done: int | None = None
        self.backward = 0  # which backward pass of the step (several with gradient accumulation)


class CommTimer:
    """The state of layerprof's communication hook on one DDP model: the wrapped hook and who is listening."""

    def __init__(self, hook: Callable[..., Any], state: Any) -> None:
        self.hook = hook
        self.state = state
        self.meter: CommMeter | None = None


def _timed_comm_hook(timer: CommTimer, bucket):  # no annotations: DDP compares them with its own types
    meter = timer.meter
    if meter is None:
        return timer.hook(timer.state, bucket)
    start = perf_counter_ns()
    future = timer.hook(timer.state, bucket)
    record = _Bucket(start, perf_counter_ns())
    meter.launched(record)

    def completed(fut: Any) -> Any:
        # Chained with then(), not add_done_callback: DDP waits on the future we return, so the stamp is taken
        # before its wait ends and the step cannot close with a bucket unstamped.
        record.done = perf_counter_ns()
        return fut.value()

    return future.then(completed)


def register_timed_comm_hook(ddp_model: nn.Module, hook: Callable[..., Any] | None = None, state: Any = None) -> CommTimer:
    """Register on ``ddp_model`` a communication hook that runs ``hook(state, bucket)`` (default: torch's
    ``allreduce_hook`` on the default group, what DDP does without a hook) and lets the ``ddp_comm`` meter time it.

    Call it instead of ``ddp_model.register_comm_hook(state, hook)`` to time a hook of your own (PowerSGD,
    fp16 compression...). DDP allows one hook per model, so this is done once; calling it again for the same
    model returns the timer already installed when ``hook`` is None, and raises otherwise.
    """
    from torch.nn.parallel import DistributedDataParallel

    if not isinstance(ddp_model, DistributedDataParallel):
        raise TypeError(f"expected a torch.nn.parallel.DistributedDataParallel, got {type(ddp_model).__name__}")
    timer = _TIMERS.get(ddp_model)
    if timer is not None:
        if hook is None:
            return timer
        raise RuntimeError("this DDP model already has layerprof's timed communication hook; DDP allows only one")
    if hook is None:
        from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

        hook, state = allreduce_hook, state if state is not None else ddp_model.process_group
    timer = CommTimer(hook, state)
    ddp_model.register_comm_hook(timer, _timed_comm_hook)
    _TIMERS[ddp_model] = timer
    return timer


@register_meter
class CommMeter(Meter):
    """``LayerProf(ddp_model, metrics=("ddp_comm",))``: per step, DDP's gradient buckets, the time spent
    launching them (``launch_ms``), in flight (``comm_ms``) and exposed after the last backward node
    (``exposed_ms``). Results in ``profile.meta["ddp_comm"]``: means per recorded step, plus ``per_step``."""

    name = "ddp_comm"

    def __init__(self) -> None:
        self._timer: CommTimer | None = None
        self._lock = threading.Lock()
        self._buckets: list[_Bucket] = []
        self._nodes_done: list[int] = []  # per backward pass of the step: when its last graph node had run
        self._callback_queued = False
        self.steps: list[dict[str, Any]] = []
        self.note: str | None = None
        # The DDP wrapper around the profiled model, where a trainer profiles the module that its strategy wrapped
        # (set by ``time_ddp_wrapper``); None: the profiled model must be the DDP model itself.
        self.ddp_model: nn.Module | None = None

    def _ddp_model(self, model: nn.Module) -> nn.Module | None:
        """The DDP model whose communication to time: ``model`` itself, or ``ddp_model`` where it wraps ``model``."""
        from torch.nn.parallel import DistributedDataParallel

        if isinstance(model, DistributedDataParallel):
            return model
        wrapper = self.ddp_model
        if isinstance(wrapper, DistributedDataParallel) and any(inner is model for inner in wrapper.modules()):
            return wrapper
        return None

    def start(self, model: nn.Module, records: dict[str, ModuleRecord], entries: list[tuple[str, nn.Module]]) -> None:
        ddp_model = self._ddp_model(model)
        if ddp_model is None:
            self.note = f"not a DistributedDataParallel model ({type(model).__name__}): no communication to time"
            warnings.warn(f"ddp_comm: {self.note}", RuntimeWarning, stacklevel=4)
            return
        try:
            self._timer = register_timed_comm_hook(ddp_model)
        except RuntimeError as error:  # a communication hook of the user's is already registered
            self.note = (
                f"DDP already has a communication hook ({error}); to time it, register it with "
                "layerprof.register_timed_comm_hook(ddp_model, hook, state) instead of register_comm_hook"
            )
            warnings.warn(f"ddp_comm: {self.note}", RuntimeWarning, stacklevel=4)
            return
        self._timer.meter = self

    def launched(self, bucket: _Bucket) -> None:
        """Called from the hook, on the autograd thread, once per bucket."""
        with self._lock:
            bucket.backward = len(self._nodes_done)
            self._buckets.append(bucket)
            queue = not self._callback_queued
            self._callback_queued = True
        if queue:
            # Final callbacks run in order once every node of the graph task has run; DDP queues its own
            # (which waits for the buckets) when the last bucket is launched, after this one.
            from torch.autograd import Variable

            Variable._execution_engine.queue_callback(self._backward_nodes_done)

    def _backward_nodes_done(self) -> None:
        with self._lock:
            self._nodes_done.append(perf_counter_ns())
            self._callback_queued = False

    def end_step(self, recorded: bool) -> None:
        with self._lock:
            buckets, self._buckets = self._buckets, []
            nodes_done, self._nodes_done = self._nodes_done, []
            self._callback_queued = False
        if not recorded or not buckets:
            return
        done = [b for b in buckets if b.done is not None]
        exposed = 0.0
        for backward, nodes_done_at in enumerate(nodes_done):
            last = max((b.done for b in done if b.backward == backward), default=None)
            if last is not None:
                exposed += max(0.0, (last - nodes_done_at) / 1e6)
        self.steps.append({
            "buckets": len(buckets),
            "launch_ms": sum(b.launched - b.start for b in buckets) / 1e6,
            "comm_ms": sum(b.done - b.start for b in done) / 1e6 if done else None,
            "exposed_ms": exposed if done and nodes_done else None,
        })

    def stop(self) -> None:
        if self._timer is not None and self._timer.meter is self:
            self._timer.meter = None

    def meta(self) -> dict[str, Any]:
        if self.note is not None:
            return {"note": self.note}
        summary: dict[str, Any] = {"steps": len(self.steps)}
        for field in ("buckets", "launch_ms", "comm_ms", "exposed_ms"):
            values = [step[field] for step in self.steps if step[field] is not None]
            summary[field] = statistics.fmean(values) if values else None
        summary["per_step"] = [dict(step) for step in self.steps]
        return summary


def time_ddp_wrapper(meters: Iterable[Meter], ddp_model: Any) -> None:
    """Let the ``ddp_comm`` meters among ``meters`` time ``ddp_model``, the DistributedDataParallel wrapper of the
    model they profile. A trainer (Lightning's DDP strategy, the Hugging Face Trainer under torchrun) hands
    layerprof the module it wrapped, whose own class is not DDP; call before the profiler starts. A ``ddp_model``
    that is not a DDP model wrapping the profiled one is ignored (the meter then notes that there is nothing to
    time)."""
    for meter in meters:
        if isinstance(meter, CommMeter):
            meter.ddp_model = ddp_model
