"""Collection: which module runs and when, in the forward and in the backward pass.

Forward boundaries come from module pre/post hooks. Backward boundaries come from hooks on the autograd graph
nodes that the module's forward created, found by sequence number: every node created between a module's
pre-hook and post-hook has a sequence number in ``[seq_start, seq_end)``. The backward of that call starts
when the first of its output nodes is about to run (node pre-hook) and ends when the last of its *frontier*
nodes (those with no successor inside the call) has run (node post-hook). Nothing is wrapped: no tensor, no
``BackwardHookFunction``, so in-place ops after the module, inputs that need no grad, keyword arguments and
dict/dataclass outputs all work, and outputs and gradients are bitwise those of an unprofiled run.

The tracker only stamps instants; turning stamps into milliseconds happens after the step (``timing.py``).
"""
from __future__ import annotations

import sys
import threading
from typing import Any, Callable, Iterable, Sequence

import torch
from torch import nn

from .clock import Clock, CpuClock, make_clock
from .._tensors import first_tensor, iter_tensors
from .._torch import graph_task_id as _graph_task_id
from .._torch import next_sequence_nr as _next_sequence_nr
from .._torch import queue_engine_callback
from .._torch import sequence_nr

__all__ = ["CallTrace", "Tracker"]



class CallTrace:
    """Raw stamps of one call of one module. ``recompute`` marks a forward run during backward (checkpointing)."""

    __slots__ = (
        "name", "parent", "clock", "recompute", "seq_start", "seq_end",
        "fwd_start", "fwd_end", "bwd_start", "bwd_end", "raised", "handling",
    )

    def __init__(self, name: str, parent: CallTrace | None, clock: Clock, recompute: bool) -> None:
        self.name = name
        self.parent = parent
        self.clock = clock
        self.recompute = recompute
        self.seq_start = self.seq_end = 0
        self.fwd_start: Any = None
        self.fwd_end: Any = None
        self.bwd_start: Any = None
        self.bwd_end: Any = None
        self.raised = False
        self.handling: BaseException | None = None  # an exception already being handled when the call began


