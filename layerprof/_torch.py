"""Every private PyTorch API layerprof relies on, in one place.

Private APIs change between torch releases without notice; keeping them here means one file to read when a new
torch breaks something, and one place to add a fallback. Everything else in layerprof imports them from here.
"""
from __future__ import annotations

import collections
import functools
import itertools
import sys
import threading
import types
import weakref
from operator import attrgetter, contains, is_not, itemgetter, methodcaller, setitem
from typing import Any, Callable, Iterable

import torch
from torch.multiprocessing.reductions import StorageWeakRef
from torch.nn.modules import module as torch_module
from torch.utils._python_dispatch import TorchDispatchMode, is_traceable_wrapper_subclass

__all__ = [
    "compiled_in_place", "is_compiled_function",
    "next_sequence_nr", "graph_task_id", "queue_backward_callback", "sequence_nr", "current_autograd_node",
    "batched_grad_fn",
    "has_decomposition", "nested_sizes", "storage_key", "submodules", "tensor_version", "outer_saved_tensors_hooks",
    "compiled_module_type", "process_group_initialized", "fsdp2_param_groups", "FSDP2_HOOK_POINTS", "fsdp2_comm_buffers",
    "patch_fsdp2_group", "unpatch_fsdp2_group",
    "TorchDispatchMode", "ready_mode", "mode_is_on", "StorageWeakRef", "escaped_backward", "add_forward_hooks", "remove_forward_hooks",
    "add_forward_hooks_to", "remove_forward_hooks_from", "add_call_wrapper", "remove_call_wrapper", "hook_key",
    "unbind_call_wrappers", "calling_around", "classes_calling_around",
    "compiled_around",
    "add_module_registration_hook", "remove_module_registration_hook",
    "add_backward_entry_hook", "remove_backward_entry_hook", "torchscript_compiled", "hooks_outputs_in_forward",
    "fsdp1_wrapper", "dtensor_local_share", "dtensor_locals",
    "with_forward_pre_hooks", "NodeHooker", "cuda_raw_stream", "cuda_event_record",
    "dict_version", "eager_forwards", "sparse_parts", "inner_tensors", "faked", "fake_mode",
    "subclass_functions_off",
]

# The sequence number the next autograd node created on this thread will get: a module call owns the nodes
# numbered between its pre-hook and its post-hook.
next_sequence_nr: Callable[[], int] = torch._C._autograd._get_sequence_nr
# The id of the backward pass (graph task) running on this thread, -1 outside backward.
graph_task_id: Callable[[], int] = torch._C._current_graph_task_id
# The autograd node executing on this thread, None outside backward.
current_autograd_node: Callable[[], Any] = torch._C._current_autograd_node
# A context in which no tensor subclass's ``__torch_function__`` runs: for reading a parameter's attributes while
# per-sample gradients put a subclass in its place that refuses them (Expanded Weights refuse every function).
subclass_functions_off: Callable[[], Any] = torch._C.DisableTorchFunctionSubclass


class NodeHooker:
    """Puts pre-hooks on autograd graph nodes without the Python objects ``Node.register_prehook`` makes per hook
    (an OrderedDict on the node, a RemovableHandle with its weak reference, a tuple: about 1 µs, and objects the
    garbage collector counts). ``Node._register_hook_dict(tensor)``, what ``Tensor.register_hook`` uses, puts on
    the node a C++ hook that holds the dict found in ``tensor._backward_hooks`` at that moment and, each time the
    node runs, calls every value of that dict with the gradient of the node's first output, before the node's
    other pre-hooks. So one dict serves every node of one owner: ``use(hooks)`` sets the dict on a carrier tensor,
    then ``register(node)`` hooks a node with it; both are C calls (about 0.1 µs). A hook that returns None leaves
    the gradient alone. One per thread (the carrier's dict is set, then read); ``clear`` drops the carrier's
    reference to the last dict."""

    __slots__ = ("register", "use", "_carrier")

    def __init__(self) -> None:
        # Made in a forward: out of sight of the dispatch modes running (a meter's, the user's) and of a default
        # device; a tensor that never joins a graph and whose only use is carrying the dict.
        with torch._C._DisableTorchDispatch(), torch._C.DisableTorchFunction():
            self._carrier = torch.empty(0, device="cpu")
        self.register: Callable[[Any], None] = methodcaller("_register_hook_dict", self._carrier)
        self.use: Callable[[dict[int, Any]], None] = functools.partial(setattr, self._carrier, "_backward_hooks")

    def clear(self) -> None:
        self._carrier._backward_hooks = None


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

# functorch's batched-tensor test and unwrapping (a torch without them has no vmap: nothing is batched).
_is_batched: Callable[[torch.Tensor], bool] = getattr(torch._C._functorch, "is_batchedtensor", lambda tensor: False)
_unwrapped: Callable[[torch.Tensor], torch.Tensor] = getattr(torch._C._functorch, "get_unwrapped", lambda t: t)


def batched_grad_fn(tensor: torch.Tensor) -> Any:
    """The autograd node that made the value a ``torch.func.vmap`` batched tensor wraps (each level of nested
    vmaps unwrapped), or None: the wrapper reads ``grad_fn is None`` and ``requires_grad`` False, while autograd
    recorded the ops on the value inside, which a backward after the vmap runs through."""
    while _is_batched(tensor):
        tensor = _unwrapped(tensor)
        if tensor.grad_fn is not None:
            return tensor.grad_fn
    return None


