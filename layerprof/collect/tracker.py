"""Collection: which module runs and when, in the forward and in the backward pass.

Forward boundaries come from module pre/post hooks. Backward boundaries come from hooks on the autograd graph
nodes that the module's forward *created*, never from what it returned: every node created between a module's
pre-hook and post-hook has a sequence number in ``[seq_start, seq_end)``, and the innermost call open when a node
was made is its *owner*. For each call the tracker walks the graph from the call's outputs (or, for a call that
returns nothing with a graph, from the tensors it left on its module) through the nodes of its range that no
earlier walk reached, so each node is walked once per step, and puts one pre-hook on each. The walks are made in
the order the calls returned: an outermost call's as it returns, after those of the calls inside it, which wait
for it (``_walk_later``; a backward pass that starts before, or a call that raises, makes them first). A walk
stops at its range's lower end; a node below it that no walk reached yet is the enclosing call's own (a parent's
code between two children, which the parent's walk cannot reach through the children's walked nodes): it is
handed to the innermost enclosing call whose range holds it, and that call's walk hooks it. A node no profiled
call made (the user's code before the model) gets a hook that only ends the previous owner's interval.

In backward, a node's pre-hook starts its owner's interval for the running pass (graph task) if not started
yet, and ends the interval of the owner of the node that started before it in the same pass: a node's work lasts
until the engine starts the next node, gradient bookkeeping (input-buffer adds, the AccumulateGrad nodes of its
parameters) included. The last owner of a pass ends when the pass finishes (a callback queued on the graph task).
So there is one hook per node and no post-hook; a call's interval in a pass is the span of its own nodes, widened
after the step to its sub-calls' intervals (``timing.py``). The hook is the owner itself (a callable), held in a
dict ``{0: owner}`` that all the nodes of one owner hooked by one walk share (``NodeHooker``: torch's hook of a
tensor's gradient, put on the node): no hook object, handle or dict per node. It runs before the node's other
pre-hooks, and before the hooks put on the node's output tensors after the call returned (not those put inside
its forward, which run first).

Because every created node carries a hook, in-place ops that rewrite an output view's history (``h.relu_()``
after a Linear on 3-D input), outputs that are views, None, or tensors made elsewhere do not lose the call's
backward, and a pass that prunes some nodes (``autograd.grad(loss, x)``) still ends every call. Each backward
pass gives its own interval. Nothing is wrapped: no tensor, no ``BackwardHookFunction``, so outputs and
gradients are bitwise those of an unprofiled run.

The tracker only stamps instants; turning stamps into milliseconds happens after the step (``timing.py``).
"""
from __future__ import annotations

import functools
import sys
import threading
import types
from collections import abc
from bisect import bisect_right
from operator import attrgetter, itemgetter
from time import perf_counter_ns
from typing import Any, Callable, Iterable, Sequence

import torch
from torch import nn

from .clock import Clock, CpuClock, host_stamped, make_clock
from .environment import input_facts
from .reuse import Entries
from .._tensors import first_tensor, iter_tensors
from .._torch import graph_task_id as _graph_task_id
from .._torch import next_sequence_nr as _next_sequence_nr
from .._torch import add_call_wrapper, add_forward_hooks_to, escaped_backward, remove_call_wrapper
from .._torch import add_forward_hooks, calling_around, hook_key, remove_forward_hooks
from .._torch import add_backward_entry_hook, remove_backward_entry_hook
from .._torch import remove_forward_hooks_from
from .._torch import faked
from .._torch import NodeHooker
from .._torch import batched_grad_fn as _batched_grad_fn
from .compiled import refuse_compiled_wrapper
from .._torch import queue_backward_callback as _queue_backward_callback
from .._torch import sequence_nr as _sequence_nr

__all__ = ["CallTrace", "Tracker"]

_Tensor = torch.Tensor
# What ``attach`` takes as it is: ``collections.abc.Sequence``, not ``typing``'s alias, whose isinstance runs two
# frames of Python code more (cold as a block starts).
_SEQUENCES = abc.Sequence
_first, _second = itemgetter(0), itemgetter(1)
_pre_hooks = attrgetter("_forward_pre_hooks")
# The exception being handled, without the tuple sys.exc_info() builds, where Python has sys.exception (3.11 on).
_handled: Callable[[], BaseException | None] = getattr(sys, "exception", None) or (lambda: sys.exc_info()[1])


class _Step:
    """What the graph hooks of one step share: whether the step is still open (hooks on a graph that outlives
    its step do nothing), the backward observers to tell, and per backward pass (graph task) the call whose
    node started last, which ends when the next node of the pass starts or the pass finishes."""

    __slots__ = ("open", "observers", "pending", "_outside", "late")

    def __init__(self, observers: tuple[Any, ...] = (), late: dict[str, None] | None = None) -> None:
        self.open = True
        self.observers = observers
        self.pending: dict[int, CallTrace | Outside] = {}
        self._outside: Outside | None = None
        # The tracker's names (a dict, in order) of calls whose backward began only after their step was closed
        # (``Tracker.late``).
        self.late = late

    def began_late(self, call: CallTrace) -> None:
        """A node of ``call``, a call of this closed step that had no backward in it, started: its backward runs
        after ``prof.step()`` ended the step (called between the forward and the backward), untimed."""
        late = self.late
        if late is not None and call.name not in late:  # (a dict: each of a call's nodes asks)
            late[call.name] = None

    def pass_finished(self, task: int) -> None:
        """Run by the engine when backward pass ``task`` is over: ends the call whose node ran last."""
        call = self.pending.pop(task, None)
        if call is not None and self.open:
            call.close(task)

    def outside(self) -> Outside:
        """The stand-in owner of this step's nodes made outside every profiled call."""
        if self._outside is None:
            self._outside = Outside(self)
        return self._outside


class Outside:
    """The owner, in backward, of a node that a profiled call's graph leads to but that no profiled call made (the
    user's code before the model, or between two top-level modules): its start ends the previous owner's interval,
    so that work is not timed as that module's backward, and an exception raised from it is not blamed on one."""

    __slots__ = ("step",)
    task = None  # never has an interval of its own: not timed
    name = None

    def __init__(self, step: _Step) -> None:
        self.step = step

    def node_started(self, grad_outputs: Any) -> None:
        step = self.step
        if step.open:
            task = _graph_task_id()
            pending = step.pending
            previous = pending.get(task)
            if previous is None and task not in pending:
                _queue_backward_callback(functools.partial(step.pass_finished, task))
            pending[task] = self
            if previous is not None and previous is not self:
                previous.close(task)
        return None

    def close(self, task: int) -> None:
        return None

    __call__ = node_started  # what a graph node's hook dict holds (``NodeHooker``)


