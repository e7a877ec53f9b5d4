"""Collection: which module runs and when, in the forward and in the backward pass.

Forward boundaries come from module pre/post hooks. Backward boundaries come from hooks on the autograd graph
nodes that a call's forward *created*: every node created between a module's pre-hook and post-hook has a
sequence number in ``[seq_start, seq_end)``, so the calls own nodes by number, whatever they returned.

When an outermost call returns, its graph is walked once, from its outputs (and those of the calls inside it)
down through the nodes it created, each node visited once. A node is an *entry* of a call when a node outside
the call leads to it (the first of a call's nodes to run must be one), and an *exit* when one of its successors
is not the call's or it has none (the last to finish must be one, even in a pass that prunes the nodes it does
not need, as ``autograd.grad(loss, inputs)`` does with weight gradients). Entries get a pre-hook that starts the
call's backward, exits a post-hook that ends it. Nodes replaced by in-place ops after the call (a view
output rewritten by ``relu_``: the view node never runs) are therefore not needed, nor is the output at all
(a module returning None, its result kept on ``self`` and read by its parent, is found through the parent's
graph).

Each backward pass (graph task) through a call gives its own interval; a call's backward time is the sum of its
intervals, so ``retain_graph=True`` and ``autograd.grad(create_graph=True)`` followed by another backward never
count the time between passes. Nodes created by a backward pass (double backward) belong to no call: they are
timed by no module. Nothing is wrapped: no tensor, no ``BackwardHookFunction``, so in-place ops, inputs that
need no grad, keyword arguments and dict/dataclass outputs all work, and outputs and gradients are bitwise those
of an unprofiled run. The tracker only stamps instants; turning stamps into milliseconds happens after the step
(``timing.py``).
"""
from __future__ import annotations

import sys
import threading
from bisect import bisect_right
from typing import Any, Callable, Iterable

import torch
from torch import nn

from .clock import Clock, CpuClock, make_clock
from .._tensors import first_tensor, iter_tensors
from .._torch import graph_task_id as _graph_task_id
from .._torch import next_sequence_nr as _next_sequence_nr
from .._torch import escaped_backward, queue_engine_callback
from .._torch import sequence_nr

__all__ = ["CallTrace", "Tracker"]



class CallTrace:
    """Raw stamps of one call of one module. ``recompute`` marks a forward run during backward (checkpointing).

    The backward interval being filled is ``bwd_start``/``bwd_end`` in graph task ``bwd_task``; intervals of
    earlier passes through the same call are kept in ``bwd_done``."""

    __slots__ = (
        "name", "parent", "clock", "recompute", "seq_start", "seq_end",
        "fwd_start", "fwd_end", "bwd_task", "bwd_start", "bwd_end", "bwd_done", "raised", "handling",
    )

    def __init__(self, name: str, parent: CallTrace | None, clock: Clock, recompute: bool) -> None:
        self.name = name
        self.parent = parent
        self.clock = clock
        self.recompute = recompute
        self.seq_start = self.seq_end = 0  # seq_end stays 0 until the call returns: it owns no node before that
        self.fwd_start: Any = None
        self.fwd_end: Any = None
        self.bwd_task = -1
        self.bwd_start: Any = None
        self.bwd_end: Any = None
        self.bwd_done: list[tuple[Any, Any]] | None = None
        self.raised = False
        self.handling: BaseException | None = None  # an exception already being handled when the call began


    def backward_intervals(self) -> list[tuple[Any, Any]]:
        """Every complete (start, end) stamp pair of this call's backward, one per backward pass."""
        done = list(self.bwd_done) if self.bwd_done else []
        if self.bwd_start is not None and self.bwd_end is not None:
            done.append((self.bwd_start, self.bwd_end))
        return done