def submodules(module: Any) -> dict[str, Any]:
    """A module's registered children by attribute name (None where a child slot is empty): what
    ``named_modules()`` walks, without a generator per level (which costs microseconds per module)."""
    return module._modules


# Keys of the hooks layerprof puts in a module's hook dicts: negative, so never one of torch's own (its
# RemovableHandle ids count up from 0).
_HOOK_KEYS = itertools.count(-1, -1)


def hook_key() -> int:
    """A new key for ``add_forward_hooks``."""
    return next(_HOOK_KEYS)


def add_forward_hooks(module: Any, pre: Callable[..., None], post: Callable[..., None] | None,
                      key: int | None = None) -> Any:
    """Put ``pre`` (run last, with kwargs) and ``post`` (run first, with kwargs, also when forward raises) on
    ``module``, as ``register_forward_pre_hook(pre, with_kwargs=True)`` and ``register_forward_hook(post,
    with_kwargs=True, always_call=True, prepend=True)`` do, but writing the module's hook dicts directly: the
    public calls build two RemovableHandles per module, ten times the cost, which made set-up the largest part
    of a one-shot profile. Returns what ``remove_forward_hooks`` takes. Falls back to the public calls where a
    torch has other internals. ``post=None``: the pre-hook only; ``key``: the hooks' key in the dicts (else a new
    one)."""
    try:  # every dict is read before any is written: a module without one is left untouched
        pre_hooks, pre_kwargs = module._forward_pre_hooks, module._forward_pre_hooks_with_kwargs
        hooks, kwargs, always = (module._forward_hooks, module._forward_hooks_with_kwargs,
                                 module._forward_hooks_always_called)
    except AttributeError:
        if post is None:
            return (module.register_forward_pre_hook(pre, with_kwargs=True),)
        return (module.register_forward_pre_hook(pre, with_kwargs=True),
                module.register_forward_hook(post, with_kwargs=True, always_call=True, prepend=True))
    if key is None:
        key = next(_HOOK_KEYS)
    try:
        pre_hooks[key] = pre
        pre_kwargs[key] = True
        if post is None:
            return key
        hooks[key] = post
        hooks.move_to_end(key, last=False)
        kwargs[key] = True
        always[key] = True
    except BaseException:  # half way: nothing of ours stays on the module
        remove_forward_hooks(module, key)
        raise
    return key


_second = itemgetter(1)
_own = attrgetter("__dict__")
_drain = functools.partial(collections.deque, maxlen=0)  # runs an iterator to its end, keeping nothing
_DICTS = ("_forward_pre_hooks", "_forward_pre_hooks_with_kwargs", "_forward_hooks", "_forward_hooks_with_kwargs",
          "_forward_hooks_always_called")


def add_forward_hooks_to(modules: list[Any], pre: Callable[..., None], post: Callable[..., None] | None) -> Any:
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
        tables = [(pre_hooks, pre), (pre_kwargs, True)]
        if post is not None:
            tables += [(hooks, post), (kwargs, True), (always, True)]
        for table, value in tables:
            _drain(map(setitem, table, keys, itertools.repeat(value)))
        if post is not None:
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


# The calls of every module go through ``nn.Module._call_impl`` (``Module.__call__`` looks it up on the module at
# each call). A block routes them through a function of its own, around torch's (inside torch's function, or in
# its place: below): it times the modules it profiles and hands every call to torch's unchanged, which takes its
# fast path where a module carries no hooks. Torch's global module hooks did the same at about twice the cost per
# call (their dispatch builds lists and a closure per call, and runs two hooks), and made every module of the
# process, profiled or not, take the hooked path.
_Module = torch.nn.Module
_CALL_IMPL = "_call_impl"
_Make = Callable[[Callable[..., Any]], Callable[..., Any]]
_wrappers: list[tuple[int, _Make, bool]] = []  # (key, make, outermost), in the order added
_live: set[int] = set()  # the keys added and not removed yet, installed or inside another tool's function
_base: list[Callable[..., Any]] = []  # what ``Module._call_impl`` was when the first wrapper went on (torch's)
_installed: list[Callable[..., Any]] = []  # the chain module calls run (``_slot``), while there is one
# Every chain made -> (what it was built on, the keys of its wrappers): a chain of ours found in ``_call_impl`` (put
# back by another tool), all of whose wrappers were removed, is unwrapped to what it was built on.
_made: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_wrappers_lock = threading.Lock()  # (blocks on several threads)
_GLOBAL_REGISTRATION = "_global_module_registration_hooks"
# Where dynamo keeps ``Module._call_impl`` as it found it when first imported (to tell a module call it may skip
# to forward): a chain of ours if that was inside a block, given back what it was built on as the block ends.
_DYNAMO_CALL_IMPL = (("torch._dynamo.utils", "unpatched_nn_module_call_impl"),
                     ("torch._dynamo.variables.nn_module", "unpatched_nn_module_call_impl"))
# ``Module._call_impl`` as layerprof found it when it loaded: torch's, unless another tool had put its own there.
_FOUND = vars(_Module)[_CALL_IMPL]


# Putting a function in place of ``Module._call_impl`` writes nn.Module's type, and CPython then drops the method
# caches of every subclass (hundreds where transformers is loaded; 70 µs right after a step, twice a block, and the
# next step fills them again). Where the class still holds torch's function, found at load, a plain function, the
# chain is put inside it instead: its code is swapped for ``_call_through``'s, which calls the chain it is given as
# a keyword default (a write to the function, 4-7 µs), and the class is not written. The chain is then built on
# ``_TORCH``, a function running torch's code, and ``_FOUND`` gets its code back as the last wrapper comes off.
# Everything holding torch's function (dynamo, another tool that wrapped it, a ``.compile()`` of a module) holds it
# still, and finds torch's code in it again after the block.
_KW = "_layerprof_call"