class CallTrace:
    """Raw stamps of one call of one module. ``recompute`` marks a forward run during backward (checkpointing).

    Backward: ``task`` is the backward pass (graph task id) of the current interval ``[bwd_start, bwd_end]``, the
    span of this call's *own* nodes (not its sub-calls') in that pass; ``passes`` keeps ``(task, start, end)`` of
    the earlier passes, None while there is one."""

    __slots__ = (
        "name", "parent", "clock", "recompute", "seq_start", "seq_end", "fwd_start", "fwd_end",
        "task", "bwd_start", "bwd_end", "passes", "observed_task", "raised", "handling", "step", "deferred",
        "elsewhere", "during", "claimed",
    )

    def __init__(self, name: str, parent: CallTrace | None, clock: Clock, recompute: bool, step: _Step) -> None:
        self.name = name
        self.parent = parent
        self.clock = clock
        self.recompute = recompute
        self.seq_start = self.seq_end = 0
        self.fwd_start: Any = None
        self.fwd_end: Any = None
        self.task: int | None = None
        self.bwd_start: Any = None
        self.bwd_end: Any = None
        self.passes: list[tuple[int, Any, Any]] | None = None
        self.observed_task: int | None = None
        self.raised = False
        self.handling: BaseException | None = None  # an exception already being handled when the call began
        self.step = step
        # Nodes of this call's range that a sub-call's walk met but does not own (this call's own code between
        # sub-calls): hooked by this call's walk, which cannot reach them through the sub-calls' walked nodes.
        self.deferred: list[Any] | None = None
        # Made with no call open on its thread: the call another thread was running then (a DataParallel replica's
        # call runs inside the wrapper's, on a thread of its own), which the ancestors' figures read as around it
        # (``record/adoption.py``).
        self.elsewhere: CallTrace | None = None
        # Made by a backward pass with no call open on its thread (an ``autograd.Function``'s backward re-running a
        # module: reentrant checkpointing, torchdiffeq's adjoint): the call whose node that pass was running, whose
        # backward interval holds this call's forward and the nested backward pass through its graph.
        self.during: CallTrace | None = None
        # (``claimed``, set only where there are some: the sequence numbers of nodes made after the call's end that
        # are its own, the node torch wraps the outputs of a module with full backward hooks in; unset, not read
        # by the hot path.)

    # -- graph node hooks: a node holds the call (in its hook dict) and never the other way round --------------
    def node_started(self, grad_outputs: Any) -> None:
        # This node's start ends the previous node's owner (with the engine's work after that node: adding gradients
        # into input buffers, a full-size add for a weight shared by several modules, and the AccumulateGrad nodes
        # of its parameters), and this node's owner runs until the next node of the pass starts or the pass
        # finishes. No post-hook needed, and a pass that prunes some of a call's nodes (``autograd.grad(loss, x)``
        # skips the weight-gradient nodes) still ends it.
        step = self.step
        task = _graph_task_id()
        pending = step.pending
        previous = pending.get(task)
        if previous is self:  # another node of the call already running: nothing changes
            return None
        if not step.open:  # a graph that outlives its step
            if self.task is None:
                step.began_late(self)
            return None
        if previous is None:
            _queue_backward_callback(functools.partial(step.pass_finished, task))
        pending[task] = self
        stamp = None
        if previous is not None and previous.task == task:
            stamp = previous.clock.now()  # previous.close(task), inline: this runs for every graph node
            # Stamps that do not order themselves (CUDA events) carry the host time at which they were recorded:
            # merging sub-calls' intervals after the step needs the first start and the last end.
            if type(stamp) is not int:
                stamp = (perf_counter_ns(), stamp)
            previous.bwd_end = stamp
            if previous.clock is not self.clock:
                stamp = None
        if step.observers:
            self._observe_start(task)
            stamp = None  # observers run between the two: their cost is in neither interval
        if task != self.task:
            if self.task is not None:
                if self.passes is None:
                    self.passes = []
                self.passes.append((self.task, self.bwd_start, self.bwd_end))
                self.bwd_end = None
            self.task = task
            if stamp is None:  # else the previous owner's end, on the same clock, is this one's start
                stamp = self.clock.now()
                if type(stamp) is not int:
                    stamp = (perf_counter_ns(), stamp)
            self.bwd_start = stamp
        return None

    __call__ = node_started  # what a graph node's hook dict holds (``NodeHooker``)

    def node_ended(self, grad_inputs: Any, grad_outputs: Any) -> None:
        """Post-hook of a node with no successor of the same owner, only while observers want ends as they come."""
        step = self.step
        if step.open and step.observers:
            chain = []
            call: CallTrace | None = self
            while call is not None:
                chain.append(call)
                call = call.parent
            for observer in step.observers:
                observer.backward_end(chain)
        return None

    def close(self, task: int) -> None:
        """End the current interval now, if it belongs to backward pass ``task``."""
        if task == self.task:
            self.bwd_end = host_stamped(self.clock)

    def _observe_start(self, task: int) -> None:
        """Tell observers which calls (this one and the enclosing ones) begin their backward in this pass; before
        our stamp, so that their own cost is not timed as the calls' backward."""
        starting = []
        call: CallTrace | None = self
        while call is not None and call.observed_task != task:
            call.observed_task = task
            starting.append(call)
            call = call.parent
        if starting:
            for observer in self.step.observers:
                observer.backward_start(starting)


# Each thread's NodeHooker, shared by every tracker: its carrier tensor is made once per thread, not in the first
# forward of every block (cold after a step, about 50 µs on BERT). Sharing is safe: a walk sets the carrier's dict
# before its first node and hooks its nodes with no other code of its thread running between the two, and only its
# own thread clears it: a recomputation's walk as it ends (``_walk``), and ``_ThreadState.clear``.
_HOOKERS = threading.local()


def _thread_hooker() -> NodeHooker:
    try:
        return _HOOKERS.hooker
    except AttributeError:
        hooker = _HOOKERS.hooker = NodeHooker()
        return hooker


# Each thread's walks put off until its outermost call returns (``_walk_later``), every tracker's in one list, in the
# order the calls returned, four items a walk: its thread state, the call, its start node (or a list of them), and
# whether every node of the range is the call's own. Flat, with a lone start node as it is: a walk put off keeps no
# object of its own alive until it is made (each would count towards the next garbage collection, and a forward of
# 1,500 calls triggered several).
_PENDING = threading.local()
# Walks put off at most, per thread: a forward that loops on (a rollout inside a module's call) and drops what its
# inner calls return keeps no more of their graphs past their time than this many calls'.
_MOST_PENDING = 4096


def _thread_pending() -> list[Any]:
    try:
        return _PENDING.walks
    except AttributeError:
        walks = _PENDING.walks = []
        return walks


def walk_pending() -> None:
    """Make this thread's walks that wait for its outermost call to return: a backward pass is about to start
    (``add_backward_entry_hook``), which may run their nodes."""
    walks = getattr(_PENDING, "walks", None)
    if walks:
        _walk_all(walks)