class Tracker:
    """Puts forward hooks on modules, graph hooks on the nodes their forward creates, and collects CallTraces."""

    def __init__(self, sync: bool = False) -> None:
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
        self.observers: tuple[Any, ...] = ()  # set between steps by the profiler
        # Told ``backward_start(calls)``/``backward_end(calls)`` from the graph hooks; empty on the default path.
        self.backward_observers: tuple[Any, ...] = ()
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
            self._local.tree = []  # the calls of the current outermost call, in creation (sequence) order
            self._local.roots = []  # output nodes of the calls inside it, walked with its own
            return self._local.stack

    def reset_stack(self) -> None:
        """Forget calls left open on this thread (between steps, no forward is running)."""
        self._stack().clear()
        self._local.tree = []
        self._local.roots = []

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
            if stack:
                local.tree.append(call)
            else:
                local.tree = [call]
                local.roots = []
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
                if stack:
                    _add_roots(local.roots, output, call.seq_start, call.seq_end)
                else:
                    own: list[Any] = []
                    _add_roots(own, output, call.seq_start, call.seq_end)
                    _watch_backward(call, local.tree, own, local.roots, tracker)
            if not stack:
                local.tree, local.roots = [], []
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


def backward_note(tracker: Tracker, error: BaseException, traceback: Any) -> str | None:
    """The note for an exception that escaped a backward pass, naming the module whose backward ran last."""
    call = tracker.backward_in
    if call is None or has_note(error) or not escaped_backward(traceback):
        return None
    return raised_note(call.name, tracker.types.get(call.name, "?"), ", during its backward")


def _unwind_to(stack: list[CallTrace], name: str) -> CallTrace | None:
    for depth in range(len(stack) - 1, -1, -1):
        if stack[depth].name == name:
            del stack[depth + 1 :]
            return stack[depth]
    return None


# -- backward: hooks on the graph nodes a call created ------------------------------------------------------
def _backward_enters(tracker: Tracker, call: CallTrace, task: int) -> None:
    """Remember the innermost call whose backward begins, for the note on an exception that escapes the pass."""
    if task != tracker.backward_task:
        tracker.backward_task = task
        # Runs once per backward pass, after everything else in it, and not when the pass fails: a failed pass
        # leaves its last module for the note.
        queue_engine_callback(lambda: _backward_done(tracker))
    tracker.backward_in = call


def _backward_done(tracker: Tracker) -> None:
    tracker.backward_in = None
    tracker.backward_task = -1


def _add_roots(roots: list[Any], output: Any, lo: int, hi: int) -> None:
    """The graph nodes of ``output``'s tensors made inside ``[lo, hi)`` (a tensor passed through is not ours)."""
    if isinstance(output, torch.Tensor):
        node = output.grad_fn
        if node is not None and lo <= sequence_nr(node) < hi:
            roots.append(node)
        return
    for tensor in iter_tensors(output):
        node = tensor.grad_fn
        if node is not None and lo <= sequence_nr(node) < hi:
            roots.append(node)


class _Starts:
    """Pre-hook of an entry node: opens, in the running backward pass, the interval of the calls it enters."""

    __slots__ = ("tracker", "calls")

    def __init__(self, tracker: Tracker, calls: list[CallTrace]) -> None:
        self.tracker = tracker
        self.calls = calls

    def __call__(self, grad_outputs: Any) -> None:
        tracker = self.tracker
        if not tracker.active:
            return None
        task = _graph_task_id()
        _backward_enters(tracker, self.calls[0], task)
        opening = [call for call in self.calls if call.bwd_task != task]
        if not opening:
            return None
        for observer in tracker.backward_observers:
            # Before the stamp, so that the observers' own cost is not timed as the calls' backward.
            observer.backward_start(opening)
        stamp = opening[0].clock.now()
        for call in opening:
            if call.bwd_start is not None and call.bwd_end is not None:  # an earlier pass through this call
                if call.bwd_done is None:
                    call.bwd_done = []
                call.bwd_done.append((call.bwd_start, call.bwd_end))
            call.bwd_task, call.bwd_start, call.bwd_end = task, stamp, None
        return None