def _call_through(*args: Any, _layerprof_call: Any = None, **kwargs: Any) -> Any:
    return _layerprof_call(*args, **kwargs)  # (the module is args[0]: no tuple made again, 50 ns less a call)


def _function_copy(func: Any) -> Any:
    """A function running ``func``'s code, or None where its code cannot be swapped (no plain function without
    free variables and keyword-only defaults)."""
    if (type(func) is not types.FunctionType or func.__code__.co_freevars or func.__kwdefaults__
            or func.__code__.co_kwonlyargcount):
        return None
    copy = types.FunctionType(func.__code__, func.__globals__, func.__name__, func.__defaults__, func.__closure__)
    copy.__qualname__, copy.__module__, copy.__doc__ = func.__qualname__, func.__module__, func.__doc__
    return copy


# (only torch's own: a function another tool put there before layerprof loaded is left as it is)
_TORCH = _function_copy(_FOUND) if getattr(_FOUND, "__module__", None) == torch_module.__name__ else None
_TORCH_CODE = _FOUND.__code__ if _TORCH is not None else None
_THROUGH = _call_through.__code__


def _slot() -> Any:
    """What module calls run now: the class's ``_call_impl``, or where its code is swapped, the chain it calls
    (where it runs torch's code: ``_TORCH``)."""
    current = vars(_Module)[_CALL_IMPL]
    if current is _FOUND and _TORCH is not None:
        return _FOUND.__kwdefaults__[_KW] if _FOUND.__code__ is _THROUGH else _TORCH
    return current


def _set_slot(func: Any) -> None:
    """Make module calls run ``func``: inside ``_FOUND`` where the class holds it, else in the class."""
    if vars(_Module)[_CALL_IMPL] is _FOUND and _TORCH is not None:
        if func is _TORCH:
            _code_back()
        else:
            _FOUND.__kwdefaults__ = {_KW: func}  # (the defaults first: torch's code reads none)
            _FOUND.__code__ = _THROUGH
    else:
        if func in _made:
            _chain_in_class[0] = True
        setattr(_Module, _CALL_IMPL, func)


# Whether a chain of ours was ever put in nn.Module itself (``_set_slot`` where another tool's function stood there):
# only then can dynamo or a module's ``.compile()`` have kept one (``_unpin_dynamo``, ``unbind_call_wrappers``), and
# the block's end look for it. Inside torch's function they keep torch's function, which gets its code back.
_chain_in_class = [False]


def _heal() -> None:
    """Give ``_FOUND`` torch's code back where the chain inside it has no wrapper on any more (another tool put its
    own function in the class around it, and the blocks ended)."""
    if _TORCH is not None and _FOUND.__code__ is _THROUGH and _past_dead_chains(_FOUND.__kwdefaults__[_KW]) is _TORCH:
        _code_back()


def _code_back() -> None:
    """Torch's code in ``_FOUND`` again, and no keyword default of ours."""
    _FOUND.__code__ = _TORCH_CODE  # (the code first: the defaults go unread by torch's)
    _FOUND.__kwdefaults__ = None


def add_call_wrapper(make: _Make, outermost: bool = False) -> int:
    """Route every module call of the process through ``make(inner)``: a function called as torch calls
    ``Module._call_impl``, ``(module, /, *args, **kwargs)``, which hands the call on to ``inner`` (torch's, or the
    wrapper added before it; an ``outermost`` wrapper goes around every other one). Returns what
    ``remove_call_wrapper`` takes."""
    if _CALL_IMPL not in vars(_Module) or "_wrapped_call_impl" not in vars(_Module):
        raise RuntimeError(f"this torch ({torch.__version__}) calls modules otherwise than layerprof knows: "
                           "nn.Module has no _wrapped_call_impl calling _call_impl")
    with _wrappers_lock:
        key = next(_HOOK_KEYS)
        _install((key, make, outermost))
        _live.add(key)
    return key


def remove_call_wrapper(key: int) -> None:
    """Take off what ``add_call_wrapper`` routed calls through; what was there before the first one (torch's
    ``_call_impl``) goes back when none is left."""
    with _wrappers_lock:
        _live.discard(key)
        for index, (added, _, _) in enumerate(_wrappers):
            if added == key:
                kept = _wrappers[:index] + _wrappers[index + 1:]
                _install(None, kept)
                return
        _heal()  # (its chain is no longer what module calls run: another tool's function stands in the class)


def _past_dead_chains(func: Any) -> Any:
    """``func``, or where it is a chain of ours none of whose wrappers is still on, what it was built on."""
    while type(func) is types.FunctionType and func in _made and not _made[func][1] & _live:
        func = _made[func][0]
    return func


