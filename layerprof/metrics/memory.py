"""Memory per module: activations created, tensors saved for backward, and (on CUDA) allocator deltas and peaks.

On every device:

- ``activation_bytes``: bytes of the storages of the tensors that the module's calls return, counted once per
  storage for the module that first returned it, and only if it is new: a storage that was an input of the call
  (a view, an in-place op, ``Dropout`` in eval mode), a parameter or a buffer is not an activation. Inclusive: a
  call counts what it and the calls nested in it returned, so children <= parent and the root's value is every
  unique module output of the step. ``self_activation_bytes`` excludes nested calls.
- ``saved_bytes``: bytes of the storages autograd saved for backward while the module's forward ran
  (``torch.autograd.graph.saved_tensors_hooks``), each storage counted once, for the innermost call running when
  it was first saved; parameters and buffers are not counted (they live anyway). Inclusive like
  ``activation_bytes``; ``self_saved_bytes`` is the innermost part. A region under ``torch.utils.checkpoint``
  saves nothing through these hooks, which is the point of checkpointing and shows here as 0.

An ancestor that adopts a call made outside its own (an encoder called by itself before the model:
``record/adoption.py``) adds that call's inclusive figures to its inclusive ones, the CUDA deltas and peaks too,
where it ran in the step; its self figures and the checkpoint planner's are its own calls'.

Storages are deduplicated within one forward of the model (from the outermost call's start), so profiling several
steps sums the steps like the times. The pack hook hands autograd a detached alias of the saved tensor (or chains
to hooks installed before profiling, such as ``save_on_cpu``), so memory and gradients are those of an unprofiled
run; the hook's cost is why this meter says ``distorts_timing``.

On CUDA, per call on its device (the device of the call's clock: its first input tensor or parameter):

- ``cuda_forward_delta_bytes``: ``memory_allocated`` at the end of the forward minus at its start (summed over
  calls); ``cuda_forward_peak_bytes``: the highest ``memory_allocated`` during the forward minus the value at its
  start (max over calls). ``cuda_backward_delta_bytes`` / ``cuda_backward_peak_bytes`` the same from the start of
  the call's backward to its end. The allocator's peak counter is reset at every boundary and each interval's peak
  is kept, so nested and interleaved calls are exact. This resets ``torch.cuda.max_memory_allocated``.

For the checkpoint planner (``layerprof.plan``), on every device: ``checkpoint_freed_bytes``, what wrapping the
module in ``torch.utils.checkpoint`` frees, ``checkpoint_kept_bytes``, what the wrapped region must keep in their
place, and the counts that make wrapping unsafe or ambiguous (``checkpoint_side_effects``,
``checkpoint_inplace_inputs``, ``foreign_calls``); see ``checkpoint_bytes``.
"""
from __future__ import annotations

import weakref

from bisect import bisect_left
from operator import itemgetter
from typing import Any, Iterable, Sequence

import torch
from torch import nn
from torch.utils.checkpoint import CheckpointError

from .._tensors import is_lazy, iter_tensors
from .._warn import warn_user
from .._torch import StorageWeakRef, inner_tensors, outer_saved_tensors_hooks, storage_key, subclass_functions_off
from .._torch import tensor_version
from ..record.adoption import adopters
from ..record.fields import Field, declare
from ..record.records import ModuleRecord
from .checkpoint_bytes import (
    CHECKPOINT_FIELDS, STORAGES_ATTRIBUTE, buffer_versions, has_side_effects, input_versions, mutated_inputs,
    settle_forward, updated_buffers,
    storage_table, updates_a_cache,
)
from .meter import Meter, register_meter

__all__ = ["MemoryMeter", "hidden_shown", "MemoryReader", "CudaMemoryReader", "PeakLog", "MEMORY_FIELDS", "CUDA_FIELDS",
           "TIMELINE_ATTRIBUTE", "parameters_dtype", "autocast_of"]

# The root record's private attribute holding the step's memory levels at every boundary (live profiles, and
# profiles saved from one: ``layerprof.record.step_tables``).
from ..record.step_tables import TIMELINE_ATTRIBUTE  # noqa: E402

CUDA_FIELDS = (
    "cuda_forward_delta_bytes", "cuda_forward_peak_bytes", "cuda_backward_delta_bytes", "cuda_backward_peak_bytes",
)
MEMORY_FIELDS = (
    "activation_bytes", "self_activation_bytes", "saved_bytes", "self_saved_bytes", *CUDA_FIELDS, *CHECKPOINT_FIELDS,
)
# A CPU profile run with the memory meter lacks these too: "run with metrics=('memory',)" alone would be untrue.
_ON_CUDA = "it is read from the CUDA allocator: run the model on a GPU with LayerProf(model, metrics=('memory',))"

declare(
    Field("activation_bytes", "bytes", "Activations", share_of="activation_bytes", meter="memory",
          doc="bytes of the tensors the module's calls returned that were new (not inputs, not parameters)"),
    Field("self_activation_bytes", "bytes", "Self Activations", share_of="activation_bytes", meter="memory"),
    Field("saved_bytes", "bytes", "Saved", share_of="saved_bytes", meter="memory",
          doc="bytes autograd saved for backward during the module's calls"),
    Field("self_saved_bytes", "bytes", "Self Saved", share_of="saved_bytes", meter="memory"),
    Field("cuda_forward_delta_bytes", "bytes", "CUDA Fwd Δ", meter="memory", needs=_ON_CUDA),
    Field("cuda_forward_peak_bytes", "bytes", "CUDA Fwd Peak", combine="max", meter="memory", needs=_ON_CUDA),
    Field("cuda_backward_delta_bytes", "bytes", "CUDA Bwd Δ", meter="memory", needs=_ON_CUDA),
    Field("cuda_backward_peak_bytes", "bytes", "CUDA Bwd Peak", combine="max", meter="memory", needs=_ON_CUDA),
    aliases={"memory": ("saved_bytes", "activation_bytes")},
)