class _Ends:
    """Post-hook of a frontier node: the latest end of the calls it closes, in the running backward pass."""

    __slots__ = ("tracker", "calls")

    def __init__(self, tracker: Tracker, calls: list[CallTrace]) -> None:
        self.tracker = tracker
        self.calls = calls

    def __call__(self, grad_inputs: Any, grad_outputs: Any) -> None:
        tracker = self.tracker
        if not tracker.active:
            return None
        task = _graph_task_id()
        stamp = self.calls[0].clock.now()
        closing = [call for call in self.calls if call.bwd_task == task]
        for call in closing:
            call.bwd_end = stamp
        if closing:
            # Backward goes on in the enclosing call, if its pass is running (for the note on an exception).
            outer = closing[-1].parent
            tracker.backward_in = outer if outer is not None and outer.bwd_task == task else None
            for observer in tracker.backward_observers:
                observer.backward_end(closing)
        return None


def _outside(call: CallTrace, seq: int) -> list[CallTrace]:
    """``call`` and its enclosing calls, innermost first, up to the first that owns node number ``seq``."""
    chain = []
    while call is not None and not call.seq_start <= seq < call.seq_end:
        chain.append(call)
        call = call.parent  # type: ignore[assignment]
    return chain


def _watch_backward(outer: CallTrace, tree: list[CallTrace], own: list[Any], nested: list[Any],
                    tracker: Tracker) -> None:
    """Walk the nodes that ``outer`` (an outermost call) and the calls inside it created, once each, from its
    output nodes (``own``) and those of the calls inside it (``nested``), and hook the entry and frontier nodes
    of every call (see the module docstring)."""
    lo, hi = outer.seq_start, outer.seq_end
    starts = [call.seq_start for call in tree]  # ascending: calls are made in sequence-number order

    def owner(seq: int) -> CallTrace:  # the innermost call that created node number ``seq``
        call = tree[bisect_right(starts, seq) - 1]
        while not seq < call.seq_end:
            call = call.parent  # type: ignore[assignment]
        return call

    entries: dict[Any, list[CallTrace]] = {}
    owners: dict[Any, CallTrace] = {}
    todo = []
    for root in (*own, *nested):
        if root in owners:
            continue
        owners[root] = call = owner(sequence_nr(root))
        entries[root] = _outside(call, -1)  # backward enters here from outside every call
        todo.append(root)
    outermost_roots = set(own)
    frontier: list[tuple[Any, list[CallTrace]]] = []
    while todo:
        node = todo.pop()
        call = owners[node]
        seq = sequence_nr(node)
        # The calls this node may be the last of: those for which one of its successors is not theirs (the path
        # leaves the call here; a pass that needs only some gradients, autograd.grad(loss, inputs), prunes the
        # rest) or that have no successor of theirs at all. Nodes whose every successor is in the call are not.
        chain = _outside(call, -1)
        leaves = 0  # how many of the innermost calls some successor is not in
        successors = 0
        from_outside = node in outermost_roots
        for successor, _ in node.next_functions:
            if successor is None:
                continue
            successors += 1
            successor_seq = sequence_nr(successor)
            if not lo <= successor_seq < hi:
                leaves = len(chain)  # made before the outermost call (its inputs), or an AccumulateGrad
                continue
            leaves = max(leaves, len(_outside(call, successor_seq)))
            successor_owner = owners.get(successor)
            if successor_owner is None:
                successor_owner = owners[successor] = owner(successor_seq)
                entries[successor] = []
                todo.append(successor)
            # The calls the successor belongs to and this node does not: the chain enters them here. A root of
            # the outermost output may be replaced by an in-place op after the call and never run: its
            # successors then count as entries too.
            entered = _outside(successor_owner, -1 if from_outside else seq)
            known = entries[successor]
            known.extend(c for c in entered if c not in known)
        if not successors:
            leaves = len(chain)
        if leaves:
            frontier.append((node, chain[:leaves]))
    for node, calls in entries.items():
        if calls:
            node.register_prehook(_Starts(tracker, calls))
    for node, calls in frontier:
        node.register_hook(_Ends(tracker, calls))