def _install(added: tuple[int, _Make, bool] | None, kept: list[tuple[int, _Make, bool]] | None = None) -> None:
    """Put the chain of ``kept`` (else ``_wrappers``) and ``added`` in place of ``Module._call_impl``; nothing
    changes where making it raises."""
    current = _slot()
    wrappers = _wrappers if kept is None else kept
    base = _base[0] if _base else None
    if not _installed or current is not _installed[0]:
        # Nothing of ours there: torch's, or something else put in since, which calls the chain it found (whose
        # wrappers hand every call on once their blocks are over). Left as it is, or built on, with only the
        # wrapper being added: the others are inside it already.
        base, wrappers = _past_dead_chains(current), []
        if added is None:
            _installed.clear()
            _wrappers[:] = []
            _heal()
            return
    wrappers = [*wrappers, added] if added is not None else wrappers
    chain = base
    for _, make, _ in sorted(wrappers, key=itemgetter(2)):  # (stable: the outermost last, each in its order)
        chain = make(chain)
    if wrappers:
        _made[chain] = (base, frozenset(map(itemgetter(0), wrappers)))
    _set_slot(chain)
    _base[:] = [base]
    _installed[:] = [chain] if wrappers else []
    _wrappers[:] = wrappers
    if not wrappers and _chain_in_class[0]:
        _unpin_dynamo()


def _unpin_dynamo() -> None:
    for module_name, name in _DYNAMO_CALL_IMPL:
        module = sys.modules.get(module_name)
        held = getattr(module, name, None) if module is not None else None
        # (what dynamo holds where it loaded outside a block, told without looking it up among the chains: as the
        # last block ends, right after a step, that look-up is cache misses)
        if held is not None and held is not _FOUND and held is not _past_dead_chains(held):
            setattr(module, name, _past_dead_chains(held))


def unbind_call_wrappers(modules: list[Any], owns: list[dict[str, Any]] | None = None) -> None:
    """Give the modules of ``modules`` (``owns``: their ``__dict__``, where read) compiled in place with
    ``disable=True`` while a call wrapper was on (``.compile()`` stores ``module._call_impl`` as it finds it: then
    the wrapper's chain, bound to the module) what they would hold otherwise: torch's ``_call_impl`` bound to them
    (what the chain was built on, past every chain whose wrappers were all removed). Nothing while dynamo is not
    loaded, or where no chain was ever put in nn.Module itself (one inside torch's function leaves them torch's)."""
    if not _chain_in_class[0] or vars(torch).get("_dynamo") is None:
        return
    if owns is None:
        owns = list(map(_own, modules))
    if not any(map(contains, owns, itertools.repeat("_compiled_call_impl"))):
        return
    for module, own in zip(modules, owns):
        func = getattr(own.get("_compiled_call_impl"), "__func__", None)
        base = _past_dead_chains(func)
        if base is not func:
            own["_compiled_call_impl"] = types.MethodType(base, module)


# -- the entry of every backward pass started from Python ---------------------------------------------------------
# ``torch.autograd.backward`` and ``torch.autograd.grad`` (so ``Tensor.backward``, ``torch.func``'s transforms,
# checkpoint's reentrant backward) start the engine through ``torch.autograd._engine_run_backward``, a name looked up
# in that module at each call. While a hook is added, a function of ours stands there, and under the same name in
# ``torch.autograd.graph`` (where torch defines it, and where its own make_fx tracing reads what to put back after
# putting a function of its own under both names), and calls the hooks before handing the call on.
_ENTRY = "_engine_run_backward"
_entry_hooks: dict[int, Callable[[], None]] = {}
# While a hook is added: the function of ours, and (module, what stood there) for the names it was put under.
_entry_installed: list[tuple[Callable[..., Any], list[tuple[Any, Any]]]] = []
# Every function of ours made -> what it hands calls on to: one found there again (put back by another tool that
# had put its own around it) is looked through to what it was made around.
_entry_made: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_entry_lock = threading.Lock()


# ``torch.jit._state._python_cu.get_functions`` (the unit is made once, as torch.jit loads), read the first time
# it is needed; and True once it listed a function: a compiled function stays in the unit. Read through that chain of
# attributes at each block's start, right after a step, the question cost about 17 µs on BERT, against 7 this way.
_python_functions: list[Callable[[], list[Any]]] = []
_scripted: list[bool] = []


def dynamo_compiled() -> bool:
    """Whether torch.compile (dynamo) has compiled a graph in this process: its counters, read without importing
    dynamo (not imported, it compiled nothing)."""
    utils = sys.modules.get("torch._dynamo.utils")
    counters = getattr(utils, "counters", None)
    try:
        return bool(counters is not None and counters["stats"]["unique_graphs"])
    except (KeyError, TypeError):
        return False


def seeded_rng() -> Any:
    """``torch.random.fork_rng`` over the CPU and every CUDA device this process initialized: a calibration seeds
    its stacks with ``torch.manual_seed``, which reseeds every device, and leaves them all as they were."""
    devices = list(range(torch.cuda.device_count())) if torch.cuda.is_initialized() else []
    return torch.random.fork_rng(devices=devices)


def torchscript_compiled() -> bool:
    """Whether this process has scripted or traced anything (functions and modules compiled by ``torch.jit`` go
    into its Python compilation unit), so that TorchScript code, which starts a backward pass without going through
    ``torch.autograd``, may run; True where this torch keeps that unit otherwise."""
    if _scripted:
        return True
    try:
        if not _python_functions:
            _python_functions.append(torch.jit._state._python_cu.get_functions)
        found = bool(_python_functions[0]())
    except Exception:  # (another torch: assume it may)
        return True
    if found:
        _scripted.append(True)
    return found


def dtensor_local_share(tensor: Any) -> float | None:
    """The share of a DTensor op's work that this rank did, read from its output ``tensor``: the local shard's
    share of the global elements, divided by the mesh size along each dimension where the output is a partial
    sum (each rank contracted its slice). None where ``tensor`` is no DTensor (or DTensor is not imported: then no
    tensor is one)."""
    module = sys.modules.get("torch.distributed.tensor")
    dtensor = getattr(module, "DTensor", None) if module is not None else None
    if dtensor is None or not isinstance(tensor, dtensor):
        return None
    total = tensor.numel()
    share = tensor._local_tensor.numel() / total if total else 1.0
    mesh = tensor.device_mesh
    for dim, placement in enumerate(tensor.placements):
        if placement.is_partial():
            share /= mesh.size(dim)
    return share