# -- reading the allocator -------------------------------------------------------------------------------------
class MemoryReader:
    """Reads an allocator: ``read(device)`` is (bytes allocated now, the most allocated since the last
    ``reset_peak(device)``). Tests inject a fake one through ``MemoryMeter.reader_factory``."""

    def covers(self, device: str) -> bool:
        """Whether this reader measures ``device`` (a clock's device string, e.g. ``"cuda:0"``) for work run on
        the calling thread: asked at every call's start, and again as its backward starts and ends."""
        return False

    def read(self, device: str) -> tuple[int, int]:
        raise NotImplementedError

    def reset_peak(self, device: str) -> None:
        raise NotImplementedError

    def op_count(self, device: str) -> int | None:
        """Ops run on ``device`` since ``open()``, for a reader that sees them (``LiveBytesReader``); else None."""
        return None

    def open(self) -> None:
        """The memory meter starts counting (a reader that must watch the step, as ``LiveBytesReader``, starts)."""

    def close(self) -> None:
        """The memory meter stops; after this ``read`` gives what it read last."""


class CudaMemoryReader(MemoryReader):
    """``memory_allocated`` and ``max_memory_allocated`` of the CUDA caching allocator, read from one stats call."""

    def covers(self, device: str) -> bool:
        return device.startswith("cuda")

    def read(self, device: str) -> tuple[int, int]:
        # The nested dict skips the flattening that ``memory_allocated`` does on every call.
        allocated = torch.cuda.memory_stats_as_nested_dict(device)["allocated_bytes"]["all"]
        return int(allocated["current"]), int(allocated["peak"])

    def reset_peak(self, device: str) -> None:
        torch.cuda.reset_peak_memory_stats(device)


class PeakLog:
    """The peaks of the intervals between boundaries on one device, kept so that "the highest value since boundary
    ``b``" is exact for any ``b`` however calls nest or interleave (backward branches do), in O(log n).

    Only a decreasing run of (interval, peak) is kept for the queries: an older interval with a lower peak can
    never be the answer for a query that also covers a later, higher one. ``levels[k]`` (bytes allocated at
    boundary ``k``) and ``interval_peaks[k]`` (the peak of the interval ending there) keep the whole step, for the
    checkpoint planner's prediction of the step's peak (index 0: nothing)."""

    def __init__(self, reader: MemoryReader, device: str) -> None:
        self.reader = reader
        self.device = device
        self.count = 0  # boundaries so far; interval k ends at boundary k
        self.intervals: list[int] = []
        self.peaks: list[int] = []
        self.levels: list[int] = [0]
        self.interval_peaks: list[int] = [0]

    def boundary(self) -> tuple[int, int]:
        """Close the current interval; returns (this boundary's number, bytes allocated now)."""
        current, peak = self.reader.read(self.device)
        self.reader.reset_peak(self.device)
        self.count += 1
        self.levels.append(current)
        self.interval_peaks.append(peak)
        while self.peaks and self.peaks[-1] <= peak:
            self.peaks.pop()
            self.intervals.pop()
        self.intervals.append(self.count)
        self.peaks.append(peak)
        return self.count, current

    def peak_since(self, mark: int) -> int:
        """The highest allocation in the intervals after boundary ``mark`` up to the latest boundary."""
        return self.peaks[bisect_left(self.intervals, mark + 1)]


# -- per call ----------------------------------------------------------------------------------------------------
class _CallMemory:
    __slots__ = (
        "inputs", "self_activation", "self_saved", "activation", "saved", "log", "self_tensors", "tensors",
        "name", "parent", "depth", "input_sizes", "input_versions", "freed", "kept", "side_effects", "inplace",
        "changed_later", "cache_updates", "no_grad", "ops", "ops_start", "params", "hidden", "incomplete",
        "forward_mark", "forward_start", "forward_delta", "forward_peak", "forward_end_mark",
        "backward_mark", "backward_start", "backward_delta", "backward_peak", "backward_end_mark",
    )

    def __init__(self, inputs: dict[int, int], log: PeakLog | None, parent: _CallMemory | None) -> None:
        self.inputs = set(inputs)
        self.input_sizes = inputs  # storage key -> bytes, for what a checkpoint of this call must keep
        self.input_versions: list[tuple[torch.Tensor, int]] = []
        self.name = ""
        self.parent = parent
        self.depth = 0 if parent is None else parent.depth + 1
        self.freed = self.kept = self.side_effects = self.cache_updates = self.inplace = self.changed_later = 0
        self.no_grad = 0  # 1 for a call made with gradients off
        self.self_activation = self.self_saved = 0
        self.activation = self.saved = 0  # inclusive, summed at fill
        self.self_tensors = self.tensors = 0  # every saved tensor, whatever its storage (the checkpoint's cost)
        self.log = log
        self.forward_mark = self.forward_start = self.backward_mark = self.backward_start = 0
        self.forward_end_mark = self.backward_end_mark = 0  # boundary numbers, 0 where not seen
        self.forward_delta: int | None = None
        self.forward_peak: int | None = None
        self.backward_delta: int | None = None
        self.backward_peak: int | None = None
        self.ops: int | None = None  # ops the reader saw in the forward; None where it raised (never ended)
        self.ops_start: int | None = None  # the reader's op count when the forward started
        self.params: dict[str, Any] | None = None  # the module's own parameter table (read as it saves)
        # Ran under saved-tensor hooks entered inside the block (``save_on_cpu``), which autograd runs instead of
        # ours: what it saved is unknown (``hidden``), and so is the inclusive figure of it and its callers.
        self.hidden = self.incomplete = False