class Tracker:
    """Puts forward hooks on modules, graph hooks on the nodes their forward creates, and collects CallTraces."""

    def __init__(self, sync: bool = False, observers: Sequence[Any] = (), backward_observers: Sequence[Any] = ()) -> None:
        self.sync = sync
        self.calls: list[CallTrace] = []
        self.active = False
        # The call whose backward ran last, for the note on an exception that escapes backward (``backward_note``);
        # cleared when a backward pass completes and when a new top-level forward begins.
        self.backward_in: CallTrace | None = None
        self.backward_task = -1
        self.types: dict[str, str] = {}  # module name -> class name, for the notes
        self.cpu_clock = CpuClock()
        self.cuda_clocks: dict[int, Clock] = {}
        # (thread id, graph node sequence number) -> _NodeWatch, cleared after each step
        self.watches: dict[tuple[int, int], Any] = {}
        self.observers = tuple(observers)  # replaced between steps by the profiler
        # Told ``backward_start(calls)``/``backward_end(calls)`` from the graph hooks; empty on the default path.
        self.backward_observers = tuple(backward_observers)
        self._local = threading.local()
        self._handles: list[Any] = []
        self._hook_cache: dict[str, tuple[Callable[..., None], Callable[..., None]]] = {}

    # -- lifecycle -------------------------------------------------------------------------------------------
    def attach(self, modules: Iterable[tuple[str, nn.Module]]) -> None:
        """Hook every module; if hooking fails half way, remove what was added and re-raise."""
        try:
            for name, module in modules:
                self.types[name] = type(module).__name__
                hooks = self._hook_cache.get(name)
                if hooks is None:  # made once, reused when a schedule hooks the model again
                    hooks = self._hook_cache[name] = self._make_hooks(name)
                pre, post = hooks
                # Our pre-hook runs last and our post-hook first, so the user's own hooks are not timed.
                self._handles.append(module.register_forward_pre_hook(pre, with_kwargs=True))
                self._handles.append(
                    module.register_forward_hook(post, with_kwargs=True, always_call=True, prepend=True)
                )
        except BaseException:
            self.detach()
            raise
        self.active = True

    def detach(self) -> None:
        """Remove every module hook. Graph hooks die with the graph and do nothing once ``active`` is False."""
        self.active = False
        self.watches.clear()
        handles, self._handles = self._handles, []
        for handle in handles:
            handle.remove()

    def clocks(self) -> list[Clock]:
        return [self.cpu_clock, *self.cuda_clocks.values()]

    # -- forward hooks ---------------------------------------------------------------------------------------
    def _stack(self) -> list[CallTrace]:
        try:
            return self._local.stack
        except AttributeError:
            self._local.stack = []
            return self._local.stack

    def reset_stack(self) -> None:
        """Forget calls left open on this thread (between steps, no forward is running)."""
        self._stack().clear()

    def _clock_for(self, module: nn.Module, args: Any, kwargs: Any) -> Clock:
        tensor = first_tensor(args, kwargs)
        if tensor is None:
            tensor = next(module.parameters(), None)
        if tensor is None or not tensor.is_cuda:
            return self.cpu_clock
        index = tensor.get_device()
        clock = self.cuda_clocks.get(index)
        if clock is None:
            clock = self.cuda_clocks[index] = make_clock(torch.device("cuda", index), self.sync)
        return clock

    def _make_hooks(self, name: str) -> tuple[Callable[..., None], Callable[..., None]]:
        tracker = self
        calls = self.calls

        local = self._local
        cpu_clock = self.cpu_clock
        cuda_initialized = torch.cuda.is_initialized

        def forward_pre(module: nn.Module, args: Any, kwargs: Any) -> None:
            if not tracker.active:
                return None
            try:
                stack = local.stack
            except AttributeError:
                stack = tracker._stack()
            clock = tracker._clock_for(module, args, kwargs) if cuda_initialized() else cpu_clock
            call = CallTrace(name, stack[-1] if stack else None, clock, _graph_task_id() != -1)
            if not stack and not call.recompute:
                tracker.backward_in = None  # a new forward: an older backward's failure is no longer news
            handling = sys.exc_info()[1]
            if handling is not None:  # called from an except block: its exception is not this call's
                call.handling = handling
            calls.append(call)
            stack.append(call)
            for observer in tracker.observers:
                observer.forward_pre(call, module, args, kwargs)
            call.seq_start = _next_sequence_nr()
            call.fwd_start = clock.now()
            return None

        def forward_post(module: nn.Module, args: Any, kwargs: Any, output: Any) -> None:
            if not tracker.active:
                return None
            stack = getattr(local, "stack", None)
            if not stack:
                return None  # the call began before profiling did
            call = stack[-1]
            end = call.clock.now()
            if call.name != name:
                # An inner call never reached its post-hook (a pre-hook raised before forward ran): unwind to ours.
                call = _unwind_to(stack, name)
                if call is None:
                    return None
                end = call.clock.now()
            stack.pop()
            call.fwd_end = end
            call.seq_end = _next_sequence_nr()
            error = sys.exc_info()[1] if output is None else None
            handling, call.handling = call.handling, None
            if error is not None and error is not handling:
                # always_call ran us because forward raised: remember the innermost module for the error note.
                call.raised = True
                # The note goes on the exception now, at the innermost module it leaves: the exception itself then
                # says it was noted, so no identity is kept here (id() is reused, and holding the exception would
                # keep its traceback's frames and tensors alive).
                if not has_note(error):
                    error.add_note(raised_note(name, tracker.types.get(name, type(module).__name__)))
                return None
            if call.seq_end > call.seq_start:
                _watch_backward(call, output, tracker)
            for observer in tracker.observers:
                observer.forward_post(call, module, args, kwargs, output)
            return None

        return forward_pre, forward_post


NOTE_PREFIX = "layerprof: "


def raised_note(name: str, type_name: str, during: str = "") -> str:
    """The note added to an exception raised inside a profiled module."""
    shown = f"module '{name}'" if name else "the model"
    return f"{NOTE_PREFIX}raised inside {shown} ({type_name}){during}"


def has_note(error: BaseException) -> bool:
    return any(isinstance(note, str) and note.startswith(NOTE_PREFIX) for note in getattr(error, "__notes__", ()))


def _from_backward(traceback: Any) -> bool:
    """Whether the traceback passes through torch's autograd engine (the exception escaped a backward pass)."""
    while traceback is not None:
        code = traceback.tb_frame.f_code
        if code.co_name == "_engine_run_backward" or (
            code.co_name in ("backward", "grad") and "autograd" in code.co_filename.replace("\\", "/")
        ):
            return True
        traceback = traceback.tb_next
    return False


def backward_note(tracker: Tracker, error: BaseException, traceback: Any) -> str | None:
    """The note for an exception that escaped a backward pass, naming the module whose backward ran last."""
    call = tracker.backward_in
    if call is None or has_note(error) or not _from_backward(traceback):
        return None
    return raised_note(call.name, tracker.types.get(call.name, "?"), ", during its backward")