def dtensor_locals(values: Any) -> Any:
    """``values`` (an op's arguments, results: tensors in tuples, lists and dicts) with each DTensor replaced by
    this rank's local tensor: what the rank's kernel read and wrote (a replicated tensor whole, a shard as held)."""
    from torch.distributed.tensor import DTensor
    from torch.utils._pytree import tree_map_only

    return tree_map_only(DTensor, attrgetter("_local_tensor"), values)


def fsdp1_wrapper() -> type | None:
    """FSDP1's ``FullyShardedDataParallel``, whose forward puts hooks on its outputs' tensors (its pre-backward
    unshard) that must run after layerprof's in backward; None where torch.distributed.fsdp is not imported (a model
    holds no such module then)."""
    fsdp = sys.modules.get("torch.distributed.fsdp")
    return getattr(fsdp, "FullyShardedDataParallel", None) if fsdp is not None else None


def hooks_outputs_in_forward(classes: Iterable[type]) -> bool:
    """Whether a module of one of these classes puts hooks on its outputs' tensors inside its own forward, which
    must run after layerprof's in backward: an ``fsdp1_wrapper``."""
    wrapper = fsdp1_wrapper()
    return wrapper is not None and any(issubclass(cls, wrapper) for cls in classes)


def _entry_around(base: Callable[..., Any]) -> Callable[..., Any]:
    def engine_entry(*args: Any, **kwargs: Any) -> Any:
        for hook in tuple(_entry_hooks.values()):
            hook()
        return base(*args, **kwargs)

    _entry_made[engine_entry] = base
    return engine_entry


def _past_ours(func: Any) -> Any:
    while func in _entry_made:
        func = _entry_made[func]
    return func


def add_backward_entry_hook(hook: Callable[[], None]) -> int | None:
    """Call ``hook()`` on the calling thread before every backward pass started from Python begins. Returns what
    ``remove_backward_entry_hook`` takes, or None where this torch starts the engine otherwise (no hook added)."""
    with _entry_lock:
        if not _entry_hooks:
            current = getattr(torch.autograd, _ENTRY, None)
            if not callable(current):
                return None
            entry = _entry_around(_past_ours(current))
            replaced = []
            for module in (torch.autograd, torch.autograd.graph):  # (torch.autograd imports .graph)
                previous = getattr(module, _ENTRY, None)
                if callable(previous):
                    replaced.append((module, _past_ours(previous)))
                    setattr(module, _ENTRY, entry)
            _entry_installed[:] = [(entry, replaced)]
        key = next(_HOOK_KEYS)
        _entry_hooks[key] = hook
        return key


def remove_backward_entry_hook(key: int) -> None:
    """Take off what ``add_backward_entry_hook`` added; what stood there goes back when no hook is left, under each
    name still holding ours (another tool that put a function of its own there meanwhile keeps it: ours then stays
    inside it, calling no hook, until a later block finds it and looks through it)."""
    with _entry_lock:
        _entry_hooks.pop(key, None)
        if not _entry_hooks and _entry_installed:
            entry, replaced = _entry_installed.pop()
            for module, previous in replaced:
                if getattr(module, _ENTRY, None) is entry:
                    setattr(module, _ENTRY, previous)


def add_module_registration_hook(hook: Callable[..., Any]) -> Any:
    """``register_module_module_registration_hook(hook)``: ``hook(parent, name, submodule)`` runs as any module
    registers a submodule; returns what ``remove_module_registration_hook`` takes."""
    table = vars(torch_module).get(_GLOBAL_REGISTRATION)
    if table is None:
        return torch_module.register_module_module_registration_hook(hook)
    key = next(_HOOK_KEYS)
    table[key] = hook
    return key


def remove_module_registration_hook(added: Any) -> None:
    if type(added) is int:
        vars(torch_module)[_GLOBAL_REGISTRATION].pop(added, None)
    else:
        added.remove()


def ready_mode(mode_type: type) -> None:
    """Load what a ``TorchDispatchMode`` subclass's first op would: torch wraps its ``__torch_dispatch__`` to keep
    dynamo out, and the wrapper imports ``torch._dynamo`` on its first call (about 1 s, once a process). Called as
    a meter starts, so that the import is not timed inside the first module that runs an op."""
    skips = getattr(mode_type, "_should_skip_dynamo", None)
    if skips is not None and "torch._dynamo" not in sys.modules and skips():
        import torch._dynamo  # noqa: F401


def mode_is_on(mode: Any) -> bool:
    """Whether the dispatch mode ``mode`` is on this thread's mode stack: a mode is its thread's own (and what
    autograd's device threads inherit from the thread that started backward); a thread started by the user has
    none."""
    from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

    return any(entered is mode for entered in _get_current_dispatch_mode_stack())


def faked(tensor: torch.Tensor | None) -> bool:
    """Whether ops run under ``torch._subclasses.fake_tensor.FakeTensorMode`` on this thread, or ``tensor`` (a
    model's first parameter) is a ``FakeTensor``: shapes, dtypes and a device, and no data. Neither can be true
    before ``torch._subclasses.fake_tensor`` is imported, so nothing here imports it."""
    fake_tensor = sys.modules.get("torch._subclasses.fake_tensor")
    if fake_tensor is None:
        return False
    if tensor is not None and isinstance(tensor, fake_tensor.FakeTensor):
        return True
    return torch._C._get_dispatch_mode(torch._C._TorchDispatchModeKey.FAKE) is not None