def _holds(params: dict[str, Any], key: int) -> bool:
    """Whether one of a module's own parameters as they are now, a leaf ``nn.Parameter``, has the storage ``key``
    (not a tensor computed in the step that ``torch.func.functional_call`` or a stateless reparametrization puts
    in the table: an activation)."""
    for parameter in params.values():
        if not isinstance(parameter, nn.Parameter) or parameter.grad_fn is not None:
            continue
        storage = _storage(parameter)
        if storage is not None and storage_key(storage) == key:
            return True
    return False


def _storage(tensor: torch.Tensor) -> Any:
    if type(tensor) is not torch.Tensor and type(tensor) is not nn.Parameter:
        inner = inner_tensors(tensor)
        if len(inner) == 1:
            # A DTensor's data is its local shard: its own storage is a placeholder of the global size (a rank's
            # saved and activation bytes under tensor parallelism read world_size times its own).
            tensor = inner[0]
    try:
        return tensor.untyped_storage()
    except (RuntimeError, NotImplementedError, TypeError):  # sparse, nested or wrapper tensors
        return None
    except ValueError:  # a lazy module's parameter not made yet (``nn.LazyLinear`` before its first call)
        return None


_second = itemgetter(1)


def _holds_lazy(module: nn.Module) -> bool:
    return any(t is not None and is_lazy(t) for table in (module._parameters, module._buffers) for t in table.values())


def _with_lazy(modules: Iterable[nn.Module]) -> list[nn.Module]:
    """Those of ``modules`` holding a parameter or buffer not made yet (a lazy module before its first call)."""
    return [module for module in modules if _holds_lazy(module)]


_UNREAD = object()


def _first_parameter(model: nn.Module) -> tuple[bool, str, str] | None:
    """Whether ``model``'s first parameter is on meta, its dtype (``"float32"``) and its device type (``"cpu"``);
    None where it has none. Read past a tensor subclass's functions: inside ``call_for_per_sample_grads`` (Opacus's
    Expanded Weights) the parameter is an ``ExpandedWeight``, which raises on any attribute read."""
    parameter = next(model.parameters(), None)
    if parameter is None:
        return None
    with subclass_functions_off():
        return parameter.is_meta, str(parameter.dtype).replace("torch.", ""), parameter.device.type


def parameters_dtype(model: nn.Module) -> str | None:
    """The dtype of ``model``'s first parameter (``"float32"``), None where it has none or it is on meta."""
    first = _first_parameter(model)
    return None if first is None or first[0] else first[1]


def autocast_of(model: nn.Module) -> str | bool | None:
    """The dtype ``torch.autocast`` computes in (``"bfloat16"``) where it is on, now, for the device of ``model``'s
    first parameter (the CPU for a model without any), else False; None on meta or another device."""
    first = _first_parameter(model)
    if first is not None and first[0]:
        return None
    device = first[2] if first is not None else "cpu"
    if device not in ("cpu", "cuda"):
        return None
    if not torch.is_autocast_enabled(device):
        return False
    return str(torch.get_autocast_dtype(device)).replace("torch.", "")


def _storage_keys(*objs: Any) -> set[int]:
    return set(_storages(*objs))


def _storages(*objs: Any) -> dict[int, Any]:
    """Storage key -> storage, of the tensors in ``objs``."""
    found = {}
    for tensor in iter_tensors(objs):
        storage = _storage(tensor)
        if storage is not None:
            found[storage_key(storage)] = storage
    return found


