"""Wrapping chosen modules in non-reentrant ``torch.utils.checkpoint`` and taking the wrapping off again.

A wrapped module gets one instance attribute, ``forward``, that runs the class's forward (or the instance's own
``forward`` if it had one) under ``checkpoint(..., use_reentrant=False)`` with the RNG state preserved, so a
Dropout inside draws the same mask when recomputed. The module's hooks, parameters, buffers and ``__call__`` are
untouched; ``unwrap`` deletes the attribute (or puts back the instance's own one), leaving the module as it was.
Every tensor in the arguments (in lists, tuples and dicts too) is passed to checkpoint as an input, so that it
holds them as saved inputs (what the planner counts as kept) rather than in a closure.

Runs of consecutive children of an ``nn.Sequential`` (``wrap_runs``) are wrapped the same way, on the Sequential:
its instance ``forward`` calls the children in order as ``nn.Sequential.forward`` does, each run of them under one
checkpoint, and ``unwrap`` takes it off as it does a module's.

A wrapper given a ``label`` reports how long its recomputation in backward took to the ``RecomputeTimer`` active at
the time (``verify_plan`` uses one): the forward's first run under the checkpoint is the forward, any later run of
the same call is the recomputation. It reports too what its checkpoint call took in forward beyond that first run:
the wrapper's own forward work.
"""
from __future__ import annotations

import copy
import dataclasses
import functools
import time
import weakref
from typing import Any, Callable

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from .._warn import warn_user

__all__ = ["wrap", "wrap_runs", "unwrap", "is_wrapped", "RecomputeTimer"]

_MARK = "_layerprof_checkpointed"
_MISSING = object()
_timer: RecomputeTimer | None = None  # the active one, if any


class RecomputeTimer:
    """``with RecomputeTimer() as timer:`` ``timer.ms`` sums, per label, the time (ms) the labelled wrappers'
    recomputations took in backward while the block ran; ``timer.wrapper_forward_ms`` the time their checkpoint
    calls took in forward beyond the region's own forward (the wrapper's set-up and its saved-tensor hooks).
    ``sync``: called before and after each recomputation (e.g. ``torch.cuda.synchronize``, so that its kernels are
    inside its time). ``clock``: seconds, the wall clock unless given (``time.process_time`` for CPU time)."""

    def __init__(self, sync: Callable[[], Any] | None = None, clock: Callable[[], float] = time.perf_counter
                 ) -> None:
        self.ms: dict[str, float] = {}
        self.wrapper_forward_ms: dict[str, float] = {}
        self._sync = sync
        self._clock = clock
        self._region_s = 0.0  # the region's forward inside the checkpoint call being timed

    def __enter__(self) -> RecomputeTimer:
        global _timer
        if _timer is not None:
            raise RuntimeError("a RecomputeTimer is already active; they do not nest")
        _timer = self
        return self

    def __exit__(self, *exc: Any) -> None:
        global _timer
        _timer = None

    def _run(self, label: str, forward: Callable[..., Any], args: Any, kwargs: Any) -> Any:
        if self._sync is not None:
            self._sync()
        start = self._clock()
        try:
            return forward(*args, **kwargs)
        finally:
            if self._sync is not None:
                self._sync()
            self.ms[label] = self.ms.get(label, 0.0) + (self._clock() - start) * 1e3

    def _region(self, forward: Callable[..., Any], args: Any, kwargs: Any) -> Any:
        """The region's own forward under the checkpoint call being timed."""
        start = self._clock()
        try:
            return forward(*args, **kwargs)
        finally:
            self._region_s += self._clock() - start

    def _call(self, label: str, call: Callable[[], Any]) -> Any:
        """A wrapper's checkpoint call in forward: its time less the region's forward inside it."""
        outer, self._region_s = self._region_s, 0.0
        start = self._clock()
        try:
            return call()
        finally:
            own = self._clock() - start - self._region_s
            self.wrapper_forward_ms[label] = self.wrapper_forward_ms.get(label, 0.0) + own * 1e3
            self._region_s = outer


class _Slot:
    """Where a tensor was in the arguments, in a copy of their containers."""

    __slots__ = ("index",)

    def __init__(self, index: int) -> None:
        self.index = index