def _walk_reached(walks: list[Any], grad: Any) -> None:
    """The hook a put-off walk's start node carries after its owner's: a backward pass that reached it before the
    walks were made (one started without ``torch.autograd``, TorchScript's ``torch.autograd.grad`` in a forward)
    makes them now, on the pass's thread, while the thread that put them off waits for the pass."""
    if walks:
        _walk_all(walks)


def _walk_all(walks: list[Any]) -> None:
    """Make the walks put off, in the order their calls returned (a call's sub-calls before it, as when each walk
    runs as its call returns), and empty the list."""
    todo = iter(walks.copy())
    walks.clear()
    for state, call, nodes, own in zip(todo, todo, todo, todo):
        if call.step.open:  # (else its step ended with the call still open, and its hooks would do nothing)
            _walk_nodes(call, nodes if type(nodes) is list else [nodes], state, own)


class _ThreadState:
    """Per thread: the open calls, and which call owned each range of sequence numbers during the step."""

    __slots__ = ("stack", "bounds", "owners", "walked", "hooker", "pending", "early", "walk_pending", "thread")

    def __init__(self) -> None:
        self.stack: list[CallTrace] = []
        # bounds[i] is the sequence number the next node had at the i-th pre/post hook, owners[i] the innermost
        # call open just after it: a node numbered s was made under owners[bisect_right(bounds, s) - 1].
        self.bounds: list[int] = []
        self.owners: list[CallTrace | None] = []
        self.walked: set[int] = set()  # sequence numbers of the nodes walked this step (ints: no node kept alive)
        self.hooker = _thread_hooker()  # hooks graph nodes with their owner's hook dict ``{0: owner}``
        self.pending = _thread_pending()  # the thread's walks put off, shared by every tracker (``_walk_later``)
        # Sequence numbers of the start nodes of walks put off, hooked as their calls returned (``_walk_later``),
        # and what those nodes call after their owner: the walks put off, made if a pass reaches one first.
        self.early: set[int] = set()
        self.walk_pending = functools.partial(_walk_reached, self.pending)
        self.thread = threading.get_ident()

    def clear(self) -> None:
        self.stack.clear()
        self.bounds.clear()
        self.owners.clear()
        self.walked.clear()
        self.early.clear()
        # The hooker is the thread's, shared by every profiler: cleared from its own thread only. From another,
        # a walk there (another profiler's) may be between setting its dict and hooking a node, which with the
        # dict gone hands torch a null dict (a crash). A recomputation's walk, which runs on autograd's threads,
        # lets go of its last dict as it ends.
        if threading.get_ident() == self.thread:
            self.hooker.clear()
            pending = self.pending
            if pending:  # walks of a call still open as its step ends (an interrupted forward): never made
                items = iter(pending)
                pending[:] = [item for walk in zip(items, items, items, items) if walk[0] is not self
                              for item in walk]


# The tracker of the last block that made a profile, reset to as new, for the next block to take (``Tracker.made``):
# a one-shot block right after a step then makes no tracker, thread-local store, lock and hook functions. One at
# most (a second block that ends meanwhile lets its own go).
_PARKED: list[Tracker] = []


