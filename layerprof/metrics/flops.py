"""The ``"flops"`` meter: forward and backward FLOPs per module, counted op by op in a TorchDispatchMode.

Every aten op that runs while profiling is priced by its formula (``formulas.py``, 1 MAC = 2 FLOPs) and credited
to module calls:

* a forward op to the module calls that are open (the innermost and its ancestors);
* a backward op to the call whose forward created the autograd node now executing: the node's sequence number
  falls in the ``[seq_start, seq_end)`` range of exactly one innermost call (``tracker.CallTrace``), which is
  credited with its ancestors. So functional code (``F.linear``, ``@``, ``einsum``, SDPA) inside any module is
  counted where it ran, in both passes, and a module called several times sums its calls;
* a backward op of a node that a backward pass made (``create_graph=True``: a gradient penalty, a Hessian-vector
  product, MAML's second order) to the call whose backward made it: the op that made it ran in that call's
  backward (``_made_in_backward``);
* a forward re-run during backward by activation checkpointing (``CallTrace.recompute``) to ``flops_recompute``,
  never to ``flops_forward``; its calls hang under the call whose backward triggered the re-run;
* and, in both passes, to the ancestors that adopt one of those calls, made outside their own (an encoder called
  by itself before the model: ``record/adoption.py``), where they ran in the step.

Every op's bytes read and written (``bytes.py``) are counted in the same pass and credited the same way.

Record fields, inclusive of children and summed over calls: ``flops_forward``, ``flops_backward`` (None where
no backward ran, e.g. under no_grad), ``flops_recompute`` (None without checkpointing), ``unknown_ops``
(``{op: calls}`` of ops that had no formula), ``bytes_forward``, ``bytes_backward``, ``bytes_recompute``; and
``self_flops``, ``self_bytes``: the module's own ops only (the innermost call running them), every pass. The
dispatch mode slows every op, so the meter says ``distorts_timing``.
"""
from __future__ import annotations

import threading
from bisect import bisect_left, bisect_right
from collections import Counter
from typing import Any, Sequence

import torch
from torch import nn

from .._torch import (TorchDispatchMode, current_autograd_node, dtensor_local_share, dtensor_locals,
                      has_decomposition, mode_is_on, nested_sizes, ready_mode, sparse_parts)
from .._torch import graph_task_id, next_sequence_nr, sequence_nr
from .._warn import warn_user
from ..record.adoption import adopters, caller
from ..record.fields import FIELDS, Field, declare
from ..record.records import ModuleRecord
from ..record.work_time import ran_ms
from .meter import Meter, register_meter
from .bytes import op_bytes
from .formulas import NESTED_FORMULAS, flop_formula, free, is_free
from .module_formulas import module_flops_formula

__all__ = ["FlopMeter", "FLOP_FIELDS"]



def _flops_per_second(record: ModuleRecord) -> float | None:
    """Achieved FLOP/s: total FLOPs over total time (forward + backward, which includes any recompute), the time
    of the steps that ran the module, as the FLOPs are of a step that ran it (``ran_ms``)."""
    flops, ms = FIELDS["flops"].value(record), FIELDS["total_ms"].value(record)
    return None if flops is None or not ms else flops / (ran_ms(record, ms) / 1000.0)


def _macs(record: ModuleRecord) -> float | None:
    """FLOPs / 2, a count (an int) where that is whole: every matmul-like FLOP count is twice its MACs."""
    flops = FIELDS["flops"].value(record)
    if flops is None:
        return None
    return flops // 2 if isinstance(flops, int) and flops % 2 == 0 else flops / 2