class _Container:
    """A container of another kind than list, tuple or dict: its tensors are the checkpoint's inputs (so that it
    saves them, as the memory meter and the plan count), and the module gets the container itself (``build``), in
    forward and when recomputed: what the module writes into it (an auxiliary loss appended to a list in a
    dataclass, a statistic set in an ``OrderedDict``) reaches the caller, as without the plan."""

    __slots__ = ("build", "items")

    def __init__(self, build: Callable[[list[Any]], Any], items: list[Any]) -> None:
        self.build = build
        self.items = items


def _pull_tensors(value: Any, tensors: list[torch.Tensor], slots: dict[int, _Slot]) -> Any:
    """A copy of ``value``'s containers with each tensor moved to ``tensors`` and a _Slot left: one slot per tensor
    object (``slots``: by ``id``), so that an argument given twice (``attn(x, x, x)``) is one input of the
    checkpoint and the same object again when recomputed (``nn.MultiheadAttention`` takes its self-attention path on
    ``query is key``; saved-tensor hooks unpack each input anew). Containers: lists, tuples and dicts are copied;
    the other kinds that carry tensors into a module are handed over as they are, their tensors the checkpoint's
    inputs too (``_Container``). A tensor in anything else stays in the wrapper's closure, where the checkpoint does
    not see it (the memory meter then counts less than the plan frees)."""
    if isinstance(value, torch.Tensor):
        slot = slots.get(id(value))
        if slot is None:
            tensors.append(value)
            slot = slots[id(value)] = _Slot(len(tensors) - 1)
        return slot
    kind = type(value)
    if kind is list or kind is tuple:
        return kind(_pull_tensors(item, tensors, slots) for item in value)
    if kind is dict:
        return {key: _pull_tensors(item, tensors, slots) for key, item in value.items()}
    opened = _opened(value)
    if opened is None:
        return value
    build, items = opened
    return _Container(build, [_pull_tensors(item, tensors, slots) for item in items])


def _put_tensors(value: Any, tensors: tuple[Any, ...]) -> Any:
    if isinstance(value, _Slot):
        return tensors[value.index]
    kind = type(value)
    if kind is list or kind is tuple:
        return kind(_put_tensors(item, tensors) for item in value)
    if kind is dict:
        return {key: _put_tensors(item, tensors) for key, item in value.items()}
    if kind is _Container:
        return value.build([_put_tensors(item, tensors) for item in value.items])
    return value


def _opened(value: Any) -> tuple[Callable[[list[Any]], Any], list[Any]] | None:
    """For a container of another kind than list, tuple or dict (a namedtuple such as the ``PackedSequence`` an LSTM
    takes, a list or tuple subclass, an ``OrderedDict`` or another mapping, a dataclass): the container itself for
    the module (``_Container``), and what it holds; None for anything else."""
    if isinstance(value, (list, tuple)):
        items = list(value)
    elif isinstance(value, dict):
        items = list(value.values())
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):
        items = [getattr(value, field.name, None) for field in dataclasses.fields(value)]
    else:
        return None
    return (lambda _: value), items


class _Wrapper:
    """A forward put on a module as its instance attribute: marked (``is_wrapped``), wearing the wrapped
    forward's name, doc and signature (``__wrapped__``), and copied with the module. A deep copy of a wrapped
    module (an EMA or teacher copy made while a plan is applied) gets a wrapper of its own over the copy's forward
    and children, not one that runs the original's; a pickled one is rebuilt from the same parts."""

    _layerprof_checkpointed = True  # (``_MARK``)

    def _parts(self) -> tuple[Any, ...]:
        raise NotImplementedError

    def __reduce__(self) -> tuple[Any, ...]:
        return type(self), self._parts()

    def __deepcopy__(self, memo: dict[int, Any]) -> _Wrapper:
        return type(self)(*copy.deepcopy(self._parts(), memo))

    def __getattr__(self, name: str) -> Any:
        # (only for what it does not have: a function's code, which torch.export and torch.jit.script read)
        if name in _FUNCTION_PARTS:
            raise AttributeError(
                f"{name}: this forward is layerprof's checkpoint wrapper (a checkpoint plan is applied), not a "
                "function: take the plan off (plan.remove()) before torch.export, torch.jit.script or other code "
                "that reads a forward's code")
        raise AttributeError(name)


_FUNCTION_PARTS = frozenset(("__code__", "__globals__", "__func__", "__closure__", "__defaults__", "__kwdefaults__"))