class Tracker:
    """Times module calls (a call wrapper, hooks where a module has its own), puts graph hooks on the nodes their
    forward creates, and collects CallTraces."""

    @classmethod
    def made(cls, sync: bool = False, cpu_clock: CpuClock | None = None) -> Tracker:
        """``cls(sync, cpu_clock)``, or for the default settings (no sync, the plain wall clock) the tracker a block
        parked (``park``), which is as new."""
        if cpu_clock is None and not sync and _PARKED:
            try:
                tracker = _PARKED.pop()
            except IndexError:  # taken by another thread meanwhile
                pass
            else:
                if type(tracker) is cls:
                    return tracker
                tracker._hooks = None  # (a subclass's block: this one goes, with its hooks' reference to it)
        return cls(sync=sync, cpu_clock=cpu_clock)

    def __init__(self, sync: bool = False, cpu_clock: CpuClock | None = None) -> None:
        self.sync = sync
        # Modules are timed by a function torch's ``Module._call_impl`` calls while a block runs (``add_call_wrapper``):
        # one for a block whatever the model's size, nothing written into a module's hook dicts (a module that
        # carries a hook can run otherwise: ``nn.TransformerEncoderLayer`` takes its fused inference path only
        # where it and its children carry none), and no hook dispatch in torch for a module without hooks. Only a
        # module with hooks of its own gets hooks of ours, placed so that the user's are not timed.
        self.calls: list[CallTrace] = []
        # How many of ``calls`` returned from their forward (the post-hook's normal path): equal to their number,
        # every call returned (``all_returned`` without a pass over them, cold after the step). Reset with ``calls``;
        # a lost update between threads only makes it smaller, so that the pass is made.
        self.returned = 0
        self.active = False
        # The batch size and dtype of the first tensor the model's root was called with (``input_facts``), noted by
        # the call wrapper: no forward pre-hook of its own on the root.
        self.example: dict[str, Any] = {}
        # id of a module's forward pre-hook dict -> the module's qualified name, for every module ever attached.
        # Keyed by the dict, not the module: a DataParallel replica (or a copy.copy) shares its original's hook
        # dicts and its calls are the original's; a deep copy has dicts of its own and is not profiled.
        self.names: dict[int, str] = {}
        # The same for the modules whose calls the call wrapper times: not those with hooks of their own, which get
        # a pre-hook of ours after theirs and a hook before theirs, so that the user's hooks are not timed.
        self.wrapped_names: dict[int, str] = {}
        self._wrapper: int | None = None  # what add_call_wrapper returned
        # What add_backward_entry_hook returned: while set, inner calls' walks wait for the outermost call to return
        # (``_walk_later``), and a backward pass started before that makes them first.
        self._entry: int | None = None
        # Whether the start nodes of the walks put off are hooked as their calls return, with a hook that makes the
        # walks put off (``_walk_later``): where TorchScript, which starts a backward pass without torch.autograd,
        # may run in the forward (the profiler reads it before each attach). About 0.5 µs a call.
        self.early_hooks = True
        self._token: object | None = None  # the token of the call wrapper of the attach under way
        # What each attach hooked, (name, module) pairs, for the class names in the notes on exceptions: searched
        # then, not made into a dict by name at every block (ten thousand entries to make and free for a note).
        self._attached: list[Sequence[tuple[str, nn.Module]]] = []
        # The wall clock of CPU modules: a PausableClock when a meter must stop it (``Meter.pauses_clock``).
        self.cpu_clock = cpu_clock if cpu_clock is not None else CpuClock()
        self.cuda_clocks: dict[int, Clock] = {}
        self.observers: tuple[Any, ...] = ()  # set between steps by the profiler, as are backward_observers
        # Names of calls whose backward began after their step was closed (``_Step.began_late``), for the profiler
        # to warn of; a parked tracker starts a new list (the graphs of its last block may still run).
        self.late: dict[str, None] = {}
        self.step_state = _Step((), self.late)
        self._local = threading.local()
        self._threads: list[_ThreadState] = []
        self._threads_lock = threading.Lock()
        self._handles: list[Any] = []
        # The pre-hook and hook put on the modules with hooks of their own, and what makes the call wrapper (the
        # name is looked up from the module's pre-hook dict: no closure made per module); made at the first attach.
        self._hooks: tuple[Callable[..., None], Callable[..., None], Callable[..., Any]] | None = None
        self.lent = False  # handed to something that may outlive the block (a RootStep): never parked

    @property
    def backward_observers(self) -> tuple[Any, ...]:
        """Told ``backward_start(calls)``/``backward_end(calls)`` from the graph hooks; empty on the default path."""
        return self.step_state.observers

    @backward_observers.setter
    def backward_observers(self, observers: Sequence[Any]) -> None:
        self.step_state.observers = tuple(observers)

    # -- lifecycle -------------------------------------------------------------------------------------------
    def attach(self, modules: Iterable[tuple[str, nn.Module]], names: dict[int, str] | None = None,
               around: list[nn.Module] | None = None) -> None:
        """Hook every module; if hooking fails half way, remove what was added and re-raise. ``names``: the
        modules' names by key (``id`` of each one's forward pre-hook dict), and ``around``: those whose calls skip
        the call wrapper (``calling_around``), where the caller has them already."""
        if self._hooks is None:
            self._hooks = self._make_hooks()
        pre, post, make_call = self._hooks
        # A sequence as it is, such as a block's ``Entries`` (pairs made when read, not all at once), told apart
        # first without the ABC's check (a frame of Python code).
        if type(modules) is not Entries and not isinstance(modules, _SEQUENCES):
            modules = list(modules)
        # The modules without their names, read where needed: not on the common path of a reused plan (names and
        # the modules calling around the wrapper given), where a list of ten thousand costs a pass.
        found = list(map(_second, modules)) if names is None or around is None else []
        try:
            if names is None:
                names = dict(zip(map(id, map(_pre_hooks, found)), map(_first, modules)))
            self.names.update(names)
            self._attached.append(modules)
            self.wrapped_names.update(names)
            # A module whose calls skip Module._call_impl (a class with a _call_impl of its own, a disabled
            # compile) gets a pre-hook of ours after its own and a hook before its own, on it for the block; the
            # calls of every other module are timed by the call wrapper.
            if around is None:
                around = calling_around(found)
            if around:
                _drain_keys(self.wrapped_names, around)
                self._handles.append(add_forward_hooks_to(around, pre, post))
            self.active = True  # (before the wrapper: a call it begins on another thread then ends as well)
            if self._wrapper is None:
                # The wrapper times calls while this attach's token is the tracker's: one left inside another
                # tool's function after its block (``add_call_wrapper``) never does again, this tracker reused or not.
                self._token = token = object()
                self._wrapper = add_call_wrapper(functools.partial(make_call, token=token))
            if self._entry is None:
                self._entry = add_backward_entry_hook(walk_pending)
        except BaseException:
            self.detach()
            raise

    def forget(self, modules: list[nn.Module]) -> None:
        """Stop timing ``modules`` (they left the model) and let go of them: their keys out of the name tables (a
        later object at one's address is no module of the block), and out of the entries attached."""
        for module in modules:
            key = id(module._forward_pre_hooks)
            self.names.pop(key, None)
            self.wrapped_names.pop(key, None)
        gone = set(map(id, modules))
        self._attached = [[entry for entry in attached if id(entry[1]) not in gone] for attached in self._attached]

    def drop_copied_hooks(self, module: nn.Module) -> None:
        """Take off the hooks of this tracker that ``module`` carries without having been attached: a deep copy
        of a hooked module copies its hook dicts. Else a copy that joins the model is hooked twice (its calls
        counted twice) and keeps the copied pair after the block."""
        if self._hooks is None:
            return
        pre, post, _ = self._hooks
        copied = {key for key, hook in getattr(module, "_forward_pre_hooks", {}).items() if hook is pre}
        copied.update(key for key, hook in getattr(module, "_forward_hooks", {}).items() if hook is post)
        for key in copied:
            remove_forward_hooks(module, key)

    def detach(self, ended: bool = False) -> None:
        """Remove every module hook. Graph hooks die with the graph and do nothing once their step has ended
        (``ended``: the step was just closed by ``end_step``, with no forward since)."""
        self._token = None  # (first: a call the wrapper begins from now on is not one the hooks cannot end)
        self.active = False
        if not ended:
            self.end_step()
        # Hooks copied onto a deep copy of a module outlive the detach and hold this tracker: it must not hold
        # the modules (attach fills this again; a note needs it only while hooked).
        self._attached = []
        handles, self._handles = self._handles, []
        wrapper, self._wrapper = self._wrapper, None
        self.wrapped_names.clear()
        if wrapper is not None:
            remove_call_wrapper(wrapper)
        entry, self._entry = self._entry, None
        if entry is not None:
            remove_backward_entry_hook(entry)
        for added in handles:
            remove_forward_hooks_from(added)

    def release(self, ended: bool = False) -> None:
        """Detach, and drop the hook functions, which hold this tracker: once the block is over nothing refers
        back to it (a reference cycle would keep it and its step's state until a garbage collection). A deep
        copy of a hooked module made inside the block holds the same functions in its copied hook dicts (a
        function is copied as itself), and through them this tracker for the copy's life: the per-call state
        goes now, not with the tracker (the last step's calls, each thread's stack and owners, the step's
        observers), so that the copy keeps none of it."""
        self.detach(ended)
        self._let_go()

    def clear_calls(self) -> None:
        """Forget the calls recorded so far, and the count of those that returned with them (the hooks hold the
        list: it is emptied, not replaced)."""
        self.calls.clear()
        self.returned = 0

    def _let_go(self) -> None:
        """Drop the hook functions and the per-call state (see ``release``) of a detached tracker."""
        self._hooks = None
        self.clear_calls()
        self.names.clear()
        self.step_state = _Step()
        self.observers = ()
        with self._threads_lock:
            for state in self._threads:
                state.clear()

    def park(self, made_profile: bool) -> None:
        """The end of a detached tracker. Where its block ``made_profile`` (nothing of the block is needed any more:
        its calls and example were copied out) and it is as ``made`` would make it (the default settings, hooks that
        ran on one thread at most and that the one parking it, so that no hook of another thread can still append a
        call after the reset, nothing holding it), it is reset to as new and kept for the next block: its hook
        functions read the same lists and dicts, emptied. Else its hook functions and per-call state are dropped
        (as ``release`` does)."""
        threads = self._threads
        if (made_profile and not self.sync and type(self.cpu_clock) is CpuClock
                and not self.lent and not _PARKED
                and (not threads or (len(threads) == 1 and threads[0].thread == threading.get_ident()))):
            self.clear_calls()
            self.example.clear()
            self.names.clear()
            self.cuda_clocks.clear()
            self.observers = ()
            self.late = {}
            self.step_state = _Step((), self.late)
            for state in self._threads:
                state.clear()
            _PARKED.append(self)
        else:
            self._let_go()

    def counted_all_returned(self) -> bool:
        """True where the count of returns says that every call of the step returned from its forward (what
        ``timing.all_returned`` reads from the calls): the hooks ran on one thread, no RootStep folded calls away,
        and as many returned as there are calls. False says nothing: read the calls."""
        return not self.lent and len(self._threads) <= 1 and self.returned == len(self.calls)

    def end_step(self, last: bool = False) -> None:
        """Close the step: graph hooks still on live nodes stop stamping, and per-thread state starts clean
        (a KeyboardInterrupt inside a forward skips its post-hook). ``last``: the tracker's last step, whose
        per-thread state ``release`` clears; only this thread's hooker, which every tracker shares, lets go of
        its last dict (as ``_ThreadState.clear`` does)."""
        self.step_state.open = False
        if last:
            hooker = getattr(_HOOKERS, "hooker", None)
            if hooker is not None:
                hooker.clear()
            return
        self.step_state = _Step(self.step_state.observers, self.late)
        with self._threads_lock:
            for state in self._threads:
                state.clear()

    def clocks(self) -> list[Clock]:
        return [self.cpu_clock, *self.cuda_clocks.values()]

    # -- forward hooks ---------------------------------------------------------------------------------------
    def _thread(self) -> _ThreadState:
        try:
            return self._local.state
        except AttributeError:
            state = self._local.state = _ThreadState()
            with self._threads_lock:
                self._threads.append(state)
            return state

    def open_here(self) -> CallTrace | None:
        """The outermost call open on the calling thread (a step ended inside it would lose it), or None."""
        state = getattr(self._local, "state", None)
        return state.stack[0] if state is not None and state.stack else None

    def _open_elsewhere(self, state: _ThreadState) -> CallTrace | None:
        """The innermost open call of another thread than ``state``'s, if one is open (read without the lock: a
        stack that changes meanwhile gives a call that was open, or None)."""
        for other in self._threads:
            if other is not state and other.stack:
                try:
                    return other.stack[-1]
                except IndexError:
                    continue
        return None

    def _stack(self) -> list[CallTrace]:
        return self._thread().stack

    def reset_stack(self) -> None:
        """Forget calls left open on this thread (between steps, no forward is running)."""
        self._thread().stack.clear()

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

    def type_name(self, name: str) -> str:
        """The class name of the module attached under ``name``, for notes."""
        for attached in reversed(self._attached):  # the last attach's module for a name, as a dict would hold
            for attached_name, module in reversed(attached):
                if attached_name == name:
                    return type(module).__name__
        return "?"

    def _make_hooks(self) -> tuple[Callable[..., None], Callable[..., None], Callable[..., Any]]:
        tracker = self
        names = self.names
        wrapped = self.wrapped_names
        calls = self.calls
        example = self.example
        local = self._local
        cpu_clock = self.cpu_clock
        cuda_initialized = torch.cuda.is_initialized
        # True only inside what dynamo traces (a constant there), False in eager on every thread (20 ns a call):
        # not ``is_compiling``, a process-wide flag set for a compile on any thread.
        compiling = torch.compiler.is_dynamo_compiling
        handled = _handled
        next_seq = _next_sequence_nr

        def begin(module: nn.Module, name: str, args: Any, kwargs: dict[str, Any]) -> None:
            if not name:  # the root's calls with a tensor: the first the profile's example input; each one's batch
                tensor = args[0] if args and isinstance(args[0], _Tensor) else first_tensor(args, kwargs)
                if tensor is not None:
                    if not example:
                        example.update(input_facts(tensor))
                        example[BATCHES] = {}
                        example[INPUT_DEVICE] = tensor.device
                        example[INPUT_FAKE] = faked(tensor)
                        example[OTHER_DIMS] = {}
                    batches = example[BATCHES]
                    batch = tensor.size(0) if tensor.dim() > 0 else None
                    batches[batch] = batches.get(batch, 0) + 1
                    if not tensor.is_nested:
                        example[OTHER_DIMS][tensor.shape[1:]] = None
            try:
                state = local.state
            except AttributeError:
                state = tracker._thread()
            stack = state.stack
            clock = tracker._clock_for(module, args, kwargs) if cuda_initialized() else cpu_clock
            task = _graph_task_id()
            call = CallTrace(name, stack[-1] if stack else None, clock, task != -1, tracker.step_state)
            if not stack:
                call.elsewhere = tracker._open_elsewhere(state)
                if task != -1:
                    running = tracker.step_state.pending.get(task)
                    if type(running) is CallTrace:
                        call.during = running
            handling = handled()
            if handling is not None:  # called from an except block: its exception is not this call's
                call.handling = handling
            calls.append(call)
            stack.append(call)
            for observer in tracker.observers:
                observer.forward_pre(call, module, args, kwargs)
            call.seq_start = seq = next_seq()
            state.bounds.append(seq)
            state.owners.append(call)
            stamp = clock.now()
            # CUDA events carry the host time beside them (``host_stamped``, inline: this runs for every call): the
            # planner prices a recomputation on a launch-bound step by what the host took (``host_forward_ms``),
            # which the events hold only where the GPU waits.
            call.fwd_start = stamp if type(stamp) is int else (perf_counter_ns(), stamp)

        # A module's own pre-hook, after the user's (a module with hooks of its own). ``kwargs`` None: torch calls
        # it without them where a hook before it in the same call took ours off (ending the block).
        def forward_pre(module: nn.Module, args: Any, kwargs: Any = None) -> None:
            if tracker.active and not compiling():
                name = names.get(id(module._forward_pre_hooks))
                if name is not None:
                    begin(module, name, args, {} if kwargs is None else kwargs)

        # And its hook, before the user's. On an exception torch calls it with ``output`` None.
        def forward_post(module: nn.Module, args: Any, kwargs: Any, output: Any) -> None:
            if not tracker.active or compiling():
                return None
            try:
                state = local.state
            except AttributeError:
                return None  # no call began on this thread
            stack = state.stack
            if not stack:
                return None  # the call began before profiling did
            call = stack[-1]
            end = call.clock.now()
            if type(end) is not int:
                end = (perf_counter_ns(), end)
            name = names.get(id(module._forward_pre_hooks))
            if name is None:
                return None
            if call.name != name:
                # An inner call never reached its post-hook (a pre-hook raised before forward ran): unwind to ours.
                call = _unwind_to(stack, name)
                if call is None:
                    return None
                end = host_stamped(call.clock)
            stack.pop()
            call.fwd_end = end
            call.seq_end = seq = next_seq()
            state.bounds.append(seq)
            state.owners.append(stack[-1] if stack else None)
            # (also where forward returned: torch's except path calls this hook with the output when a global hook
            # after forward raised, and the call then raised to its caller)
            error = handled()
            handling = call.handling
            if handling is not None:
                call.handling = None
            if error is not None and error is not handling:
                # always_call ran us because forward raised. The note goes on the exception now, at the innermost
                # module it leaves: the exception itself then says it was noted, so no identity is kept here
                # (id() is reused, and holding the exception would keep its traceback's frames alive).
                call.raised = True
                if state.pending:  # its sub-calls' walks first, which may defer nodes to it
                    _walk_all(state.pending)
                if call.deferred is not None:
                    _hook_deferred(call, state)
                if not _noted_inside(error, call):
                    _note(error, raised_note(name, type(module).__name__), call)
                return None
            tracker.returned += 1
            if seq > call.seq_start:
                lo = call.seq_start
                bounds = state.bounds
                own = bounds[-2] == lo and state.owners[-2] is call
                # An inner call's walk waits for the outermost call to return, unless the module carries hooks
                # (ours among them: a hook of its own after ours may hook its outputs' nodes, and ours must run
                # first in backward, FSDP2's pre-backward hooks for one), a forward meter runs (its figures stay
                # those of walks made as calls return: the memory meter's would count the graphs a waiting walk
                # holds), or the call is a recomputation in backward.
                if (stack and tracker._entry is not None and not module._forward_hooks and not call.recompute
                        and not tracker.observers):
                    _walk_later(call, output, module, state, own, tracker.early_hooks)
                else:
                    if state.pending:
                        _walk_all(state.pending)
                    _walk(call, output, module, state, own)
            elif not stack and state.pending:
                _walk_all(state.pending)
            for observer in tracker.observers:
                observer.forward_post(call, module, args, kwargs, output)
            return None

        # Every module call of the process, in place of torch's ``Module._call_impl`` (``inner``): a profiled
        # module's call is timed around torch's, which runs forward on its fast path where the module carries no
        # hooks. Hooks that another tool put on every module (torch's global module hooks) run inside the call. A
        # module with hooks of its own gets a pre-hook and hook of ours beside them for the call, after its
        # pre-hooks and before its hooks: its hooks stay outside its time, and its outputs are walked before a
        # backward hook wraps them. They come off as the call ends, so that the module runs as it does unprofiled
        # between calls (``nn.TransformerEncoderLayer`` takes its fused path only where its children carry no hook).
        own_key = hook_key()
        # Modules with hooks of their own whose calls are under way, by id of their pre-hook dict (shared by a
        # DataParallel replica and its original) -> (calls, what add_forward_hooks returned): ours go on with the
        # first call and off with the last, whatever the threads (a recursive call finds them on).
        in_flight: dict[int, tuple[int, Any]] = {}
        in_flight_lock = threading.Lock()

        def hooked_call(inner: Callable[..., Any], module: nn.Module, name: str, args: Any, kwargs: Any) -> Any:
            key = id(module._forward_pre_hooks)
            with in_flight_lock:
                calls, added = in_flight.get(key, (0, None))
                if not calls:
                    added = add_forward_hooks(module, forward_pre, forward_post, own_key)
                in_flight[key] = (calls + 1, added)
            try:
                if not (module._backward_hooks and module._is_full_backward_hook or (not name and (
                        module._backward_hooks or module._backward_pre_hooks))):
                    return inner(module, *args, **kwargs)
                # Full backward hooks (or a root's pre-hooks, which no parent's backward holds): torch wraps the
                # outputs in a node of its own after our hook ended the call.
                state = tracker._thread()
                mark = len(state.owners)
                output = inner(module, *args, **kwargs)
                if tracker.active:
                    _own_output_hook(state, mark, name, output)
                return output
            finally:
                with in_flight_lock:
                    calls, added = in_flight.pop(key)
                    if calls > 1:
                        in_flight[key] = (calls - 1, added)
                    else:
                        remove_forward_hooks(module, added)

        def make_call(inner: Callable[..., Any], token: object) -> Callable[..., Any]:
            def call_impl(module: nn.Module, /, *args: Any, **kwargs: Any) -> Any:
                name = wrapped.get(id(module._forward_pre_hooks))
                if name is None or tracker._token is not token:
                    # A torch.compile(module) of a profiled one? (A TorchScript module's table is no dict.)
                    table = module.__dict__.get("_modules") if names else None
                    if type(table) is dict:
                        inner_module = table.get("_orig_mod")
                        if inner_module is not None and id(inner_module._forward_pre_hooks) in names:
                            refuse_compiled_wrapper(module, names[id(inner_module._forward_pre_hooks)])
                    elif table is not None and not tracker.early_hooks:
                        # A TorchScript module (one torch.jit.load made, which torchscript_compiled does not see):
                        # a backward pass its code starts goes around torch.autograd, so the walks put off first.
                        walk_pending()
                    return inner(module, *args, **kwargs)
                if compiling():
                    # torch.compile tracing a region that calls modules (a compiled function inside a forward):
                    # the compiled graph calls no hook of ours at run time, so none is traced into it either; the
                    # block says which modules it did not see run (``unseen.ran_unseen``).
                    return inner(module, *args, **kwargs)
                if (module._forward_pre_hooks or module._forward_hooks or module._backward_hooks
                        or module._backward_pre_hooks):
                    return hooked_call(inner, module, name, args, kwargs)
                begin(module, name, args, kwargs)
                try:
                    output = inner(module, *args, **kwargs)
                except BaseException:
                    forward_post(module, args, kwargs, None)
                    raise
                forward_post(module, args, kwargs, output)
                return output

            return call_impl

        return forward_pre, forward_post, make_call