declare(
    Field("flops_forward", "flops", "Forward FLOPs", share_of="flops", meter="flops",
          doc="FLOPs of the aten ops run in the module's forward calls"),
    Field("flops_backward", "flops", "Backward FLOPs", share_of="flops", meter="flops",
          doc="FLOPs of the backward of the nodes its forward created"),
    Field("flops_recompute", "flops", "Recompute FLOPs", share_of="flops", meter="flops",
          doc="FLOPs of forward re-run during backward by activation checkpointing"),
    Field("unknown_ops", "data", "Unknown ops", combine="none", cost=False, meter="flops",
          doc="{op: calls} of ops with no FLOP formula (counted 0)"),
    Field("bytes_forward", "bytes", "Forward Bytes", share_of="bytes", meter="flops",
          doc="bytes read and written by the aten ops of the module's forward calls (metrics/bytes.py)"),
    Field("bytes_backward", "bytes", "Backward Bytes", share_of="bytes", meter="flops",
          doc="bytes read and written by the backward of the nodes its forward created"),
    Field("bytes_recompute", "bytes", "Recompute Bytes", share_of="bytes", meter="flops",
          doc="bytes read and written by forward re-run during backward by activation checkpointing"),
    Field("self_flops", "flops", "Self FLOPs", share_of="flops", meter="flops",
          doc="FLOPs of the ops run by the module's own code, not its children's (every pass)"),
    Field("self_bytes", "bytes", "Self Bytes", share_of="bytes", meter="flops",
          doc="bytes moved by the ops run by the module's own code, not its children's (every pass)"),
    Field("flops", "flops", "FLOPs", parts=("flops_forward", "flops_backward", "flops_recompute"),
          share_of="flops", meter="flops", doc="every FLOP the step ran for the module: forward + backward + recompute"),
    Field("bytes", "bytes", "Bytes", parts=("bytes_forward", "bytes_backward", "bytes_recompute"),
          share_of="bytes", meter="flops", doc="every byte the step's ops read or wrote for the module"),
    Field("macs", "macs", "MACs", compute=_macs, share_of="macs", meter="flops", doc="flops / 2"),
    Field("flops_per_s", "flop/s", "FLOP/s", compute=_flops_per_second, combine="none", cost=False, meter="flops",
          doc="achieved FLOP/s: flops over total_ms"),
)
FLOP_FIELDS = ("flops_forward", "flops_backward", "flops_recompute", "unknown_ops", "bytes_forward",
               "bytes_backward", "bytes_recompute", "self_flops", "self_bytes")

_FORWARD, _BACKWARD, _RECOMPUTE = 0, 1, 2
_FREE = "free"
_VIEW = "view"
_UNKNOWN = "unknown"
_DECOMPOSE = "decompose"


def _shape(value: Any) -> Any:
    """Tensors to shapes (a nested tensor to its components' shapes), inside lists and tuples; the rest as is."""
    if isinstance(value, torch.Tensor):
        if value.is_nested:
            return [torch.Size(row) for row in nested_sizes(value)]
        return value.shape
    if isinstance(value, (list, tuple)) and not isinstance(value, torch.Size):
        return [_shape(item) for item in value] if isinstance(value, list) else tuple(_shape(item) for item in value)
    if isinstance(value, dict):
        return {key: _shape(item) for key, item in value.items()}
    return value



class _Totals:
    __slots__ = ("flops", "bytes", "self_flops", "self_bytes", "unknown")

    def __init__(self) -> None:
        self.flops = [0, 0, 0]  # forward, backward, recompute
        self.bytes = [0, 0, 0]
        self.self_flops = 0  # of the ops run by the module's own code (not its children's), every phase
        self.self_bytes = 0
        self.unknown: Counter[str] = Counter()


def _joined(totals: _Totals, adopted: _Totals) -> _Totals:
    """A module's own totals with what it adopted added to the inclusive ones (its self figures are its own)."""
    joined = _Totals()
    joined.flops = [own + more for own, more in zip(totals.flops, adopted.flops)]
    joined.bytes = [own + more for own, more in zip(totals.bytes, adopted.bytes)]
    joined.self_flops, joined.self_bytes = totals.self_flops, totals.self_bytes
    joined.unknown = totals.unknown + adopted.unknown
    return joined


def _nested_in(values: Any) -> bool:
    """Whether ``values`` (an op's arguments) hold a nested tensor, directly or in a list or tuple."""
    for value in values:
        if isinstance(value, torch.Tensor):
            if value.is_nested:
                return True
        elif type(value) in (list, tuple) and _nested_in(value):
            return True
    return False


def _first_dtype(args: Any) -> Any:
    """The dtype of the first tensor among an op's arguments (in a list, as ``aten.cat``'s), or None."""
    for arg in args:
        if isinstance(arg, torch.Tensor):
            return arg.dtype
        if isinstance(arg, (list, tuple)) and arg and isinstance(arg[0], torch.Tensor):
            return arg[0].dtype
    return None