@register_meter
class MemoryMeter(Meter):
    """Activation and saved-for-backward bytes per module on any device; allocator deltas and peaks on CUDA."""

    name = "memory"
    wants_forward_hooks = True
    wants_backward_hooks = True
    distorts_timing = True  # a Python pack hook runs for every saved tensor, and CUDA reads at every boundary
    reader_factory: Any = CudaMemoryReader

    def __init__(self) -> None:
        self._calls: list[tuple[Any, _CallMemory]] = []
        self._states: dict[int, _CallMemory] = {}  # id(call) -> its memory
        self._stack: list[Any] = []  # the running forward calls, innermost last
        # Storage (by StorageImpl address) -> a weak reference that keeps the address from being reused.
        self._returned: dict[int, StorageWeakRef] = {}
        # id(caller's state) -> [(call state, [(weak tensor, version as the call began)])] of the calls that
        # returned with their inputs as they found them: read again as each caller up the chain returns, an input
        # that caller's code modified in place since (``x += block(x)``) breaks a checkpoint of the call as surely
        # as a change inside it.
        self._inputs_after: dict[int, list[tuple[Any, list[tuple[Any, int]]]]] = {}
        self._saved: dict[int, StorageWeakRef] = {}
        # The calls' inputs too: one nothing saves or returns (a temporary made between two modules) dies within the
        # forward, and a storage made after it at the same address would be taken for it.
        self._inputs: dict[int, StorageWeakRef] = {}
        # Storage -> [bytes, the innermost calls that saved it] in the current forward, for the planner's figures.
        self._savers: dict[int, list[Any]] = {}
        self._forward: list[_CallMemory] = []  # the calls of the current forward of the model
        self._forward_traces: list[Any] = []  # and their calls, to see when its backward has run
        # Forwards that saved for backward when every earlier forward that saved had released what it saved
        # (gradient accumulation: each micro-batch's saved bytes are released before the next is made, so the
        # step's sum is never held at once). ``_held``: per earlier saving forward, weak references to the aliases
        # its saved tensors were packed as, which live as long as the graph holds them (a backward that keeps the
        # graph, ``retain_graph`` or ``create_graph`` as a gradient penalty's, releases nothing); or, where other
        # saved-tensor hooks pack them, its calls, released once their backward has run.
        self._after_backward = 0
        self._held: list[list[Any]] = []
        self._packed: list[Any] = []  # the current forward's aliases (weak references)
        self._saved_before = False
        self._starts_released = False
        self._tables: list[dict[str, list[Any]]] = []  # per forward: its storages, for the planner's exact figure
        self._table_calls: list[list[_CallMemory]] = []  # per forward: its calls, whose boundaries fill adds
        # Per forward: weak refs to its saved storages (the table's first rows) and to autograd's aliases of them.
        self._table_refs: list[tuple[list[Any], list[Any]]] = []
        self._step_log: PeakLog | None = None  # the log of the device of the model's first call: the step's
        self._step: dict[str, Any] = {}  # the step's own figures (meta): its peak, where it started and ended
        self._static: set[int] = set()  # parameters' and buffers' storages
        self._lazy: list[nn.Module] = []  # lazy modules whose parameters are not made yet
        # Every module's own buffers with their versions as the block started, and the names of the modules whose
        # buffers the block updated in place or replaced (read as it stops): side effects a recomputation would repeat.
        self._buffer_versions: list[Any] = []
        self._updated: set[str] = set()
        self._logs: dict[str, PeakLog | None] = {}
        self._reader: MemoryReader = MemoryReader()
        self._hooks: Any = None
        self._outer: tuple[Any, Any] | None = None
        self._own_pack: Any = None  # our pack hook as autograd holds it, to tell it from hooks entered after ours
        # The outermost modules called under saved-tensor hooks entered inside the block, which hide what they save.
        self._hidden: dict[str, None] = {}
        # The last tensor packed and the alias handed for it (weak references: nothing kept alive), so that one
        # tensor saved in several slots in a row (``checkpoint(attn, x, x, x)`` saves its inputs so) unpacks as one
        # object, as without hooks: ``nn.MultiheadAttention`` takes its self-attention path on ``query is key``.
        self._last_packed: tuple[Any, Any] | None = None
        # The model, while the step runs, and its mode (``model.training``) and first parameter's dtype as its
        # forward first saved for backward (as the step ended where it saved nothing): a plan applied to the model
        # in the other mode or dtype frees other bytes (Dropout saves its mask in training only). Read inside the
        # forward, where a plan's wrapper reads them: FSDP2's mixed precision puts bfloat16 parameters on the
        # modules only there, and a step may evaluate (model.eval()) after its training forward and backward.
        self._model: nn.Module | None = None
        self._training: bool | None = None
        self._dtype: Any = _UNREAD
        # ``autocast_of`` the model inside its first forward with gradients on (bf16 autocast saves other bytes): as
        # its first module below the top-level call began, where the plan's check reads it; the top-level call's
        # own where none is called. ``_autocast_inside``: whether it was read there.
        self._autocast: str | bool | None = None
        self._autocast_inside = False

    # -- lifecycle -----------------------------------------------------------------------------------------------
    def start(self, model: nn.Module, records: dict[str, ModuleRecord], entries: Sequence[tuple[str, nn.Module]]) -> None:
        self._after_backward, self._held, self._saved_before, self._starts_released = 0, [], False, False
        self._model, self._training, self._dtype, self._autocast = model, None, _UNREAD, None
        self._autocast_inside = False
        self._static = _storage_keys(list(model.parameters()), list(model.buffers()))
        # Lazy modules whose parameters are made in their first call: their storages join the static ones then.
        self._lazy = _with_lazy(model.modules())
        self._buffer_versions = buffer_versions(entries)
        self._reader = type(self).reader_factory()
        # Hooks installed before profiling (save_on_cpu, offloading) keep working: ours chains to them.
        self._outer = outer_saved_tensors_hooks()
        hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack)
        hooks.__enter__()  # raises where saved-tensor hooks are disabled: before the reader opens, nothing to undo
        self._hooks, self._own_pack = hooks, hooks.pack_hook
        try:
            self._reader.open()
        except BaseException:
            self._hooks = None
            hooks.__exit__(None, None, None)
            raise

    def stop(self) -> None:
        self._updated.update(updated_buffers(self._buffer_versions))
        self._buffer_versions = []
        if self._model is not None:
            if self._dtype is _UNREAD:  # (nothing saved)
                self._training = bool(self._model.training)
            self._model = None
        hooks, self._hooks = self._hooks, None
        if self._hidden:
            self._warn_hidden()
        self._stack.clear()
        self._inputs_after.clear()
        self._returned.clear()
        self._inputs.clear()
        self._last_packed = None
        try:
            self._settle()
            self._mark_held_outside()
            self._end_of_step()
        finally:
            self._saved.clear()
            self._reader.close()
            if hooks is not None:
                hooks.__exit__(None, None, None)

    def _end_of_step(self) -> None:
        """Close every log's last interval (the step's end: the backward and what ran after it are in it) and keep
        the step's figures: the most allocated from the model's first call on, and the levels there and now."""
        for log in self._logs.values():
            if log is not None and log.count:
                log.boundary()
        log = self._step_log
        if log is not None and log.count >= 2:
            # The interval before the first call runs from the last reset, which may be long before the step.
            self._step = {"device": log.device, "step_peak_bytes": max(log.interval_peaks[2:]),
                          "step_start_bytes": log.levels[1], "step_end_bytes": log.levels[-1]}

    def meta(self) -> dict[str, Any]:
        """On a device the reader covers (CUDA; the CPU with ``live_memory``): ``step_peak_bytes``, the most
        allocated from the start of the model's first forward call to the end of the step (allocator bytes on
        CUDA, live tensor bytes made in the step on the CPU), ``step_start_bytes`` and ``step_end_bytes``. Where a
        forward of the step saved for backward after the backward of every earlier forward that saved had run
        (gradient accumulation), ``forwards_after_backward``: how many did. ``training`` and ``dtype``: the model's
        mode (``model.training``) and its first parameter's dtype as its forward first saved for backward (the mode
        as the step ended where it saved nothing); ``autocast``: the dtype ``torch.autocast`` computed in inside
        its first forward with gradients on (as its first submodule call began), or False where it was off."""
        found = dict(self._step)
        if self._training is not None:
            found["training"] = self._training
        if isinstance(self._dtype, str):
            found["dtype"] = self._dtype
        if self._autocast is not None:
            found["autocast"] = self._autocast
        if self._after_backward:
            found["forwards_after_backward"] = self._after_backward
        if self._hidden:
            found["under_other_saved_tensors_hooks"] = list(self._hidden)
        return found

    def _warn_hidden(self) -> None:
        warn_user(
            f"metrics=({self.name!r},) counts what autograd saves for backward through saved-tensor hooks of its "
            f"own, and hooks entered inside the block (torch.autograd.graph.save_on_cpu, saved_tensors_hooks) run "
            f"instead of them: what {hidden_shown(list(self._hidden))} saved under yours is unknown, so their "
            "saved-bytes figures read None and checkpoint_plan refuses this profile. Enter your hooks around the "
            "block (with save_on_cpu(): with LayerProf(...)), where the meter hands each tensor on to them and counts "
            "it")

    def explain(self, error: BaseException) -> str | None:
        if isinstance(error, RuntimeError) and "saved tensor hooks" in str(error):
            return (f"metrics=({self.name!r},) counts what autograd saves with saved-tensor hooks, which this code "
                    "does not run with (torch.func's grad, vjp, jacrev and hessian do not support them); profile it "
                    "without that metric: timing, 'flops' and 'shapes' work there")
        if isinstance(error, CheckpointError) and "Recomputed values" in str(error):
            # Not always this meter's doing: a recomputation that runs other code than its forward raises the same
            # without it (a parametrization computed in forward under parametrize.cached() is recomputed outside
            # the cache, its own ops added), so the note names both.
            return (f"metrics=({self.name!r},) counts what autograd saves with saved-tensor hooks, under which "
                    "autograd unpacks a saved tensor that needs grad as a new object each time (torch's "
                    "save_on_cpu does the same). A checkpointed call given one tensor in several arguments that "
                    "tests their identity (nn.MultiheadAttention as self-attention: query is key) then recomputes "
                    "another path. Pass the tensor once (checkpoint(lambda x: attn(x, x, x), x)), or profile "
                    "without that metric. If the step raises this without the metric too, the recomputation runs "
                    "other code than the forward did, which torch.utils.checkpoint refuses: a parametrized weight "
                    "read from torch.nn.utils.parametrize.cached() in forward is computed afresh in backward, outside "
                    "the cache (do not checkpoint those calls)")
        return None

    # -- saved tensors ---------------------------------------------------------------------------------------------
    def modules_added(self, entries: Sequence[tuple[str, nn.Module]]) -> None:
        # Their parameters and buffers are the model's, not what a call saves or returns.
        for _, module in entries:
            self._static |= _storage_keys(list(module._parameters.values()), list(module._buffers.values()))
        self._lazy += [module for module in _with_lazy(map(_second, entries)) if module not in self._lazy]

    def _made_lazy(self) -> None:
        """Add to the static storages those of the lazy modules' parameters and buffers made since (a lazy module
        makes them as its first call begins, before anything it saves is packed)."""
        made = [module for module in self._lazy if not _holds_lazy(module)]
        if made:
            self._static |= _storage_keys([t for module in made for t in module._parameters.values()],
                                          [t for module in made for t in module._buffers.values()])
            self._lazy = [module for module in self._lazy if module not in made]

    def _pack(self, tensor: torch.Tensor) -> Any:
        if self._lazy:
            self._made_lazy()
        if self._stack:
            call = self._stack[-1]
            if self._dtype is _UNREAD and self._model is not None and not call.recompute:
                self._training, self._dtype = bool(self._model.training), parameters_dtype(self._model)
            # A recomputed (checkpointed) call saves during backward, briefly: not what the forward holds.
            state = None if call.recompute else self._states.get(id(call))
            if state is not None:
                state.self_tensors += 1
                storage = _storage(tensor)
                if storage is not None:
                    key = storage_key(storage)
                    if key not in self._static and not (state.params and _holds(state.params, key)):
                        # (_holds: a leaf parameter put on the module as its call began, FSDP2's all-gathered,
                        # unsharded ones, resharded after the forward: a weight, not an activation a checkpoint
                        # frees. Read at each save, never kept: the storage goes, and its address is reused.)
                        if key not in self._saved:
                            self._saved[key] = StorageWeakRef(storage)
                            state.self_saved += storage.nbytes()
                            self._savers[key] = [storage.nbytes(), state]
                        else:
                            savers = self._savers[key]
                            if savers[-1] is not state:
                                savers.append(state)
        if self._outer is not None:
            return self._outer[0](tensor)
        # Not the tensor itself: a saved output would then hold its own grad_fn, a reference cycle. The alias
        # shares the version counter, so the in-place check that hooks turn off in autograd can be redone.
        last = self._last_packed
        if last is not None and last[0]() is tensor:
            alias = last[1]()
            if alias is not None:
                return alias, tensor_version(tensor)
        alias = tensor.detach()
        self._last_packed = (weakref.ref(tensor), weakref.ref(alias))
        if self._stack and not self._stack[-1].recompute:
            self._packed.append(self._last_packed[1])
        return alias, tensor_version(tensor)

    def _unpack(self, packed: Any) -> Any:
        if self._outer is not None:
            return self._outer[1](packed)
        tensor, version = packed
        if tensor_version(tensor) != version:
            raise RuntimeError(
                "one of the variables needed for gradient computation has been modified by an inplace operation: "
                f"[{tensor.type()} {list(tensor.shape)}] is at version {tensor_version(tensor)}; expected version "
                f"{version} instead. (layerprof's memory meter checks this for autograd, whose own check "
                "saved-tensor hooks turn off; the same code fails without profiling.)"
            )
        return tensor

    # -- forward -----------------------------------------------------------------------------------------------------
    def _log_for(self, device: str) -> PeakLog | None:
        """The device's log, None where the reader cannot measure this call (asked per call: the CPU's live-bytes
        reader sees the ops of its own thread only, and a call run on another reads unknown, not 0)."""
        if not self._reader.covers(device):
            return None
        log = self._logs.get(device)
        if log is None:
            log = self._logs[device] = PeakLog(self._reader, device)
        return log

    def forward_pre(self, call: Any, module: nn.Module, args: Any, kwargs: Any) -> None:
        stack = self._stack
        if call.recompute:
            stack.append(call)
            return
        if call.parent is None:
            # A new forward of the model: storages are counted once per forward.
            stack.clear()
            self._returned.clear()
            self._inputs.clear()
            self._inputs_after.clear()
            self._settle()
            self._saved.clear()
            self._held = [held for held in self._held if _still_held(held)]
            self._starts_released = self._saved_before and not self._held
            if self._autocast is None and torch.is_grad_enabled():
                # (here, not where the first tensor is saved: autocast's ops save theirs with autocast off)
                self._autocast = autocast_of(self._model or module)
        elif not self._autocast_inside and torch.is_grad_enabled():
            # Read again inside the forward: accelerate's prepare_model (Trainer under bf16) enters autocast there
            # (``model.forward = autocast(model.forward)``), after the top-level call's hooks.
            self._autocast, self._autocast_inside = autocast_of(self._model or module), True
        inputs = {}
        # A call under no_grad (an evaluation pass inside the step) saves nothing and no checkpoint re-runs it:
        # its inputs are nothing a checkpoint keeps, nor inputs of the training forward (its own inputs still tell
        # what it returns of them from what it makes).
        grad_on = torch.is_grad_enabled()
        for key, storage in _storages(args, kwargs).items():
            if key not in self._static:
                inputs[key] = storage.nbytes()
                if grad_on and key not in self._inputs:
                    self._inputs[key] = StorageWeakRef(storage)
        parent = self._states.get(id(call.parent)) if call.parent is not None else None
        state = _CallMemory(inputs, self._log_for(call.clock.device), parent)
        if not grad_on:
            state.input_sizes = {}  # (nothing a checkpoint of it keeps)
        elif _hidden_from(self._own_pack):
            state.hidden = state.incomplete = True
            if parent is None or not parent.hidden:
                self._hidden[call.name] = None
        if self._step_log is None and call.parent is None:
            self._step_log = state.log
        state.side_effects = int(has_side_effects(module))
        state.cache_updates = int(updates_a_cache(args, kwargs))
        state.no_grad = int(not grad_on)
        state.params = module._parameters
        state.input_versions = input_versions((args, kwargs))
        state.name = call.name
        self._forward.append(state)
        self._forward_traces.append(call)
        self._states[id(call)] = state
        self._calls.append((call, state))
        stack.append(call)
        if state.log is not None:
            state.forward_mark, state.forward_start = state.log.boundary()
            state.ops_start = self._reader.op_count(state.log.device)

    def forward_post(self, call: Any, module: nn.Module, args: Any, kwargs: Any, output: Any) -> None:
        stack = self._stack
        while stack:  # unwind past calls whose forward raised (they never reach here)
            if stack.pop() is call:
                break
        state = self._states.get(id(call))
        if state is None:
            return
        log = state.log
        if log is not None:
            state.forward_end_mark, current = log.boundary()
            state.forward_delta = current - state.forward_start
            state.forward_peak = log.peak_since(state.forward_mark) - state.forward_start
            if state.ops_start is not None:
                state.ops = self._reader.op_count(log.device) - state.ops_start
        inputs, state.inputs = state.inputs, set()
        versions, state.input_versions = state.input_versions, []
        state.inplace = mutated_inputs(versions)
        waiting = self._inputs_after
        parent = state.parent
        if waiting:  # the calls made inside this one: their inputs read again, and handed on to this one's caller
            for returned, pairs in waiting.pop(id(state), ()):
                if any((tensor := ref()) is not None and tensor_version(tensor) != version for ref, version in pairs):
                    returned.changed_later = 1
                elif parent is not None and any(ref() is not None for ref, _ in pairs):
                    waiting.setdefault(id(parent), []).append((returned, pairs))
        if versions and not state.inplace and parent is not None:
            waiting.setdefault(id(parent), []).append(
                (state, [(weakref.ref(tensor), version) for tensor, version in versions]))
        returned = self._returned
        for tensor in iter_tensors((output,)):
            storage = _storage(tensor)
            if storage is None:
                continue
            key = storage_key(storage)
            if key in inputs or key in returned or key in self._static:
                continue
            returned[key] = StorageWeakRef(storage)
            state.self_activation += storage.nbytes()

    # -- backward (CUDA only) ------------------------------------------------------------------------------------
    def backward_start(self, calls: Sequence[Any]) -> None:
        logs_read: dict[PeakLog, tuple[int, int] | None] = {}
        for call in calls:
            state = self._states.get(id(call))
            if state is None or state.log is None:
                continue
            reading = self._boundary_once(logs_read, state.log)
            if reading is not None:
                state.backward_mark, state.backward_start = reading

    def backward_end(self, calls: Sequence[Any]) -> None:
        logs_read: dict[PeakLog, tuple[int, int] | None] = {}
        for call in calls:
            state = self._states.get(id(call))
            if state is None or state.log is None or state.backward_mark == 0:  # its start was not seen
                continue
            reading = self._boundary_once(logs_read, state.log)
            if reading is None:
                continue
            state.backward_end_mark, current = reading
            # A call may end at several nodes; the last one seen is its end, so later values overwrite.
            state.backward_delta = current - state.backward_start
            state.backward_peak = state.log.peak_since(state.backward_mark) - state.backward_start

    def _boundary_once(self, logs_read: dict[PeakLog, tuple[int, int] | None], log: PeakLog
                       ) -> tuple[int, int] | None:
        """A boundary of ``log``, read once for all the calls a graph hook hands over; None where the reader does
        not see this thread (a backward run on another: its figures stay unknown, not 0)."""
        if log not in logs_read:
            logs_read[log] = log.boundary() if self._reader.covers(log.device) else None
        return logs_read[log]

    def _settle(self) -> None:
        """Work out the planner's figures of the calls of the forward that just ended."""
        if self._forward:
            if self._savers:
                self._after_backward += self._starts_released
                self._saved_before = True
                self._held.append(self._packed or self._forward_traces)
            settle_forward(self._forward, self._savers)
            self._tables.append(storage_table(self._forward, self._savers))
            self._table_calls.append(self._forward)
            self._table_refs.append(([self._saved.get(key) for key in self._savers], self._packed))
        self._forward = []
        self._forward_traces = []
        self._packed = []
        self._savers = {}

    def _mark_held_outside(self) -> None:
        """``table["held_elsewhere"]``: saved storages alive at the step's end though autograd released every alias
        (a module attribute holds them, as the old ``weight_norm``'s ``weight``): no checkpoint frees them."""
        for table, (refs, packed) in zip(self._tables, self._table_refs):
            if packed and not _still_held(packed):
                outside = [i for i, ref in enumerate(refs) if ref is not None and not ref.expired()]
                if outside:
                    table["held_elsewhere"] = outside
        self._table_refs = []

    # -- records -----------------------------------------------------------------------------------------------------
    def fill(self, records: dict[str, ModuleRecord]) -> None:
        self._settle()
        self._mark_updated_buffers()
        for call, state in reversed(self._calls):  # children were created after their parents
            state.activation += state.self_activation
            state.saved += state.self_saved
            state.tensors += state.self_tensors
            parent = self._states.get(id(call.parent)) if call.parent is not None else None
            if parent is not None:
                parent.activation += state.activation
                parent.saved += state.saved
                parent.incomplete = parent.incomplete or state.incomplete
                parent.tensors += state.tensors
                parent.side_effects += state.side_effects
                parent.cache_updates += state.cache_updates
        # (every record's name: modules made while profiling joined them after the start)
        totals: dict[str, dict[str, int | None]] = {name: dict.fromkeys(MEMORY_FIELDS) for name in records}
        for call, state in self._calls:
            row = totals[call.name]
            _add(row, "activation_bytes", state.activation)
            _add(row, "self_activation_bytes", state.self_activation)
            _add(row, "saved_bytes", state.saved)
            _add(row, "self_saved_bytes", state.self_saved)
            _add(row, "cuda_forward_delta_bytes", state.forward_delta)
            _max(row, "cuda_forward_peak_bytes", state.forward_peak)
            _add(row, "cuda_backward_delta_bytes", state.backward_delta)
            _max(row, "cuda_backward_peak_bytes", state.backward_peak)
            _add(row, "checkpoint_freed_bytes", state.freed)
            _add(row, "checkpoint_kept_bytes", state.kept)
            _add(row, "checkpoint_side_effects", state.side_effects)
            _add(row, "checkpoint_cache_updates", state.cache_updates)
            _add(row, "checkpoint_inplace_inputs", state.inplace)
            _add(row, "checkpoint_inputs_changed_later", state.changed_later)
            _add(row, "checkpoint_saved_tensors", state.tensors)
            _add(row, "checkpoint_no_grad_calls", state.no_grad)
            _add(row, "foreign_calls", int(call.parent is not None and not _inside(call.name, call.parent.name)))
        ran = {call.name for call, _ in self._calls if not call.recompute}
        for call, state in self._calls:
            for name in adopters(call):
                if name in ran:
                    _adopt(totals[name], state)
        for call, state in self._calls:
            if state.incomplete:  # (unknown, not 0: what a call under hooks entered inside the block saved)
                for name in (call.name, *adopters(call)):
                    totals[name].update(dict.fromkeys(_SAVED_INCLUSIVE))
                if state.hidden:
                    totals[call.name]["self_saved_bytes"] = None
        for name, row in totals.items():
            for field, value in row.items():
                setattr(records[name], field, value)
        # Only where the reader counts ops (live_memory on the CPU): a memory profile's records stay as they were.
        ops: dict[str, int] = {}
        for call, state in self._calls:
            if state.ops is not None and not call.recompute:
                ops[call.name] = ops.get(call.name, 0) + state.ops
        for name, count in ops.items():
            records[name].live_forward_ops = count
        if "" in records and self._tables:
            # Not a field (a table, not a number per module): kept on the live root for the planner only.
            records[""].__dict__[STORAGES_ATTRIBUTE] = self._tables
            if self._step:
                self._add_timeline(records[""])
        self._tables = []
        self._table_calls = []
        self._table_refs = []
        self._calls.clear()
        self._states.clear()

    def _mark_updated_buffers(self) -> None:
        """A side effect on the calls of each module whose buffers the block updated (the nearest called ancestor's,
        where the module itself was not called: its parent's code updated them), which ``fill`` then adds up the
        calls' parents, as it does a training BatchNorm's."""
        if not self._updated:
            return
        by_name: dict[str, list[_CallMemory]] = {}
        for call, state in self._calls:
            by_name.setdefault(call.name, []).append(state)
        for name in self._updated:
            while name not in by_name and name:
                name = name.rpartition(".")[0]
            for state in by_name.get(name, ()):
                state.side_effects = max(state.side_effects, 1)

    def _add_timeline(self, root: ModuleRecord) -> None:
        """Each table's calls' boundaries on the step's log (``[forward start, forward end, backward start, backward
        end]``, 0 where not seen or on another device), and the log's levels and interval peaks on the root."""
        log = self._step_log
        assert log is not None
        for table, calls in zip(self._tables, self._table_calls):
            table["bounds"] = [[call.forward_mark, call.forward_end_mark, call.backward_mark, call.backward_end_mark]
                               if call.log is log else [0, 0, 0, 0] for call in calls]
        root.__dict__[TIMELINE_ATTRIBUTE] = {"device": log.device, "levels": list(log.levels),
                                             "peaks": list(log.interval_peaks)}


