"""Every private PyTorch API layerprof relies on, in one place.

Private APIs change between torch releases without notice; keeping them here means one file to read when a new
torch breaks something, and one place to add a fallback. Everything else in layerprof imports them from here.
"""
from __future__ import annotations

import collections
import functools
import itertools
from operator import attrgetter, methodcaller, setitem
from typing import Any, Callable

import torch
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._python_dispatch import TorchDispatchMode

__all__ = [
    "next_sequence_nr", "graph_task_id", "queue_backward_callback", "sequence_nr", "current_autograd_node",
    "has_decomposition", "nested_sizes", "storage_key", "submodules", "tensor_version", "outer_saved_tensors_hooks",
    "compiled_module_type",
    "TorchDispatchMode", "StorageWeakRef", "escaped_backward", "add_forward_hooks", "remove_forward_hooks",
    "add_forward_hooks_to", "remove_forward_hooks_from",
]

# The sequence number the next autograd node created on this thread will get: a module call owns the nodes
# numbered between its pre-hook and its post-hook.
next_sequence_nr: Callable[[], int] = torch._C._autograd._get_sequence_nr
# The id of the backward pass (graph task) running on this thread, -1 outside backward.
graph_task_id: Callable[[], int] = torch._C._current_graph_task_id
# The autograd node executing on this thread, None outside backward.
current_autograd_node: Callable[[], Any] = torch._C._current_autograd_node


def escaped_backward(traceback: Any) -> bool:
    """Whether an exception's traceback passes through torch's autograd engine (it escaped a backward pass):
    ``Tensor.backward`` and ``autograd.grad`` both run the engine from ``_engine_run_backward``."""
    while traceback is not None:
        code = traceback.tb_frame.f_code
        if code.co_name == "_engine_run_backward" or (
            code.co_name in ("backward", "grad") and "autograd" in code.co_filename.replace("\\", "/")
        ):
            return True
        traceback = traceback.tb_next
    return False


# An autograd node's sequence number (AccumulateGrad nodes get the largest possible). A C-level caller rather
# than a function: the tracker reads it once per graph node per step.
sequence_nr: Callable[[Any], int] = methodcaller("_sequence_nr")


def submodules(module: Any) -> dict[str, Any]:
    """A module's registered children by attribute name (None where a child slot is empty): what
    ``named_modules()`` walks, without a generator per level (which costs microseconds per module)."""
    return module._modules


# Keys of the hooks layerprof puts in a module's hook dicts: negative, so never one of torch's own (its
# RemovableHandle ids count up from 0).
_HOOK_KEYS = itertools.count(-1, -1)


def add_forward_hooks(module: Any, pre: Callable[..., None], post: Callable[..., None]) -> Any:
    """Put ``pre`` (run last, with kwargs) and ``post`` (run first, with kwargs, also when forward raises) on
    ``module``, as ``register_forward_pre_hook(pre, with_kwargs=True)`` and ``register_forward_hook(post,
    with_kwargs=True, always_call=True, prepend=True)`` do, but writing the module's hook dicts directly: the
    public calls build two RemovableHandles per module, ten times the cost, which made set-up the largest part
    of a one-shot profile. Returns what ``remove_forward_hooks`` takes. Falls back to the public calls where a
    torch has other internals."""
    try:  # every dict is read before any is written: a module without one is left untouched
        pre_hooks, pre_kwargs = module._forward_pre_hooks, module._forward_pre_hooks_with_kwargs
        hooks, kwargs, always = (module._forward_hooks, module._forward_hooks_with_kwargs,
                                 module._forward_hooks_always_called)
    except AttributeError:
        return (module.register_forward_pre_hook(pre, with_kwargs=True),
                module.register_forward_hook(post, with_kwargs=True, always_call=True, prepend=True))
    key = next(_HOOK_KEYS)
    pre_hooks[key] = pre
    pre_kwargs[key] = True
    hooks[key] = post
    hooks.move_to_end(key, last=False)
    kwargs[key] = True
    always[key] = True
    return key


_drain = functools.partial(collections.deque, maxlen=0)  # runs an iterator to its end, keeping nothing
_DICTS = ("_forward_pre_hooks", "_forward_pre_hooks_with_kwargs", "_forward_hooks", "_forward_hooks_with_kwargs",
          "_forward_hooks_always_called")