def _stored_share(args: Any) -> float:
    """The share of its entries that each sparse tensor among an op's arguments stores, multiplied (1.0 when all
    are dense): a formula reads only shapes, and a sparse operand's shape is its dense one."""
    share = 1.0
    for arg in args:
        if isinstance(arg, torch.Tensor) and arg.layout != torch.strided:
            parts = sparse_parts(arg)
            if parts is not None and arg.numel():
                share *= parts[-1].numel() / arg.numel()
    return share


def _local_share(out: Any) -> float | None:
    """The share of an op's work that this rank did, where it ran on DTensors (tensor parallelism): the mode sees
    the op with the DTensors' global shapes, while each rank computes its shards only. Read from the first output;
    None for plain tensors."""
    first = out[0] if isinstance(out, (list, tuple)) and out else out
    return None if type(first) is torch.Tensor else dtensor_local_share(first)  # (a plain tensor: no lookup)


def _op_name(func: Any) -> str:
    """How ``unknown_ops()`` names an op: ``aten.foo``, or ``higher_order.flex_attention`` for a higher-order op."""
    packet = getattr(func, "overloadpacket", None)
    return str(packet) if packet is not None else f"{getattr(func, 'namespace', 'higher_order')}.{func.name()}"


class _CountingMode(TorchDispatchMode):
    """Runs every op, then hands it to the meter. Ops with no formula but a composite decomposition are run
    decomposed, so that their parts are counted (as FlopCounterMode does)."""

    # A higher-order op (flex attention) reaches __torch_dispatch__ with this mode popped off the stack: it runs
    # as it would unprofiled and is priced whole by its formula, or listed as unknown. Without this flag torch
    # refuses to run one under the mode at all.
    supports_higher_order_operators = True

    @classmethod
    def ignore_compile_internals(cls) -> bool:
        """True: a torch.compile'd function called in a forward is compiled and run as it is unprofiled, the mode
        seeing the ops its compiled code calls. Otherwise dynamo skips every frame while the mode is on: the
        function ran eagerly (other bits than unprofiled), and a ``fullgraph=True`` compile raised (flex
        attention's, ``torch.cond``'s)."""
        return True

    def __init__(self, meter: FlopMeter) -> None:
        super().__init__()
        self.meter = meter

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        meter = self.meter
        kind = meter._kinds.get(func)
        if kind is None:
            kind = meter._kinds[func] = meter._classify(func)
        if kind is _VIEW or (kind is _FREE and not meter.count_bytes):
            return func(*args, **kwargs)
        if kind is _DECOMPOSE:
            if _nested_in(args) or _nested_in(kwargs.values()):
                # A strided nested tensor has no sizes for the decomposition to read: the op runs as it is, priced
                # per component where a nested formula is known, else listed as unknown (for this call only: on
                # plain tensors it decomposes).
                kind = NESTED_FORMULAS.get(func, _UNKNOWN)
            else:
                with self:
                    result = func.decompose(*args, **kwargs)
                if result is not NotImplemented:
                    return result
                kind = meter._kinds[func] = _UNKNOWN
        out = func(*args, **kwargs)
        meter._count(func, kind, args, kwargs, out)
        return out


def _own_thread_first(by_thread: dict[int, list[Any]]) -> list[list[Any]]:
    """The lists of ``by_thread`` (thread id -> list), this thread's first: sequence numbers count per thread, and a
    node is most often this thread's."""
    own = by_thread.get(threading.get_ident())
    return ([own] if own else []) + [found for found in by_thread.values() if found is not own]