def fake_mode() -> Any:
    """A new ``FakeTensorMode``: inside it, tensors made (a model's parameters, its inputs) and every op's outputs
    are fake, with shapes, dtypes and a device and no data; ops run their device's kernel choice and compute
    nothing."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    return FakeTensorMode()


def with_forward_pre_hooks(modules: list[Any]) -> list[Any]:
    """The modules of ``modules`` that carry forward pre-hooks of their own."""
    return list(itertools.compress(modules, map(attrgetter("_forward_pre_hooks"), modules)))


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


def sparse_parts(tensor: torch.Tensor) -> tuple[torch.Tensor, ...] | None:
    """The strided tensors a sparse tensor is stored in (indices, then values), or None for any other layout. A COO
    tensor's (``_indices``, ``_values``) are read without the coalescing check its public accessors make."""
    layout = tensor.layout
    if layout == torch.sparse_coo:
        return tensor._indices(), tensor._values()
    if layout in (torch.sparse_csr, torch.sparse_bsr):
        return tensor.crow_indices(), tensor.col_indices(), tensor.values()
    if layout in (torch.sparse_csc, torch.sparse_bsc):
        return tensor.ccol_indices(), tensor.row_indices(), tensor.values()
    return None


def inner_tensors(tensor: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """The tensors that hold the data of a tensor without a storage of its own: a sparse tensor's indices and
    values, a wrapper subclass's inner tensors (``__tensor_flatten__``: a DTensor's local shard); () for others."""
    parts = sparse_parts(tensor)
    if parts is not None:
        return parts
    if is_traceable_wrapper_subclass(tensor):
        names, _ = tensor.__tensor_flatten__()  # (DTensor's also names its device mesh, an opaque object)
        return tuple(inner for inner in map(tensor.__getattribute__, names) if isinstance(inner, torch.Tensor))
    return ()


def tensor_version(tensor: torch.Tensor) -> int:
    """The tensor's version counter, bumped by every in-place op on it or its views."""
    return tensor._version


# torch's reader of the innermost saved-tensor hooks on this thread, looked up once: the memory meter reads it at
# every module call (whether hooks entered inside the block hide what is saved).
_TOP_SAVED_TENSORS_HOOKS = getattr(torch._C._autograd, "_top_saved_tensors_default_hooks", None)


def outer_saved_tensors_hooks() -> tuple[Any, Any] | None:
    """The saved-tensor hooks installed before ours (save_on_cpu, offloading), to chain to; None if none."""
    top = _TOP_SAVED_TENSORS_HOOKS
    return top(False) if top is not None else None


def process_group_initialized() -> bool:
    """``torch.distributed.is_initialized()`` (on a torch built with distributed support), read from c10d's world
    object without the two properties in between: frames of Python code that are cache misses as a LayerProf is
    made right after a step. The public call where c10d's internals differ."""
    c10d = _C10D[0] if _C10D else None
    if c10d is None:
        c10d = sys.modules.get("torch.distributed.distributed_c10d")
        if c10d is not None:  # (a module, once imported, stays the one torch's functions read)
            _C10D.append(c10d)
    try:
        return c10d._world._default_pg is not None  # type: ignore[union-attr]
    except AttributeError:
        return torch.distributed.is_initialized()


# c10d's module once imported: the lookup in ``sys.modules`` (thousands of entries, cold) is made until then only.
_C10D: list[Any] = []


def compiled_module_type() -> type | None:
    """The class of a ``torch.compile``'d module (``OptimizedModule``), None where dynamo is missing or was never
    imported (then no module can be compiled): ``getattr(torch, "_dynamo")`` would import it, a second of CPU time
    on the first LayerProf of a process."""
    dynamo = vars(torch).get("_dynamo")
    eval_frame = getattr(dynamo, "eval_frame", None) if dynamo is not None else None
    return getattr(eval_frame, "OptimizedModule", None)


def is_compiled_function(function: Any) -> bool:
    """Whether ``function`` (or the function of a bound method) is a ``torch.compile`` wrapper: dynamo marks the
    wrappers it makes with the function they wrap, and a ``torch.compiler.disable`` wrapper, marked the same way,
    also as disabled. ``torch.compile(fn, disable=True)`` returns ``fn`` itself: not compiled."""
    return (getattr(function, "_torchdynamo_orig_callable", None) is not None
            and not getattr(function, "_torchdynamo_disable", False))


# Class forwards seen not to be torch.compile wrappers. Whether a function is one does not change (compiling makes
# a new function), so each is read once (two failing attribute reads), not at every block's start and end; held
# here, a function's id is never taken over by a new one.
_EAGER_FORWARDS: set[Any] = set()


def eager_forwards(classes: set[type]) -> bool:
    """Whether no class of ``classes`` has a compiled ``forward``."""
    try:
        forwards = set(map(getattr, classes, itertools.repeat("forward"), itertools.repeat(None)))
    except TypeError:  # an unhashable forward: read each one
        return not any(is_compiled_function(getattr(cls, "forward", None)) for cls in classes)
    if forwards <= _EAGER_FORWARDS:
        return True
    if any(map(is_compiled_function, forwards)):
        return False
    if len(_EAGER_FORWARDS) > 4096:  # classes made on the fly: keep the set bounded
        _EAGER_FORWARDS.clear()
    _EAGER_FORWARDS.update(forwards)
    return True


def classes_calling_around(classes: Iterable[type]) -> set[type]:
    """Those of ``classes`` with a ``_call_impl`` of their own (``torch.compiler.disable`` on a class sets one):
    their instances' calls do not go through ``Module._call_impl``. One C-level pass: the others find nn.Module's."""
    classes = list(classes)
    current = vars(_Module).get(_CALL_IMPL)
    return set(itertools.compress(classes, map(is_not, map(getattr, classes, itertools.repeat(_CALL_IMPL),
                                                            itertools.repeat(current)), itertools.repeat(current))))


def compiled_around(modules: list[Any], owns: list[dict[str, Any]] | None = None) -> list[int]:
    """The indices in ``modules`` of those compiled in place (``.compile()`` stores what ``__call__`` runs instead
    of ``_call_impl``; with ``disable=True``, torch's own ``_call_impl``, bound to the module, which still runs the
    module's hooks). None while dynamo is not loaded."""
    if vars(torch).get("_dynamo") is None:  # never imported, so nothing was compiled
        return []
    if owns is None:
        owns = list(map(_own, modules))
    if not any(map(contains, owns, itertools.repeat("_compiled_call_impl"))):
        return []
    return [index for index, own in enumerate(owns) if own.get("_compiled_call_impl") is not None]


def calling_around(modules: list[Any], classes: Iterable[type] | None = None,
                   compiled: list[int] | None = None) -> list[Any]:
    """The modules of ``modules`` whose calls do not go through ``Module._call_impl``: those of the classes
    ``classes_calling_around`` finds among ``classes`` (else the modules' classes), and those of ``compiled_around``
    (``compiled``: its answer, where the caller has it)."""
    own = classes_calling_around(set(map(type, modules)) if classes is None else classes)
    around = [module for module in modules if type(module) in own] if own else []
    if compiled is None:
        compiled = compiled_around(modules)
    return around + [modules[index] for index in compiled if type(modules[index]) not in own]


def compiled_in_place(paths: list[tuple[str, Any]], modules: list[Any] | None = None,
                      owns: list[dict[str, Any]] | None = None) -> tuple[str, Any, str] | None:
    """The first module of ``paths`` compiled in place, as ``(name, module, how)``: ``how`` is ``"compile"`` after
    ``module.compile()`` (which stores a ``torch.compile`` of the module's ``_call_impl``, hooks included, in
    ``_compiled_call_impl`` for ``__call__`` to run), ``"forward"`` when its forward is a compiled function (put on
    the instance, or a decorated method). None when there is none. About 0.3 µs per module: most modules have
    neither attribute of their own, and a class's forward is looked at once; nothing while dynamo is not loaded."""
    dynamo = vars(torch).get("_dynamo")  # set when torch._dynamo is imported; reading it imports nothing
    if dynamo is None:
        return None  # never imported, so nothing was compiled
    if modules is None:  # (``modules``: the modules of ``paths``, where the caller has them)
        modules = list(map(_second, paths))
    if owns is None:  # (``owns``: the modules' ``__dict__``, where the caller has read them for its own checks)
        owns = list(map(_own, modules))
    if (not any(map(contains, owns, itertools.repeat("_compiled_call_impl")))
            and not any(map(contains, owns, itertools.repeat("forward")))
            and eager_forwards(set(map(type, modules)))):
        return None  # the common case, read with C-level calls: no module has either attribute of its own
    if getattr(getattr(dynamo, "config", None), "disable", False):
        return None  # off (TORCH_COMPILE_DISABLE=1): all runs eagerly (a config read costs tens of µs)
    by_class: dict[type, bool] = {}
    for name, module in paths:
        own = module.__dict__
        if "_compiled_call_impl" in own and is_compiled_function(own["_compiled_call_impl"]):
            return name, module, "compile"
        if "forward" in own:
            if is_compiled_function(own["forward"]):
                return name, module, "forward"
            continue
        cls = type(module)
        compiled = by_class.get(cls)
        if compiled is None:
            compiled = by_class[cls] = is_compiled_function(getattr(cls, "forward", None))
        if compiled:
            return name, module, "forward"
    return None


def _dict_version_reader() -> Callable[[dict[Any, Any]], int] | None:
    """Dynamo's reader of a dict's version (``torch._C._dynamo.guards.dict_version``): a number that is new each
    time the dict is made or written into, unique across dicts (CPython's ``ma_version_tag`` through 3.11, a dict
    watcher of torch's from 3.12), so two equal readings of one live dict mean it holds what it held. Checked as
    layerprof loads: two dicts, a write into one, and an empty dict filled by ``update`` (which CPython copies whole,
    an event a watcher may leave out) must read four numbers; None where torch has no such reader or it does not
    behave so."""
    read = getattr(getattr(getattr(torch._C, "_dynamo", None), "guards", None), "dict_version", None)
    if read is None:
        return None
    probe: dict[Any, Any] = {}
    filled: dict[Any, Any] = {}
    try:
        before, empty = read(probe), read(filled)
        probe[0] = 0
        filled.update({1: 1})
        readings = {before, read(probe), empty, read(filled)}
    except Exception:  # noqa: BLE001 - any failure means no reader
        return None
    return read if len(readings) == 4 else None


# A dict's version, or None where torch gives none (``_dict_version_reader``).
dict_version: Callable[[dict[Any, Any]], int] | None = _dict_version_reader()


def queue_backward_callback(callback: Callable[[], None]) -> bool:
    """Run ``callback`` when the running backward pass finishes (the autograd engine's final callbacks, as FSDP
    uses them); False when no backward pass is running here, so nothing was queued."""
    try:
        torch.autograd.Variable._execution_engine.queue_callback(callback)  # type: ignore[attr-defined]
    except RuntimeError:
        return False
    return True


def cuda_raw_stream() -> Callable[[int], int]:
    """A function of a device index giving the raw handle of its current CUDA stream: torch's C function (one
    call per clock stamp, no Python frame), or the public ``current_stream(index).cuda_stream`` where a torch has
    no such function. Read when a CUDA clock is made: a CPU-only torch may lack it."""
    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    if raw is not None:
        return raw
    return lambda index: torch.cuda.current_stream(index).cuda_stream


def cuda_event_record() -> Callable[[Any, Any], None]:
    """``record(event, stream)`` for a ``torch.cuda.Event``: the C method that ``Event.record`` calls once it has
    a stream (its Python wrapper looks the current stream up when none is given), or the public method."""
    record = getattr(getattr(torch._C, "_CudaEventBase", None), "record", None)
    if record is not None:
        return record
    return lambda event, stream: event.record(stream)


def profiler_range(name: str) -> Any:
    """A context manager that opens a torch.profiler range named ``name``: ``_RecordFunctionFast`` (about 0.5 µs
    per range, what torch's own fast paths use) where torch has it, else the public ``record_function`` (~13 µs)."""
    fast = getattr(torch._C._profiler, "_RecordFunctionFast", None)
    if fast is not None:
        return fast(name)
    return torch.autograd.profiler.record_function(name)


# -- FSDP2 (torch.distributed.fsdp.fully_shard) ------------------------------------------------------------------
# The methods of an FSDPParamGroup (one per fully_shard unit) that FSDP2's module hooks, tensor hooks, autograd
# Function and final backward callback call by attribute, so that an attribute of the same name on the instance
# runs in their place: the all-gather (``unshard``, its copy-out ``wait_for_unshard``, and the ``pre_forward`` /
# ``pre_backward`` hooks that call them, prefetching other units), ``reshard``, the reduce-scatter in
# ``post_backward``, and the final waits of ``finalize_backward``.
FSDP2_HOOK_POINTS = ("pre_forward", "post_forward", "pre_backward", "post_backward", "unshard", "wait_for_unshard",
                     "reshard", "finalize_backward")


@functools.cache
def _fsdp2_module_type() -> type | None:
    try:
        from torch.distributed.fsdp import FSDPModule
    except ImportError:
        return None
    return FSDPModule


def fsdp2_param_groups(module: Any) -> list[Any]:
    """The FSDPParamGroups of a module ``fully_shard`` was applied to ([] for any other module, and where this
    torch has no FSDP2)."""
    fsdp_module = _fsdp2_module_type()
    if fsdp_module is None or not isinstance(module, fsdp_module):
        return []
    state = module._get_fsdp_state()
    groups = vars(state).get("_fsdp_param_groups")
    if groups is None:  # older torch (2.11): one group per unit, or None where the unit has no parameter
        group = vars(state).get("_fsdp_param_group")
        return [] if group is None else [group]
    return list(groups)


def fsdp2_comm_buffers(group: Any) -> tuple[Any, Any]:
    """The output of the all-gather a param group has in flight (every rank's shard; None when none: unsharded
    already) and the input of the last reduce-scatter issued on its communication context (every rank's
    gradients in the reduce dtype; None if none is kept). Compared before and after a call, they tell which
    collectives the call issued."""
    gathering = getattr(getattr(group, "_all_gather_result", None), "all_gather_output", None)
    context = getattr(group, "comm_ctx", None)
    states = getattr(context, "reduce_scatter_states", None)
    if states is None:  # older torch (2.11) keeps the last reduce-scatter only
        state = getattr(context, "reduce_scatter_state", None)
        states = [state] if state is not None else []
    reducing = getattr(states[-1], "reduce_scatter_input", None) if states else None
    return gathering, reducing


_ABSENT = object()


def patch_fsdp2_group(group: Any, wrap: Callable[[str, Callable[..., Any]], Callable[..., Any]]) -> dict[str, Any]:
    """Put ``wrap(point, method)`` on the param group instance in place of each of ``FSDP2_HOOK_POINTS`` it has
    (FSDP2 calls them by attribute); returns what ``unpatch_fsdp2_group`` needs to put things back."""
    saved: dict[str, Any] = {}
    try:
        for point in FSDP2_HOOK_POINTS:
            method = getattr(group, point, None)
            if callable(method):
                saved[point] = vars(group).get(point, _ABSENT)
                setattr(group, point, wrap(point, method))
    except BaseException:
        unpatch_fsdp2_group(group, saved)
        raise
    return saved


def unpatch_fsdp2_group(group: Any, saved: dict[str, Any]) -> None:
    """Undo ``patch_fsdp2_group``: the class's methods (or what the instance had before) are called again."""
    for point, previous in saved.items():
        if previous is _ABSENT:
            vars(group).pop(point, None)
        else:
            setattr(group, point, previous)


def global_forward_hooks() -> list[Any]:
    """The forward hooks and pre-hooks registered for every module (``register_module_forward_hook`` and
    ``register_module_forward_pre_hook``), which run for each module call as a module's own do."""
    return [*torch_module._global_forward_hooks.values(), *torch_module._global_forward_pre_hooks.values()]
