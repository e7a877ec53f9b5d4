"""LayerProf: puts the tracker's hooks on a model for the length of a ``with`` block and hands back records."""
from __future__ import annotations

import warnings
import weakref
from typing import Any, Iterable

import torch
from torch import nn

from .metrics import Meter, make_meters
from .profile import Profile
from .records import ModuleRecord, build_tree
from .timing import fill_times
from .tracker import Tracker

__all__ = ["LayerProf"]

# Modules currently hooked by some LayerProf: two profilers on one module would time each other's hooks.
_PROFILED: "weakref.WeakKeyDictionary[nn.Module, LayerProf]" = weakref.WeakKeyDictionary()


def _check_model(model: Any) -> None:
    if isinstance(model, torch.jit.ScriptModule):
        raise TypeError(
            "LayerProf cannot profile a TorchScript module: its submodules' hooks never run. "
            "Profile the eager nn.Module before torch.jit.script/trace."
        )
    compiled = getattr(torch, "_dynamo", None) and getattr(torch._dynamo.eval_frame, "OptimizedModule", None)
    if compiled is not None and isinstance(model, compiled):
        raise TypeError(
            "LayerProf cannot see inside a torch.compile'd module: compiled graphs skip module hooks. "
            "Profile the eager module instead: LayerProf(compiled._orig_mod)."
        )
    if not isinstance(model, nn.Module):
        raise TypeError(f"LayerProf expects a torch.nn.Module, got {type(model).__module__}.{type(model).__qualname__}")


class LayerProf:
    """Time every module's forward and backward pass inside a ``with`` block.

    >>> import torch
    >>> net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
    >>> with LayerProf(net) as prof:
    ...     net(torch.randn(2, 4)).sum().backward()
    >>> prof.tree.calls, prof.tree.backward_ms > 0
    (1, True)
    >>> sorted(prof.to_dict())
    ['', '0', '1', '2']

    Args:
        model: the module to profile; every module in ``model.named_modules()`` is hooked.
        sync: on CUDA, synchronize at every boundary and read the wall clock, instead of recording CUDA events
            that are read once after the step (the default, which adds no synchronization).
        metrics: names of meters to run beside timing (see ``layerprof.metrics.METERS``); None: the defaults.
    """

    def __init__(self, model: nn.Module, *, sync: bool = False, metrics: Iterable[str] | None = None) -> None:
        _check_model(model)
        self.model = model
        self.sync = bool(sync)
        self.metrics = make_meters(metrics)
        self._meters: list[Meter] = self.metrics
        self.tree: ModuleRecord | None = None
        self.records: dict[str, ModuleRecord] = {}
        self._tracker: Tracker | None = None
        self._hooked: list[nn.Module] = []
        self._profile: Profile | None = None
        self._state = "new"

    # -- lifecycle -------------------------------------------------------------------------------------------
    def __enter__(self) -> LayerProf:
        if self._state != "new":
            raise RuntimeError(
                "this LayerProf was already used; create a new LayerProf(model) for each profile"
            )
        root, records, entries = build_tree(self.model)
        for name, module in entries:
            other = _PROFILED.get(module)
            if other is not None:
                shown = f"module '{name}'" if name else "the model"
                raise RuntimeError(
                    f"{shown} ({type(module).__name__}) is already being profiled by another active LayerProf; "
                    "nesting profilers on one model is not supported: exit the other one first."
                )
        tracker = Tracker(
            sync=self.sync,
            observers=[m for m in self._meters if m.wants_forward_hooks],
            backward_observers=[m for m in self._meters if m.wants_backward_hooks],
        )
        for _, module in entries:
            _PROFILED[module] = self
        self._hooked = [module for _, module in entries]
        started: list[Meter] = []
        try:
            for meter in self._meters:
                meter.start(self.model, records, entries)
                started.append(meter)
            tracker.attach(entries)
        except BaseException:
            for meter in reversed(started):
                meter.stop()
            self._release()
            raise
        self.tree, self.records, self._tracker = root, records, tracker
        self._state = "running"
        return self

    def __exit__(self, exc_type: Any, exc: BaseException | None, traceback: Any) -> bool:
        tracker = self._tracker
        assert tracker is not None
        try:
            tracker.detach()
        finally:
            try:
                for meter in reversed(self._meters):
                    meter.stop()
            finally:
                self._release()
                self._state = "done"
        for clock in tracker.clocks():
            clock.settle()
        fill_times(tracker.calls, self.records)
        for meter in self._meters:
            meter.fill(self.records)
        if exc is not None and tracker.raised_in is not None and tracker.raised_in[1] is exc:
            call = tracker.raised_in[0]
            shown = f"'{call.name}'" if call.name else "the root"
            exc.add_note(f"layerprof: raised inside module {shown} ({self.records[call.name].type})")
        elif exc is None and not tracker.calls:
            warnings.warn(
                "LayerProf recorded no call of the model: call the model inside the `with` block.",
                RuntimeWarning,
                stacklevel=2,
            )
        tracker.calls.clear()
        self._tracker = None
        self._profile = Profile(self.tree)
        return False

    def _release(self) -> None:
        for module in self._hooked:
            if _PROFILED.get(module) is self:
                del _PROFILED[module]
        self._hooked = []

    # -- results: after the block, a LayerProf answers for its Profile ----------------------------------------
    @property
    def profile(self) -> Profile:
        """The result; available once the ``with`` block has exited."""
        if self._state != "done" or self._profile is None:
            raise RuntimeError("the profile is ready after the `with LayerProf(model) as prof:` block has exited")
        return self._profile

    def __getattr__(self, name: str) -> Any:
        # Only reached for names LayerProf itself lacks: to_dict, layerwise_summary, exports, plots...
        if name.startswith("_") or not hasattr(Profile, name):
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        return getattr(self.profile, name)

    def __repr__(self) -> str:
        if self._state != "done" or self._profile is None:
            return f"<LayerProf {type(self.model).__name__} ({self._state})>"
        return repr(self._profile).replace("<Profile", "<LayerProf", 1)