def add_forward_hooks_to(modules: list[Any], pre: Callable[..., None], post: Callable[..., None]) -> Any:
    """``add_forward_hooks`` on every module of ``modules`` under one key, with C-level ``map`` calls instead of a
    Python call per module (hooking a 10,000-module model for a one-shot profile); what it returns goes to
    ``remove_forward_hooks_from``. Modules of another torch's internals get the public calls."""
    try:
        pre_hooks, pre_kwargs, hooks, kwargs, always = (list(map(attrgetter(name), modules)) for name in _DICTS)
    except AttributeError:
        return [(module, add_forward_hooks(module, pre, post)) for module in modules]
    key = next(_HOOK_KEYS)
    keys = itertools.repeat(key)
    try:
        for table, value in ((pre_hooks, pre), (pre_kwargs, True), (hooks, post), (kwargs, True), (always, True)):
            _drain(map(setitem, table, keys, itertools.repeat(value)))
        _drain(map(methodcaller("move_to_end", key, last=False), hooks))
    except BaseException:  # half way: nothing of ours stays on any module
        remove_forward_hooks_from((key, modules))
        raise
    return key, modules


def remove_forward_hooks_from(added: Any) -> None:
    """Take off what ``add_forward_hooks_to`` put on its modules."""
    if type(added) is list:
        for module, handles in added:
            remove_forward_hooks(module, handles)
        return
    key, modules = added
    pop = methodcaller("pop", key, None)
    for name in _DICTS:
        _drain(map(pop, map(attrgetter(name), modules)))


def remove_forward_hooks(module: Any, added: Any) -> None:
    """Take off what ``add_forward_hooks`` put on ``module``."""
    if type(added) is tuple:
        for handle in added:
            handle.remove()
        return
    module._forward_pre_hooks.pop(added, None)
    module._forward_pre_hooks_with_kwargs.pop(added, None)
    module._forward_hooks.pop(added, None)
    module._forward_hooks_with_kwargs.pop(added, None)
    module._forward_hooks_always_called.pop(added, None)


def has_decomposition(op: Any) -> bool:
    """Whether an aten op has a CompositeImplicitAutograd kernel (it decomposes into other ops)."""
    try:
        return torch._C._dispatch_has_kernel_for_dispatch_key(op.name(), "CompositeImplicitAutograd")
    except (AttributeError, RuntimeError):
        return False


def nested_sizes(tensor: torch.Tensor) -> list[list[int]]:
    """The shapes of a nested tensor's components."""
    return tensor._nested_tensor_size().tolist()


def storage_key(storage: Any) -> int:
    """A key that identifies a storage while it lives (its C++ address)."""
    return storage._cdata


def tensor_version(tensor: torch.Tensor) -> int:
    """The tensor's version counter, bumped by every in-place op on it or its views."""
    return tensor._version


def outer_saved_tensors_hooks() -> tuple[Any, Any] | None:
    """The saved-tensor hooks installed before ours (save_on_cpu, offloading), to chain to; None if none."""
    top = getattr(torch._C._autograd, "_top_saved_tensors_default_hooks", None)
    return top(False) if top is not None else None


def compiled_module_type() -> type | None:
    """The class of a ``torch.compile``'d module (``OptimizedModule``), None where dynamo is missing."""
    dynamo = getattr(torch, "_dynamo", None)
    eval_frame = getattr(dynamo, "eval_frame", None) if dynamo is not None else None
    return getattr(eval_frame, "OptimizedModule", None)


def queue_backward_callback(callback: Callable[[], None]) -> bool:
    """Run ``callback`` when the running backward pass finishes (the autograd engine's final callbacks, as FSDP
    uses them); False when no backward pass is running here, so nothing was queued."""
    try:
        torch.autograd.Variable._execution_engine.queue_callback(callback)  # type: ignore[attr-defined]
    except RuntimeError:
        return False
    return True


def profiler_range(name: str) -> Any:
    """A context manager that opens a torch.profiler range named ``name``: ``_RecordFunctionFast`` (about 0.5 µs
    per range, what torch's own fast paths use) where torch has it, else the public ``record_function`` (~13 µs)."""
    fast = getattr(torch._C._profiler, "_RecordFunctionFast", None)
    if fast is not None:
        return fast(name)
    return torch.autograd.profiler.record_function(name)