def _unwind_to(stack: list[CallTrace], name: str) -> CallTrace | None:
    for depth in range(len(stack) - 1, -1, -1):
        if stack[depth].name == name:
            del stack[depth + 1 :]
            return stack[depth]
    return None


# -- backward: hooks on the graph nodes a call created ------------------------------------------------------
class _NodeWatch:
    """The calls that start or end their backward at one graph node. A node shared by nested calls (a child's
    output is its parent's output) gets one hook that stamps once, so a child can never outlast its parent."""

    __slots__ = ("tracker", "starts", "ends")

    def __init__(self, tracker: Tracker) -> None:
        self.tracker = tracker
        self.starts: list[CallTrace] = []
        self.ends: list[CallTrace] = []

    def started(self, grad_outputs: Any) -> None:
        if self.tracker.active:
            _backward_enters(self.tracker, self.starts[0])
            if self.tracker.backward_observers:
                # Before the stamp, so that the observers' own cost is not timed as the calls' backward.
                starting = [call for call in self.starts if call.bwd_start is None]
                for observer in self.tracker.backward_observers:
                    observer.backward_start(starting)
            stamp = self.starts[0].clock.now()
            for call in self.starts:
                if call.bwd_start is None:
                    call.bwd_start = stamp
        return None

    def ended(self, grad_inputs: Any, grad_outputs: Any) -> None:
        if self.tracker.active:
            stamp = self.ends[0].clock.now()
            for call in self.ends:
                call.bwd_end = stamp
            outer = self.ends[-1].parent
            self.tracker.backward_in = outer if outer is not None and outer.bwd_start is not None else None
            for observer in self.tracker.backward_observers:
                observer.backward_end(self.ends)
        return None


def _backward_enters(tracker: Tracker, call: CallTrace) -> None:
    """Remember the innermost call whose backward begins; the engine forgets it when the pass completes."""
    task = _graph_task_id()
    if task != tracker.backward_task:
        tracker.backward_task = task
        # Runs once per backward pass, after everything else in it, and not when the pass fails: a failed pass
        # leaves its last module for the note.
        queue_engine_callback(lambda: _backward_done(tracker))
    tracker.backward_in = call


def _backward_done(tracker: Tracker) -> None:
    tracker.backward_in = None
    tracker.backward_task = -1


def _watch_backward(call: CallTrace, output: Any, tracker: Tracker) -> None:
    """Hook the call's output nodes (backward start) and its frontier nodes (backward end)."""
    lo, hi = call.seq_start, call.seq_end
    if isinstance(output, torch.Tensor):
        node = output.grad_fn
        # A node made before the call (an input passed through) or by an in-place op after it is not ours.
        if node is None or not lo <= sequence_nr(node) < hi:
            return
        roots = [node]
    else:
        roots = []
        for tensor in iter_tensors(output):
            node = tensor.grad_fn
            if node is not None and lo <= sequence_nr(node) < hi and node not in roots:
                roots.append(node)
        if not roots:
            return
    for node in roots:
        watch = _watch(tracker, node)
        if not watch.starts:
            node.register_prehook(watch.started)
        watch.starts.append(call)
    for node in _frontier(roots, lo, hi):
        watch = _watch(tracker, node)
        if not watch.ends:
            node.register_hook(watch.ended)
        watch.ends.append(call)


def _watch(tracker: Tracker, node: Any) -> _NodeWatch:
    # Keyed by thread and sequence number (counted per thread), so that nothing holds the node (and so the tensors it saved).
    # Nodes accept no weak references.
    key = (threading.get_ident(), sequence_nr(node))
    watch = tracker.watches.get(key)
    if watch is None:
        watch = tracker.watches[key] = _NodeWatch(tracker)
    return watch


def _frontier(roots: list[Any], lo: int, hi: int) -> list[Any]:
    """Nodes made inside ``[lo, hi)`` whose successors are all outside it: the last of them to run ends the call's
    backward. AccumulateGrad nodes have the largest sequence number and so count as outside."""
    seen = set(roots)
    todo = list(roots)
    frontier = []
    while todo:
        node = todo.pop()
        inner = False
        for successor, _ in node.next_functions:
            if successor is not None and lo <= sequence_nr(successor) < hi:
                inner = True
                if successor not in seen:
                    seen.add(successor)
                    todo.append(successor)
        if not inner:
            frontier.append(node)
    return frontier