# The key of ``Tracker.example`` under which the root's calls are counted by batch size (first dimension).
BATCHES = "_batches"
# And the device of the first (``environment.on_input_device``), and the sizes beyond the batch each call had (the
# input's shape is the profile's only where they are one: dynamic padding gives each batch its own length).
INPUT_DEVICE = "_device"
# Whether that first input is a fake tensor (``environment.untimed``: a model without parameters counts on one too).
INPUT_FAKE = "_fake"
OTHER_DIMS = "_other_dims"

NOTE_PREFIX = "layerprof: "


def raised_note(name: str, type_name: str, during: str = "") -> str:
    """The note added to an exception raised inside a profiled module."""
    shown = f"module '{name}'" if name else "the model"
    return f"{NOTE_PREFIX}raised inside {shown} ({type_name}){during}"


# Where an exception layerprof noted keeps the ids of the calls it was raised inside (the noting call, its callers,
# and across threads the call that a thread's outermost call ran beside): the calls it leaves on its way out add no
# note of their own. Ids, not calls: nothing of the step is kept alive by an exception the user holds.
_NOTED_IN = "_layerprof_noted_in"
_RAISED_INSIDE = f"{NOTE_PREFIX}raised inside "


def _noted_inside(error: BaseException, call: CallTrace) -> bool:
    """Whether ``error`` was noted as it left a call inside ``call``, on its way out now (the note names the
    innermost module). One raised again later from outside that call (a library's stored ImportError, raised on
    each try of a fast path) is noted again where it is raised then."""
    noted_in = getattr(error, "__dict__", {}).get(_NOTED_IN)
    return type(noted_in) is frozenset and id(call) in noted_in and has_note(error)