def _still_held(held: list[Any]) -> bool:
    """Whether an earlier forward still holds what it saved: one of its aliases lives (weak references), or, for
    calls, none of them has had its backward."""
    if held and isinstance(held[0], weakref.ref):
        return any(alias() is not None for alias in held)
    return not any(call.bwd_start is not None for call in held)


def hidden_shown(names: list[str]) -> str:
    """The modules that ran under saved-tensor hooks entered inside the block (``meta["memory"]
    ["under_other_saved_tensors_hooks"]``), as the warning and ``checkpoint_plan``'s refusal name them."""
    shown = ", ".join(repr(name) if name else "the model" for name in names[:5])
    return shown + (f" and {len(names) - 5} more" if len(names) > 5 else "")


def _hidden_from(own: Any) -> bool:
    """Whether the saved-tensor hooks that autograd runs on this thread now hide what is saved from ``own`` (a
    memory meter's pack hook): hooks entered after it (``save_on_cpu`` inside the profiled block) that do not hand
    each tensor on to it. Another memory meter's (a block on a second model inside this one: a student's inside its
    teacher's) hand each tensor on to the hooks that were on top as it began, so the chain is followed down;
    ``torch.utils.checkpoint``'s save nothing by design (the region is recomputed in backward)."""
    hooks = outer_saved_tensors_hooks()
    while hooks is not None:
        pack = hooks[0]
        if pack is own:
            return False
        meter = getattr(pack, "__self__", None)
        if not isinstance(meter, MemoryMeter) or meter._hooks is None:
            return getattr(pack, "__module__", None) != _CHECKPOINT
        hooks = meter._outer
    return False  # (a thread without our hooks: nothing of ours to hide)