class _Checkpointed(_Wrapper):
    """``forward`` run under ``checkpoint(..., use_reentrant=False)``, RNG state preserved, while grad is on."""

    def __init__(self, forward: Callable[..., Any], label: str | None = None, off: bool = False,
                 first_call: Callable[[], Any] | None = None) -> None:
        functools.update_wrapper(self, forward)  # (first: it copies the forward's __dict__, an old wrapper's fields)
        self._forward, self._label, self._off = forward, label, off
        self._first_call = first_call  # (not copied with the module: a copy is not the model it checks)

    def _parts(self) -> tuple[Any, ...]:
        return self._forward, self._label, self._off

    def turn_off(self) -> None:
        self._off = True

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        forward, label = self._forward, self._label
        if self._off or not torch.is_grad_enabled():
            return forward(*args, **kwargs)
        _first_call(self)
        # The tensors go to checkpoint as its inputs (it holds them for the recomputation, as the planner counts),
        # and the lists that held them are copies: a caller appending to a list it passed (DenseNet's blocks do)
        # must not change what the recomputation sees.
        tensors: list[torch.Tensor] = []
        layout = _pull_tensors((args, kwargs), tensors, {})
        timer = _timer
        if timer is None or label is None:
            # Untimed, the body keeps no state of its own: torch.compile traces it into the checkpoint whole (a
            # counter it mutated broke the graph at every wrapped region, and failed fullgraph=True).
            def plain(*flat: Any) -> Any:
                positional, keywords = _put_tensors(layout, flat)
                return forward(*positional, **keywords)

            return checkpoint(plain, *tensors, use_reentrant=False, preserve_rng_state=True)
        runs = [0]  # of body for this call: the first is the forward, later ones recompute it

        def body(*flat: Any) -> Any:
            positional, keywords = _put_tensors(layout, flat)
            runs[0] += 1
            active = _timer  # (the timer may have ended before backward recomputes)
            if active is None:
                return forward(*positional, **keywords)
            if runs[0] == 1:
                return active._region(forward, positional, keywords)
            return active._run(label, forward, positional, keywords)

        return timer._call(label, lambda: checkpoint(body, *tensors, use_reentrant=False, preserve_rng_state=True))


def _first_call(wrapper: _Checkpointed | _RunsForward) -> None:
    """Call the wrapper's ``_first_call`` (what to check at its first call with gradients on) once; not while
    torch.compile traces it (kept for a call run eagerly): it warns, which would break the graph."""
    if wrapper._first_call is None or torch.compiler.is_compiling():
        return
    first_call, wrapper._first_call = wrapper._first_call, None
    first_call()


def is_wrapped(module: nn.Module) -> bool:
    """Whether ``module.forward`` is a checkpoint wrapper put there by ``wrap`` (and not turned off since)."""
    forward = module.__dict__.get("forward")
    return getattr(forward, _MARK, False) and not getattr(forward, "_off", False)


def wrap(module: nn.Module, label: str | None = None, first_call: Callable[[], Any] | None = None
         ) -> tuple[Any, _Wrapper]:
    """Wrap ``module``'s forward; returns what ``unwrap`` needs to restore it (the instance's own forward or a
    marker that it had none, and the wrapper). ``label``: the name its recomputations are timed under by a
    RecomputeTimer; ``first_call``: called at the wrapper's first call with gradients on."""
    own = module.__dict__.get("forward", _MISSING)
    wrapper = _Checkpointed(module.forward, label, first_call=first_call)
    module.forward = wrapper  # type: ignore[method-assign]
    return own, wrapper


def _in_order(modules: tuple[nn.Module, ...], input: Any) -> Any:
    for module in modules:
        input = module(input)
    return input


