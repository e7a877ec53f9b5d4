"""A trainer's step as one call of the model's root, for trainers whose step never calls the root itself.

Lightning's ``training_step`` usually calls ``self.net(x)``: the LightningModule, the profiled root, is never
called, so it would show no time and the summary no totals. A trainer integration knows where its step's parts
begin and end, and tells a ``RootStep``: the training step opens a call of the root that the modules called inside
it nest under (its forward is the training step up to the loss), and the trainer's backward call gives that call
its backward (the loss's own gradient, every module's, and the engine's work between them). A call of the root
made inside the step (a ``training_step`` that calls ``self(x)``) is folded into it, so the root counts one call per
training step either way; so is one made by a later run of the step in the same training step (an optimizer that
re-evaluates its closure, LBFGS), whose module calls then count as made by none and go to the root's time.
"""
from __future__ import annotations

from typing import Any

import torch
from torch import nn

from .._torch import next_sequence_nr
from .clock import host_stamped
from .tracker import CallTrace, Tracker, walk_pending

__all__ = ["RootStep"]


class RootStep:
    """One call of ``module`` (the profiled root) per trainer step, opened and closed by the integration."""

    def __init__(self, tracker: Tracker, module: nn.Module) -> None:
        self.tracker = tracker
        self.module = module
        self.call: CallTrace | None = None
        self._first = 0  # index in tracker.calls of the open call
        self._backward_start: Any = None
        self._backward: list[tuple[Any, Any]] = []

    def forward_begins(self) -> None:
        """The training step begins (hooks on in this step): open the root's call."""
        tracker = self.tracker
        name = tracker.names.get(id(self.module._forward_pre_hooks))
        if not tracker.active or name is None or self.call is not None:
            return
        state = tracker._thread()
        stack = state.stack
        clock = tracker._clock_for(self.module, (), {}) if torch.cuda.is_initialized() else tracker.cpu_clock
        call = CallTrace(name, stack[-1] if stack else None, clock, False, tracker.step_state)
        self._first = len(tracker.calls)
        tracker.calls.append(call)
        stack.append(call)
        call.seq_start = seq = next_sequence_nr()
        state.bounds.append(seq)
        state.owners.append(call)
        self.call = call
        call.fwd_start = host_stamped(clock)

    def forward_ends(self, failed: bool) -> None:
        """The training step has returned its loss (or raised: ``failed``, and the call does not count)."""
        call = self.call
        if call is None or call.fwd_end is not None or not self.tracker.active:
            return
        end = host_stamped(call.clock)
        state = self.tracker._thread()
        stack = state.stack
        if call in stack:  # calls left open inside it by an exception close with it
            del stack[stack.index(call):]
        call.fwd_end = end
        call.seq_end = seq = next_sequence_nr()
        state.bounds.append(seq)
        state.owners.append(stack[-1] if stack else None)
        call.raised = failed
        if not stack and state.pending:  # the walks of its calls, which waited for the outermost one to return
            walk_pending()

    def backward_begins(self) -> None:
        """The trainer's backward pass begins (again: a later stamp replaces an earlier one)."""
        if self.call is not None and self.call.fwd_end is not None:
            self._backward_start = host_stamped(self.call.clock)

    def backward_ends(self) -> None:
        """The trainer's backward pass has ended (once per begin; a second end does nothing)."""
        if self.call is not None and self._backward_start is not None:
            self._backward.append((self._backward_start, host_stamped(self.call.clock)))
            self._backward_start = None

    def fold(self) -> None:
        """Before the step ends: fold the root's own calls made inside the step into the step's call, and give it
        the trainer's backward call as its backward when there was one (several: the span of its modules')."""
        call, self.call = self.call, None
        backward, self._backward = self._backward, []
        if call is None:
            return
        calls = self.tracker.calls  # the hooks append to this very list: changed in place
        # The root's calls inside the step's call, and those inside them: a framework may run its step as a call of
        # the root (under DDP, Lightning's forward redirection runs training_step in a call of the LightningModule,
        # so a ``self(x)`` there is a call of the root inside a call of the root). In the order they began: a call
        # before the calls made inside it.
        # An optimizer that calls its closure several times a step (LBFGS) runs training_step again after the
        # step's call has ended: a ``self(x)`` there is a call of the root outside it, which would count as another
        # call of the root. Those are folded too; what they called is left without a caller, as under a
        # training_step that calls ``self.net(x)``, and its time is the root's (adopted as a call made by none).
        inner, within, again = [], {id(call)}, set()
        for other in calls[self._first + 1:]:
            if other.name == call.name and other.parent is None:
                again.add(id(other))
                within.add(id(other))
            elif other.name == call.name and other.parent is not None and id(other.parent) in within:
                inner.append(other)
                within.add(id(other))
        task = next((c.task for c in calls[self._first + 1:] if c.task is not None), None)
        if inner or again:
            folded = set(map(id, inner)) | again
            later = again | {id(c) for c in inner if _under(c, again)}
            for other in calls:
                if other.parent is not None and id(other.parent) in folded:
                    other.parent = None if id(other.parent) in later else call
            calls[:] = [c for c in calls if id(c) not in folded]
        if len(backward) == 1 and task is not None:
            call.task = task
            call.bwd_start, call.bwd_end = backward[0]


def _under(call: CallTrace, tops: set[int]) -> bool:
    """Whether ``call`` was made inside one of the calls ``tops`` (by identity)."""
    parent = call.parent
    while parent is not None:
        if id(parent) in tops:
            return True
        parent = parent.parent
    return False