def _note(error: BaseException, note: str, call: CallTrace) -> None:
    """Add ``note`` to ``error`` in place of a note of where it was raised an earlier time, and keep the ids of
    ``call`` and the calls it ran inside."""
    notes = getattr(error, "__notes__", None)
    if isinstance(notes, list):
        notes[:] = [old for old in notes if not (isinstance(old, str) and old.startswith(_RAISED_INSIDE))]
    error.add_note(note)
    inside: set[int] = set()
    current: CallTrace | None = call
    while current is not None and id(current) not in inside:
        inside.add(id(current))
        current = current.parent if current.parent is not None else current.elsewhere
    own = getattr(error, "__dict__", None)
    if isinstance(own, dict):
        own[_NOTED_IN] = frozenset(inside)


def has_note(error: BaseException) -> bool:
    return any(isinstance(note, str) and note.startswith(NOTE_PREFIX) for note in getattr(error, "__notes__", ()))


def backward_note(tracker: Tracker, error: BaseException, traceback: Any) -> str | None:
    """The note for an exception that escaped a backward pass, if it came out of the autograd engine: the owner of
    the node that started last in a pass that did not finish (a finished pass drops its entry), which is the
    innermost module whose own code made that node, or none when no profiled module made it."""
    pending = tracker.step_state.pending
    call = next(reversed(pending.values()), None) if pending else None
    if call is None or has_note(error) or not escaped_backward(traceback):
        return None
    if call.name is None:
        return (f"{NOTE_PREFIX}raised during backward, in a part of the graph that no profiled module made (code "
                "outside the modules' calls)")
    return raised_note(call.name, tracker.type_name(call.name), ", during its backward")