_CHECKPOINT = "torch.utils.checkpoint"
# The inclusive saved-for-backward figures, unknown where a call inside ran under hooks entered in the block.
_SAVED_INCLUSIVE = ("saved_bytes", "checkpoint_freed_bytes", "checkpoint_kept_bytes", "checkpoint_saved_tensors")


def _adopt(row: dict[str, int | None], state: _CallMemory) -> None:
    """Add a call that the row's module adopts to its inclusive figures."""
    _add(row, "activation_bytes", state.activation)
    _add(row, "saved_bytes", state.saved)
    _add(row, "cuda_forward_delta_bytes", state.forward_delta)
    _max(row, "cuda_forward_peak_bytes", state.forward_peak)
    _add(row, "cuda_backward_delta_bytes", state.backward_delta)
    _max(row, "cuda_backward_peak_bytes", state.backward_peak)


def _inside(name: str, caller: str) -> bool:
    """Whether ``caller`` is ``name``'s tree ancestor (a container such as a ModuleList is never called itself)."""
    return caller == "" or name.startswith(caller + ".")


def _add(row: dict[str, int | None], field: str, value: int | None) -> None:
    if value is not None:
        row[field] = (row[field] or 0) + value


def _max(row: dict[str, int | None], field: str, value: int | None) -> None:
    if value is not None:
        previous = row[field]
        row[field] = value if previous is None else max(previous, value)