@register_meter
class FlopMeter(Meter):
    """Counts FLOPs per module, forward and backward, at the aten-op level: ``LayerProf(model, metrics=("flops",))``.

    >>> import torch
    >>> from layerprof import LayerProf
    >>> net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
    >>> with LayerProf(net, metrics=("flops",)) as prof:
    ...     net(torch.randn(2, 4)).sum().backward()
    >>> # forward 2*2*4*8 + 2*2*8*1; backward: both weight grads (the same) + the second layer's input grad 2*2*1*8
    >>> prof.tree.flops_forward, prof.tree.flops_backward
    (160, 192)
    """

    name = "flops"
    wants_forward_hooks = True
    wants_backward_hooks = True  # to see a backward run on another thread than the block's, which it cannot count
    distorts_timing = True
    # Bytes read and written are counted beside the FLOPs; False skips them (benchmarks/bytes_cost.py).
    count_bytes = True

    def __init__(self) -> None:
        self._local = threading.local()
        self._calls: dict[int, list[Any]] = {}  # thread id -> its calls in creation order (seq_start ascending)
        # Thread id -> [first, end, call] ranges of the sequence numbers of graph nodes that backward ops made
        # (create_graph=True), by the call whose backward ran them, in ascending order.
        self._made: dict[int, list[list[Any]]] = {}
        self._logical_parent: dict[int, Any] = {}  # id(recompute call) -> the call it re-runs a part of
        self._originals: dict[str, list[Any]] = {}  # name -> its non-recompute calls in creation order
        self._totals: dict[str, _Totals] = {}
        # id(call) -> the ancestors that adopt it (those that can run: a ModuleList cannot), and what they adopted,
        # added to their totals where they ran in the step.
        self._adopters: dict[int, tuple[str, ...]] = {}
        self._adopted: dict[str, _Totals] = {}
        self._uncallable: frozenset[str] = frozenset()
        self._override_forward: set[int] = set()  # id(call) of calls counted by a module override
        self._override_backward: dict[int, int] = {}  # id(call) -> backward FLOPs given by the override
        self._overridden_calls: list[Any] = []
        self._kinds: dict[Any, Any] = {}
        self._mode: _CountingMode | None = None
        self._backward_ran = False
        # Calls made, and calls whose backward began, on a thread without the dispatch mode (one the user
        # started): the mode saw none of their ops there.
        self._elsewhere: list[Any] = []
        self._elsewhere_backward: list[Any] = []
        self.outside: list[int] = [0, 0, 0]  # FLOPs of ops outside every module call (e.g. the loss)
        self.outside_bytes: list[int] = [0, 0, 0]
        # FLOPs by the dtype their op's first tensor had: the dtype the work ran in (the roofs to hold it against),
        # which the parameters' dtype does not tell (autocast, a bf16 input to a module without parameters).
        self._flops_by_dtype: dict[Any, int] = {}

    # -- lifecycle -------------------------------------------------------------------------------------------
    def start(self, model: nn.Module, records: dict[str, ModuleRecord], entries: Sequence[tuple[str, nn.Module]]) -> None:
        self._uncallable = frozenset(name for name, module in entries if type(module).forward is nn.Module.forward)
        ready_mode(_CountingMode)
        self._elsewhere, self._elsewhere_backward = [], []
        self._mode = _CountingMode(self)
        self._mode.__enter__()

    def stop(self) -> None:
        mode, self._mode = self._mode, None
        if mode is not None:
            mode.__exit__(None, None, None)

    # -- module calls ----------------------------------------------------------------------------------------
    def forward_pre(self, call: Any, module: nn.Module, args: Any, kwargs: Any) -> None:
        thread = threading.get_ident()
        calls = self._calls.get(thread)
        if calls is None:
            calls = self._calls[thread] = []
        if not mode_is_on(self._mode):
            self._elsewhere.append(call)
        if call.recompute and call.parent is None:
            node = current_autograd_node()
            owner = None if node is None else self._owner(sequence_nr(node))
            if owner is not None:
                self._logical_parent[id(call)] = self._enclosing(call.name, owner)
        elif not call.recompute:
            self._originals.setdefault(call.name, []).append(call)
        calls.append(call)
        self._local.current = call
        found = adopters(call)
        if found:
            found = tuple(name for name in found if name not in self._uncallable)
            if found:
                self._adopters[id(call)] = found
        if module_flops_formula(module) is not None:
            self._override_forward.add(id(call))

    def forward_post(self, call: Any, module: nn.Module, args: Any, kwargs: Any, output: Any) -> None:
        self._local.current = call.parent
        if id(call) not in self._override_forward:
            return
        formula = module_flops_formula(module)
        assert formula is not None
        value = formula(module, _shape(args), _shape(kwargs), _shape(output))
        forward, backward = value if isinstance(value, tuple) else (value, None)
        self._credit(call, _RECOMPUTE if call.recompute else _FORWARD, int(forward or 0), own=True)
        if backward is not None:
            self._override_backward[id(call)] = int(backward)
            self._overridden_calls.append(call)

    def backward_start(self, calls: Sequence[Any]) -> None:
        if not mode_is_on(self._mode):  # a backward started on a thread of the user's: its ops go uncounted
            self._elsewhere_backward.extend(calls)
        # Where the nodes the call's backward makes start (``_note_made``): before its node runs.
        self._local.made_from = (graph_task_id(), next_sequence_nr())

    # -- ops -------------------------------------------------------------------------------------------------
    def _classify(self, func: Any) -> Any:
        formula = flop_formula(func)
        if formula is free:  # (counted 0: no shapes to read for it, as for the free ops that carry a tag)
            return _FREE
        if formula is not None:
            return formula
        if getattr(func, "is_view", False):
            return _VIEW
        if is_free(func):
            return _FREE
        return _DECOMPOSE if has_decomposition(func) else _UNKNOWN

    def _count(self, func: Any, kind: Any, args: Any, kwargs: Any, out: Any) -> None:
        flops, unknown = 0, None
        local = _local_share(out)  # (None off DTensors: what the op's shapes say is what this process did)
        if kind is _UNKNOWN:
            unknown = _op_name(func)
        elif kind is not _FREE:
            try:
                flops = kind(*_shape(args), out_shape=_shape(out), **_shape(kwargs)) or 0
                share = _stored_share(args) * (1.0 if local is None else local) if flops else 1.0
                if share != 1.0:  # (a dense product's count stays an exact int, however large)
                    flops = round(flops * share)
            except Exception as error:  # a wrong formula must not crash the user's run: list the op instead
                unknown = f"{_op_name(func)} (formula raised {type(error).__name__}: {error})"
        moved = 0
        if self.count_bytes:
            try:
                if local is not None:  # on DTensors: the bytes of this rank's tensors, as its FLOPs are
                    args, kwargs, out = dtensor_locals((args, kwargs, out))
                moved = op_bytes(func, args, kwargs, out)
            except Exception:  # an odd tensor (a subclass without storage) must not crash the user's run
                moved = 0
        if not flops and not moved and unknown is None:
            return
        if flops:
            dtype = _first_dtype(args)
            if dtype is not None:
                if dtype.is_complex:
                    # A complex multiply-accumulate is four real ones, run in the real dtype of its parts (whose
                    # roofs the roofline reads).
                    flops, dtype = 4 * flops, dtype.to_real()
                self._flops_by_dtype[dtype] = self._flops_by_dtype.get(dtype, 0) + int(flops)
        phase, call = self._where()
        if call is None:
            self.outside[phase] += flops
            self.outside_bytes[phase] += moved
            return
        self._credit(call, phase, int(flops), moved, unknown=unknown)

    def meta(self) -> dict[str, Any]:
        """``{"dtype": ...}``: the dtype most FLOPs ran in (the roofline's roofs are that dtype's)."""
        by_dtype = self._flops_by_dtype
        if not by_dtype:
            return {}
        return {"dtype": str(max(by_dtype, key=by_dtype.__getitem__)).replace("torch.", "")}

    def _where(self) -> tuple[int, Any]:
        """The phase of the op now running and the innermost module call to credit (None: outside modules)."""
        current = getattr(self._local, "current", None)
        while current is not None and current.fwd_end is not None:
            current = current.parent  # a call that raised never reached our forward_post
        if current is not None and current.recompute:
            return _RECOMPUTE, current
        node = current_autograd_node()
        if node is not None:
            self._backward_ran = True
            number = sequence_nr(node)
            owner = self._owner(number)
            if owner is None:
                owner = self._made_in_backward(number)
            self._note_made(owner)
            return _BACKWARD, owner
        return _FORWARD, current

    def _owner(self, sequence_nr: int) -> Any:
        """The innermost call whose forward created the graph node with this sequence number, or None.

        Sequence numbers count per thread: look first among the calls of this thread (a checkpoint re-run on a
        backward thread), then among the others (the forward ran on another thread than the backward)."""
        for calls in _own_thread_first(self._calls):
            index = bisect_right(calls, sequence_nr, key=lambda call: call.seq_start) - 1
            call = calls[index] if index >= 0 else None
            # The last call started at or before the node is the innermost container or one of its descendants,
            # or a descendant of the call that claimed a node made after its end (the node torch wraps a module's
            # outputs in, where its full backward hooks run: ``tracker._own_output_hook``).
            while call is not None and not call.seq_start <= sequence_nr < call.seq_end:
                claimed = getattr(call, "claimed", None)
                if claimed is not None and sequence_nr in claimed:
                    return call
                call = call.parent
            if call is not None:
                return call
        return None

    def _note_made(self, owner: Any) -> None:
        """Before a backward op of ``owner``'s: the graph nodes made since the previous backward op of the same pass
        on this thread were made by this op (an op's autograd node is made before the op reaches the dispatch
        mode), so they are ``owner``'s (a backward under ``create_graph=True`` makes them)."""
        local = self._local
        now, task = next_sequence_nr(), graph_task_id()
        last = getattr(local, "made_from", None)
        local.made_from = (task, now)
        if owner is None or last is None or last[0] != task or now <= last[1]:
            return
        made = self._made.get(threading.get_ident())
        if made is None:
            made = self._made[threading.get_ident()] = []
        if made and made[-1][2] is owner and made[-1][1] == last[1]:
            made[-1][1] = now  # the same call's nodes, on from its last range
        else:
            made.append([last[1], now, owner])

    def _made_in_backward(self, sequence_nr: int) -> Any:
        """The call whose backward made the graph node with this sequence number (``_note_made``), or None."""
        for made in _own_thread_first(self._made):
            index = bisect_right(made, sequence_nr, key=lambda entry: entry[0]) - 1
            if index >= 0 and sequence_nr < made[index][1]:
                return made[index][2]
        return None

    def _enclosing(self, name: str, owner: Any) -> Any:
        """Where a checkpoint re-run of module ``name`` hangs: under the parent of the original call it repeats,
        the last call of that module begun before the backward node ``owner`` was made. ``owner`` itself is
        the node that triggered the re-run: inside the checkpointed region (non-reentrant checkpoint) or the
        region's checkpoint node, created by the enclosing call (reentrant)."""
        originals = self._originals.get(name, [])
        limit = owner.seq_end if owner.seq_end > owner.seq_start else float("inf")
        index = bisect_left(originals, limit, key=lambda call: call.seq_start) - 1
        if index < 0:
            return owner
        return originals[index].parent

    def _credit(self, call: Any, phase: int, flops: int, moved: int = 0, unknown: str | None = None,
                own: bool = False) -> None:
        """Add to the call's module and its ancestors' once each (the first, innermost, as its own ops); FLOPs
        stop below a call whose override counts them, bytes do not (an override prices FLOPs only)."""
        overridden = self._override_backward if phase == _BACKWARD else self._override_forward
        adopting = self._adopters
        seen: set[str] = set()
        innermost, priced = True, True
        while call is not None:
            if priced and id(call) in overridden and not own:
                priced, flops, unknown = False, 0, None
                if not moved:
                    return
            own = False
            if call.name not in seen:
                seen.add(call.name)
                totals = self._totals.get(call.name)
                if totals is None:
                    totals = self._totals[call.name] = _Totals()
                totals.flops[phase] += flops
                totals.bytes[phase] += moved
                if innermost:
                    totals.self_flops += flops
                    totals.self_bytes += moved
                    innermost = False
                if unknown is not None:
                    totals.unknown[unknown] += 1
            if adopting:
                found = adopting.get(id(call))
                if found:
                    self._credit_adopters(found, seen, phase, flops, moved, unknown)
            parent = call.parent
            call = parent if parent is not None else self._logical_parent.get(id(call))

    def _credit_adopters(self, found: tuple[str, ...], seen: set[str], phase: int, flops: int, moved: int,
                         unknown: str | None) -> None:
        """Add an op to what the ancestors that adopt a call holding it adopted, once each."""
        for name in found:
            if name not in seen:
                seen.add(name)
                totals = self._adopted.get(name)
                if totals is None:
                    totals = self._adopted[name] = _Totals()
                totals.flops[phase] += flops
                totals.bytes[phase] += moved
                if unknown is not None:
                    totals.unknown[unknown] += 1

    # -- records ---------------------------------------------------------------------------------------------
    def _uncounted(self) -> tuple[set[str], set[str]]:
        """The modules called on a thread the mode is not on, and those whose calls hold such a call: the mode saw
        none of their ops there (nor can their backward nodes, numbered by that thread, be told apart), so their
        figures are unknown, not 0; and apart, the modules whose backward began on such a thread (their
        backward figures only). Warned of, naming them."""
        def closed(calls: list[Any]) -> set[str]:
            found: set[str] = set()
            for call in calls:
                while call is not None and call.name not in found:
                    found.add(call.name)
                    call = caller(call)
            return found

        forward, backward = closed(self._elsewhere), closed(self._elsewhere_backward)
        # A backward node is told to its call by its sequence number, which counts per thread: where calls ran on
        # other threads, any module's range can take in their nodes (a module before a thread pool absorbed the
        # pool's backward, 33 times its own), so no module's backward figures are known.
        every_backward = set(self._originals) if self._elsewhere else set()
        self._elsewhere, self._elsewhere_backward = [], []
        for found, what, figures in ((forward, "called", "FLOPs and bytes, and every module's backward ones,"),
                                     (backward - forward, "differentiated", "backward FLOPs and bytes")):
            if found:
                shown = ", ".join(repr(name or "<model>") for name in sorted(found)[:5])
                more = f" and {len(found) - 5} more" if len(found) > 5 else ""
                warn_user(
                    f"metrics=('flops',) counts the ops of the block's thread (and the threads autograd runs its "
                    f"backward on): {len(found)} module(s) were {what} on a thread of their own or hold such a call "
                    f"({shown}{more}), so their {figures} read None (unknown, not 0). Run the model's forward and "
                    "backward on the block's thread to count them", RuntimeWarning)
        return forward, backward | forward | every_backward

    def _backward_names(self) -> set[str]:
        """The modules a backward ran in: credited with backward ops, or holding a call whose own graph nodes ran
        (its enclosing calls and the modules that adopt it too)."""
        names = {name for name, totals in self._totals.items() if totals.flops[_BACKWARD] or totals.bytes[_BACKWARD]}
        names.update(name for name, totals in self._adopted.items()
                     if totals.flops[_BACKWARD] or totals.bytes[_BACKWARD])
        walked: set[int] = set()
        for calls in self._calls.values():
            for call in calls:
                if call.bwd_start is None:
                    continue
                while call is not None and id(call) not in walked:
                    walked.add(id(call))
                    names.add(call.name)
                    names.update(self._adopters.get(id(call), ()))
                    parent = call.parent
                    call = parent if parent is not None else self._logical_parent.get(id(call))
        return names

    def fill(self, records: dict[str, ModuleRecord]) -> None:
        for call in self._overridden_calls:
            if call.bwd_start is not None:
                self._credit(call, _BACKWARD, self._override_backward[id(call)], own=True)
        backward_ran = self._backward_ran or any(
            call.bwd_start is not None for calls in self._calls.values() for call in calls
        )
        # Per module: a backward of its own or of a call inside it ran (a teacher under no_grad beside a training
        # student has no backward: None, not 0, though the block ran one).
        backward_names = self._backward_names() if backward_ran else set()
        recomputed = {call.name for calls in self._calls.values() for call in calls if call.recompute}
        uncounted, uncounted_backward = self._uncounted()
        for name, record in records.items():
            totals = self._totals.get(name) or _Totals()
            ran = name in self._originals and name not in uncounted  # called in the counted step, on a counted
            # thread (records may average other steps)
            adopted = self._adopted.get(name)
            if adopted is not None and ran:
                totals = _joined(totals, adopted)
            forward, backward, recompute = totals.flops
            record.flops_forward = forward if ran else None
            ran_backward = ran and name in backward_names and name not in uncounted_backward
            record.flops_backward = backward if ran_backward else None
            record.flops_recompute = recompute if recompute or name in recomputed else None
            record.unknown_ops = dict(totals.unknown.most_common())
            moved_forward, moved_backward, moved_recompute = totals.bytes
            record.bytes_forward = moved_forward if ran else None
            record.bytes_backward = moved_backward if ran_backward else None
            record.bytes_recompute = moved_recompute if recompute or moved_recompute or name in recomputed else None
            record.self_flops = totals.self_flops if ran else None
            record.self_bytes = totals.self_bytes if ran else None
        self._calls.clear()
        self._logical_parent.clear()
        self._originals.clear()
        self._adopters.clear()
        self._adopted.clear()