def _drain_keys(names: dict[int, str], modules: list[nn.Module]) -> None:
    for module in modules:
        names.pop(id(module._forward_pre_hooks), None)


def _unwind_to(stack: list[CallTrace], name: str) -> CallTrace | None:
    for depth in range(len(stack) - 1, -1, -1):
        if stack[depth].name == name:
            del stack[depth + 1 :]
            return stack[depth]
    return None


# -- backward: hooks on the graph nodes a call created ------------------------------------------------------
def _roots(output: Any, lo: int, hi: int) -> list[Any]:
    roots = []
    for tensor in iter_tensors(output):
        node = tensor.grad_fn
        if node is None:  # inside torch.func.vmap, the node is the wrapped value's
            node = _batched_grad_fn(tensor)
        if node is not None and lo <= _sequence_nr(node) < hi:
            roots.append(node)
    return roots


def _walk(call: CallTrace, output: Any, module: nn.Module, state: _ThreadState, own: bool) -> None:
    """Hook the nodes of ``[seq_start, seq_end)`` reachable from the call's outputs that no walk reached yet.

    A call whose outputs lead to none of its nodes (it returns None, or keeps its result on ``self``) is walked
    from the tensors on its module instead. ``own``: no sub-call made a node of the range (the last boundary before
    the call's end is its start, or a sub-call's end at that same number), so no owner is looked up."""
    nodes = _start_nodes(call, output, module, state.walked)
    if nodes is not None:
        _walk_nodes(call, nodes, state, own)


def _walk_later(call: CallTrace, output: Any, module: nn.Module, state: _ThreadState, own: bool,
                early_hooks: bool) -> None:
    """``_walk``, put off until the thread's outermost call returns (or a backward pass starts, or a call raises):
    the walks of a forward, made one after another with nothing between, take about 60 % of the time they take
    each made as its call returns, after the call's kernels have moved the walk's code and data out of the CPU's
    caches. Only the start nodes are read now (the outputs and the module's tensors are not kept); a node holds
    the graph behind it, which the model's output holds too, but for outputs the model drops: those stay until
    the outermost call returns. ``early_hooks``: the start nodes are hooked now, with one more hook that makes the
    walks put off if a backward pass reaches one first."""
    walked, early = state.walked, state.early
    nodes = _start_nodes(call, output, module, walked, early)
    if nodes is None:
        nodes = []  # (its walk still comes, for the nodes its sub-calls' walks may defer to it)
    elif nodes and early_hooks:
        # The start nodes get their hooks now, with one more that makes the walks put off: a backward pass that
        # does not start through torch.autograd (TorchScript's) reaches a call's output before the nodes behind it.
        hooker = state.hooker
        bounds, owners = state.bounds, state.owners
        for node in nodes:
            number = _sequence_nr(node)
            if number in walked or number in early:  # (hooked already: a sub-call's start node, or walked)
                continue
            early.add(number)
            hooker.use({0: call if own else owners[bisect_right(bounds, number) - 1], 1: state.walk_pending})
            hooker.register(node)
    pending = state.pending
    pending += (state, call, nodes[0] if len(nodes) == 1 else nodes, own)
    if len(pending) >= _MOST_PENDING * 4:  # an outermost call that runs on (a loop inside a forward): walked now
        _walk_all(pending)


def _start_nodes(call: CallTrace, output: Any, module: nn.Module, walked: set[int], early: set[int] | None = None
                 ) -> list[Any] | None:
    """The nodes of the call's range its walk starts from, or None where its output's node was walked already by a
    sub-call's walk, or (``early``) is a start node a sub-call's walk put off hooked (a container returning its last
    child's output), and no node was deferred to it."""
    lo, hi = call.seq_start, call.seq_end
    if isinstance(output, _Tensor):  # the common case, without building a list of tensors
        node = output.grad_fn
        if node is None:
            node = _batched_grad_fn(output)  # inside torch.func.vmap, the node is the wrapped value's
        if node is None:
            todo = []
        else:
            number = _sequence_nr(node)
            if not lo <= number < hi:
                todo = []
            elif (number in walked or (early is not None and number in early)) and call.deferred is None:
                return None
            else:
                todo = [node]
    else:
        todo = _roots(output, lo, hi)
        if not todo and output is not None:  # an object iter_tensors does not open: a plain output class's fields
            todo = _roots(_fields(output), lo, hi)
    if not todo:  # (the module's own attributes: a result kept on ``self``, in a dict or not; not torch's tables)
        todo = _roots([value for key, value in vars(module).items() if key not in _MODULE_TABLES], lo, hi)
    return todo


# What a bare module holds in its ``__dict__``: torch's tables of parameters, buffers, children and hooks, and flags.
_MODULE_TABLES = frozenset(vars(nn.Module()))