class _RunsForward(_Wrapper):
    """``nn.Sequential.forward`` with the children at each ``[first, stop)`` of ``spans`` run under one checkpoint
    (``_Checkpointed`` of ``_in_order`` over them), labelled by ``labels``. Over the Sequential's children as they
    are at each call: one replaced, added or taken out while the plan is applied runs as it would without the plan
    (inside its run's checkpoint where it stands at a run's position). Turned off (``unwrap`` found another forward
    in its place), it runs the children without checkpoints."""

    def __init__(self, sequential: nn.Sequential, spans: list[tuple[int, int]],
                 labels: dict[tuple[int, int], str], off: bool = False,
                 first_call: Callable[[], Any] | None = None) -> None:
        self._sequential = weakref.ref(sequential)  # (the Sequential holds this: no cycle)
        self._spans, self._labels, self._off = sorted(spans), labels, off
        self._first_call = first_call  # (as a module's wrapper keeps it)
        # Made here, where the Sequential is whole, not at the first call: torch.compile cannot trace making them
        # (functools.update_wrapper). A deep copy's or an unpickled one's, made before its Sequential has children,
        # at its first call.
        children = sequential.__dict__.get("_modules")
        self._children: tuple[nn.Module, ...] = tuple(children.values()) if children is not None else ()
        self._segments = _segments(self._children, self._spans, labels) if children is not None else []
        self.__name__ = "forward"  # (its signature is __call__'s: forward(input), as a bound Sequential.forward)

    def _parts(self) -> tuple[Any, ...]:
        return self._sequential(), self._spans, self._labels, self._off

    def turn_off(self) -> None:
        self._off = True

    def __call__(self, input: Any) -> Any:
        sequential = self._sequential()
        assert sequential is not None  # (it holds this wrapper, and calls it)
        children = tuple(sequential._modules.values())
        if self._off:
            return _in_order(children, input)
        if torch.is_grad_enabled():
            _first_call(self)
        if children != self._children:  # (identity: modules compare as objects)
            self._children, self._segments = children, _segments(children, self._spans, self._labels)
        for segment in self._segments:
            input = segment(input)
        return input


def _segments(children: tuple[nn.Module, ...], spans: list[tuple[int, int]], labels: dict[tuple[int, int], str]
              ) -> list[Callable[[Any], Any]]:
    """The children outside the runs, and each run ``[first, stop)`` of ``spans`` (sorted) as one checkpoint."""
    segments: list[Callable[[Any], Any]] = []
    position = 0
    for first, stop in spans:
        stop = min(stop, len(children))
        if first >= stop:
            break
        segments += children[position:first]
        segments.append(_Checkpointed(functools.partial(_in_order, children[first:stop]), labels.get((first, stop))))
        position = stop
    segments += children[position:]
    return segments


def wrap_runs(sequential: nn.Module, spans: list[tuple[int, int]],
              labels: dict[tuple[int, int], str] | None = None, first_call: Callable[[], Any] | None = None) -> Any:
    """Run each ``[first, stop)`` of ``sequential``'s children (positions as in slicing) under one checkpoint;
    returns what ``unwrap`` needs. Only an ``nn.Sequential`` itself, whose forward is known. ``labels``: span ->
    the name its recomputations are timed under; ``first_call``: as for ``wrap``."""
    if type(sequential) is not nn.Sequential:
        raise TypeError(f"runs of children are wrapped in an nn.Sequential only, got {type(sequential).__name__}")
    if len(list(sequential.children())) != len(sequential):
        raise ValueError("a Sequential that holds one module twice cannot have runs wrapped: wrap modules instead")
    own = sequential.__dict__.get("forward", _MISSING)
    wrapper = _RunsForward(sequential, spans, labels or {}, first_call=first_call)
    sequential.forward = wrapper  # type: ignore[method-assign]
    return own, wrapper


def unwrap(module: nn.Module, applied: tuple[Any, _Wrapper]) -> None:
    """Undo ``wrap`` or ``wrap_runs`` (``applied``: what it returned): delete the wrapper, or put back the
    instance's own forward that it replaced. Where another forward took the wrapper's place meanwhile (another
    tool's, around it: accelerate's hooks), that one stays, and the wrapper inside it is turned off (it runs what
    it wraps without a checkpoint from now on), with a warning."""
    own, wrapper = applied
    if module.__dict__.get("forward") is not wrapper:
        wrapper.turn_off()
        warn_user(
            f"plan.remove(): the forward of a {type(module).__name__} was replaced while the plan was applied "
            "(by another tool, such as accelerate's hooks, or by hand): that forward is left in place, and the "
            "plan's checkpoint wrapper inside it no longer checkpoints",
            RuntimeWarning,
        )
        return
    if own is _MISSING:
        module.__dict__.pop("forward", None)
    else:
        module.forward = own  # type: ignore[method-assign]