def _fields(output: Any) -> list[Any]:
    """The attributes of an output that is no container ``iter_tensors`` opens (a plain class, a
    ``SimpleNamespace``, a class with slots; a generator not started yet: its frame's locals, which hold a generator
    function's arguments): what a model returning it in place of a tensor holds its tensors in. Nothing of a
    module, a class or a leaf value. Read without the object's own attribute code (``__getattr__``, properties),
    and never raising: nothing of this may fail the user's forward."""
    if isinstance(output, (nn.Module, type, str, bytes, int, float, bool)):
        return []
    try:
        if isinstance(output, types.GeneratorType):
            frame = output.gi_frame
            return [] if frame is None else list(frame.f_locals.values())
        try:
            own = object.__getattribute__(output, "__dict__")
        except AttributeError:
            own = None
        found = list(own.values()) if isinstance(own, dict) else []
        for cls in type(output).__mro__:
            slots = vars(cls).get("__slots__", ())
            for slot in (slots,) if isinstance(slots, str) else slots:
                member = vars(cls).get(slot)
                if slot not in ("__dict__", "__weakref__") and type(member) is types.MemberDescriptorType:
                    try:
                        found.append(member.__get__(output, cls))
                    except AttributeError:  # a slot never set
                        pass
        return found
    except Exception:  # noqa: BLE001 - an odd object: its nodes are not found, as before
        return []


def _walk_nodes(call: CallTrace, todo: list[Any], state: _ThreadState, own: bool) -> None:
    """The walk of ``call`` from ``todo`` (emptied), and from the nodes its sub-calls' walks deferred to it."""
    lo, hi = call.seq_start, call.seq_end
    walked = state.walked
    deferred = call.deferred
    if deferred is not None:  # own nodes met by sub-calls' walks: behind their nodes, which are walked already
        call.deferred = None
        todo.extend(deferred)
    if not todo:
        return
    bounds = state.bounds
    owners = state.owners
    hooker = state.hooker
    register = hooker.register
    observed = bool(call.step.observers)  # observers (the memory meter) want each call's end as it happens
    # The owner whose hook dict the hooker holds. A dict per owner and walk: a node holds its owner's dict, and
    # nothing else refers to it, so it goes with the graph.
    hooked: CallTrace | None = None
    owner = call
    early = state.early  # start nodes hooked as their calls returned (``_walk_later``)
    while todo:
        node = todo.pop()
        number = _sequence_nr(node)
        if number in walked:
            continue
        walked.add(number)
        if not own:
            owner = owners[bisect_right(bounds, number) - 1]
        if number not in early:
            if owner is not hooked:
                hooked = owner
                hooker.use({0: owner})
            register(node)
        last = observed  # for observers: no successor of the same owner, so the owner's backward may end here
        for successor, _ in node.next_functions:
            if successor is not None:
                next_number = _sequence_nr(successor)
                if lo <= next_number < hi:
                    if last and (own or owners[bisect_right(bounds, next_number) - 1] is owner):
                        last = False
                    if next_number not in walked:
                        todo.append(successor)
                elif next_number < lo and next_number not in walked:
                    _defer(successor, next_number, state, call)
                    hooked = None  # a node hooked there changed the hooker's dict
        if last:
            node.register_hook(owner.node_ended)
    if call.recompute:
        # A recomputation's walk lets go of its last owner's dict now, from the walking thread itself, between walks:
        # it runs in backward, on CUDA on autograd's thread, which lives on after the block, and whose hooker held a
        # finished call, with its clock (the event pool) and its step, until that thread's next walk. A forward's
        # walks leave theirs to the block's end (``end_step``), which clears the block's own thread: 76 ns a walk.
        hooker.clear()


def _own_output_hook(state: _ThreadState, mark: int, name: str, output: Any) -> None:
    """Hook, as the call's own, the node torch wraps the outputs of a module with full backward hooks in, made as
    the call returns, after our hook ended it: the module's full backward hooks run there where no input needs a
    gradient (the first layer's), and its full backward pre-hooks. Else the hooks would count in the parent's
    backward, and a root's in no module's. (The node of a module with pre-hooks only stays its parent's code.)
    ``mark``: the length of the thread's owners before the call; the call is the first one of that name begun
    since, under the call open now."""
    owners = state.owners
    parent = state.stack[-1] if state.stack else None
    call = next((owner for owner in owners[mark:] if owner is not None and owner.name == name
                 and owner.parent is parent), None)
    if call is None or call.raised or call.fwd_end is None:
        return
    walked = state.walked
    hooker = state.hooker
    used = False
    claimed: list[int] = []
    for tensor in iter_tensors(output):
        node = tensor.grad_fn
        if node is None or node.name() != "BackwardHookFunctionBackward":
            continue
        number = _sequence_nr(node)
        if number < call.seq_end or number in walked:
            continue
        walked.add(number)
        claimed.append(number)
        if not used:
            hooker.use({0: call})
            used = True
        hooker.register(node)
        for successor, _ in node.next_functions:  # what the call returned that it did not make: its makers'
            if successor is not None:
                next_number = _sequence_nr(successor)
                if next_number < call.seq_start and next_number not in walked:
                    _defer(successor, next_number, state, call)
                    used = False  # a node hooked there changed the hooker's dict
    if claimed:  # for the meters, which find a backward op's call by the ranges (the FLOPs of the hooks)
        call.claimed = claimed


def _hook_deferred(call: CallTrace, state: _ThreadState) -> None:
    """Hook, as the call's own, the nodes its sub-calls' walks left to a call whose forward raised (its own walk
    never comes), and let go of them: the list held the graph the call was building, saved tensors and all, until
    the block's end. Checkpoint's early stop raises out of every recomputation, and the recomputed graph's nodes
    hold the tensors they saved (a timm ViT block: 20 KB more at the step's peak than without the profiler); a
    forward that ran out of memory and is tried again smaller held the failed attempt's graph."""
    deferred, call.deferred = call.deferred, None
    walked = state.walked
    hooker = state.hooker
    hooker.use({0: call})
    for node in deferred:
        number = _sequence_nr(node)
        if number not in walked:
            walked.add(number)
            hooker.register(node)
    if call.recompute:
        hooker.clear()  # as a recomputation's walk does: the hooker holds no finished call past it


def _defer(node: Any, number: int, state: _ThreadState, call: CallTrace) -> None:
    """A node made before the walking call began, not walked yet: hand it to the innermost enclosing call whose
    range holds it (its walk, which comes later, hooks it, with the owner the ranges say); a node that no enclosing
    call made is hooked now, with its owner if a finished call made it, else as made outside every profiled call.
    (The enclosing calls are those open when ``call`` returned: its parent and theirs.)"""
    holder = call.parent
    while holder is not None:
        if holder.seq_start <= number:
            if holder.deferred is None:
                holder.deferred = [node]
            else:
                holder.deferred.append(node)
            return
        holder = holder.parent
    step = call.step
    state.walked.add(number)
    index = bisect_right(state.bounds, number) - 1
    owner = state.owners[index] if index >= 0 else None
    hooker = state.hooker
    hooker.use({0: owner if owner is not None else step.outside()})
    hooker.register(node)
