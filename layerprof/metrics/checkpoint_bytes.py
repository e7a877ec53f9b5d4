"""What wrapping a module in ``torch.utils.checkpoint`` would free and keep, worked out by the memory meter.

Within one forward of the model every saved storage has its savers: the innermost calls running when autograd
saved it. For a call ``c`` (figures summed over a module's calls):

- ``checkpoint_freed_bytes``: storages whose every saver is ``c`` or a call nested in it, except ``c``'s own
  inputs: nothing outside the region needs them, so a checkpoint of ``c`` does not hold them.
- ``checkpoint_kept_bytes``: ``c``'s input storages (not parameters or buffers) that a non-reentrant checkpoint
  holds in their place and that would otherwise not be held: none of their savers is inside ``c`` (then they
  are not in the freed bytes) or an ancestor of ``c`` (those stay saved while ``c`` is wrapped). An input saved
  only by a sibling is counted as kept, which is exact when the sibling is wrapped too and errs on the side of
  more memory when it is not.

Wrapping a set of modules none of which contains another then saves about ``Σ (freed - kept)`` bytes. Not
additive exactly when a storage is saved in two wrapped regions (counted in neither's freed bytes: the plan frees
less than it could, never more than it says) or an input saved by an unwrapped sibling (counted as kept).

Safety counts: ``checkpoint_side_effects`` is the number of calls, this one's and nested ones, whose forward
changes state that a recomputation would change again (BatchNorm updating running statistics in training, and
any module whose buffers the step updated in place or replaced: spectral norm's power-iteration vectors, an EMA
codebook, a call counter; ``buffer_versions`` and ``updated_buffers``);
``checkpoint_cache_updates`` those handed a key/value cache, which they extend (Hugging Face models with
``use_cache=True``): a recomputation would attend over the keys its forward already added, so it is never allowed;
``checkpoint_inplace_inputs`` the number of this module's calls that modified an input in place (a checkpoint
would have saved the input before the change), and ``checkpoint_inputs_changed_later`` those whose input the code of
a module they ran inside modified in place after they returned (``x += block(x)``: a checkpoint holds the input for
the recomputation, which fails on its new version); ``checkpoint_no_grad_calls`` its calls made with gradients off (a
reference model's pass under ``no_grad``: nothing saved, nothing recomputed); ``foreign_calls`` the calls made from
a module that is not one of its tree ancestors (a shared module: wrapping it would nest with the wrapping of its
callers).
"""
from __future__ import annotations

from typing import Any, Sequence

import torch
from torch import nn

from .._tensors import is_lazy, iter_tensors
from .._torch import tensor_version
from ..record.fields import Field, declare

__all__ = ["CHECKPOINT_FIELDS", "STORAGES_ATTRIBUTE", "storage_table", "saved_after", "freed_by_runs", "saved_peak", "regions", "has_side_effects", "updates_a_cache", "input_versions", "mutated_inputs", "settle_forward", "buffer_versions", "updated_buffers"]

CHECKPOINT_FIELDS = (
    "checkpoint_freed_bytes", "checkpoint_kept_bytes", "checkpoint_side_effects", "checkpoint_cache_updates",
    "checkpoint_inplace_inputs", "checkpoint_inputs_changed_later", "foreign_calls", "checkpoint_saved_tensors",
    "checkpoint_no_grad_calls",
)
declare(
    Field("checkpoint_freed_bytes", "bytes", "Ckpt Frees", share_of="saved_bytes", meter="memory", detail=True,
          doc="saved bytes that wrapping the module in torch.utils.checkpoint would free"),
    Field("checkpoint_kept_bytes", "bytes", "Ckpt Keeps", meter="memory", detail=True,
          doc="input bytes a checkpoint of the module would hold that nothing else saves"),
    Field("checkpoint_side_effects", "count", "Ckpt Side Effects", meter="memory", detail=True, cost=False,
          doc="calls in the module whose recomputation would repeat a side effect (a buffer updated in forward: "
              "BatchNorm running stats, spectral norm)"),
    Field("checkpoint_cache_updates", "count", "Ckpt Cache Updates", meter="memory", detail=True, cost=False,
          doc="calls in the module handed a key/value cache to extend (Hugging Face use_cache=True)"),
    Field("checkpoint_inplace_inputs", "count", "In-place Inputs", meter="memory", detail=True, cost=False,
          doc="calls of the module that modified one of their inputs in place"),
    Field("checkpoint_inputs_changed_later", "count", "Inputs Changed Later", meter="memory", detail=True,
          cost=False, doc="calls of the module whose input its callers' code modified in place after it returned"),
    Field("foreign_calls", "count", "Foreign Calls", meter="memory", detail=True, cost=False,
          doc="calls of the module made from a module that does not contain it (a shared module)"),
    Field("checkpoint_saved_tensors", "count", "Ckpt Tensors", meter="memory", detail=True, cost=False,
          doc="tensors autograd saved in the module's forward, every one (a checkpoint's hooks handle each)"),
    Field("checkpoint_no_grad_calls", "count", "No-grad Calls", meter="memory", detail=True, cost=False,
          doc="calls of the module made with gradients off (no_grad, inference_mode): a checkpoint re-runs none"),
)

# The root record's private attribute holding ``storage_table`` of each forward (live profiles, and profiles saved
# from one: ``layerprof.record.step_tables``).
from ..record.step_tables import STORAGES_ATTRIBUTE  # noqa: E402

_NORMS = (nn.modules.batchnorm._BatchNorm,)


def has_side_effects(module: nn.Module) -> bool:
    """Whether running the module's own forward again changes state a second time: a BatchNorm (or SyncBatchNorm)
    in training that tracks running statistics."""
    return isinstance(module, _NORMS) and module.training and module.track_running_stats


def buffer_versions(entries: Sequence[tuple[str, nn.Module]]) -> list[tuple[str, nn.Module, str, Any, int]]:
    """(module name, module, buffer name, buffer, version) of every module's own buffers, as a block starts."""
    found = []
    for name, module in entries:
        for key, buffer in module._buffers.items():
            # (a lazy module's buffer not made yet, LazyBatchNorm's before its first call: nothing to read; it is
            # made, not updated, by that call)
            if buffer is not None and not is_lazy(buffer) and not buffer.is_inference():
                found.append((name, module, key, buffer, tensor_version(buffer)))
    return found


def updated_buffers(before: Sequence[tuple[str, nn.Module, str, Any, int]]) -> set[str]:
    """The names of the modules with a buffer updated in place or replaced since ``buffer_versions`` read them: state
    a checkpoint's recomputation of the module's forward would update again (a spectral norm's vectors advance twice
    a step, an EMA decays twice, a counter counts twice), which is wrong, and silently so, where backward reads it."""
    return {name for name, module, key, buffer, version in before
            if module._buffers.get(key) is not buffer or tensor_version(buffer) != version}


def updates_a_cache(args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    """Whether the call is handed a key/value cache (a Hugging Face ``Cache``), which attention layers update in
    place: a recomputation would find it already updated."""
    return any(any(cls.__name__ == "Cache" for cls in type(value).__mro__)
               for value in (*args, *kwargs.values()) if not isinstance(value, (torch.Tensor, int, float, str)))


def input_versions(inputs: Any) -> list[tuple[torch.Tensor, int]]:
    """(tensor, version) of the tensors in a call's inputs; none where no checkpoint could run (no grad)."""
    if not torch.is_grad_enabled():
        return []
    return [(tensor, tensor_version(tensor)) for tensor in iter_tensors(inputs) if not tensor.is_inference()]


def mutated_inputs(versions: Sequence[tuple[torch.Tensor, int]]) -> int:
    """1 when any of the (tensor, version at the call's start) pairs was modified in place since, else 0."""
    return int(any(tensor_version(tensor) != version for tensor, version in versions))


def _ancestor_at(state: Any, depth: int) -> Any:
    while state is not None and state.depth > depth:
        state = state.parent
    return state


def _common_ancestor(states: Sequence[Any]) -> Any:
    common = states[0]
    for other in states[1:]:
        depth = min(common.depth, other.depth)
        common, other = _ancestor_at(common, depth), _ancestor_at(other, depth)
        while common is not other:
            common, other = common.parent, other.parent
            if common is None or other is None:
                return None
    return common


def settle_forward(calls: Sequence[Any], savers: dict[int, list[Any]]) -> None:
    """Add to each call's ``freed`` and ``kept`` (see the module doc). ``calls``: the call states of one forward,
    each with ``parent``, ``depth`` and ``input_sizes`` (storage key -> bytes); ``savers``: storage key ->
    ``[bytes, saver state, ...]``."""
    for key, entry in savers.items():
        size, states = entry[0], entry[1:]
        state = _common_ancestor(states) if len(states) > 1 else states[0]
        while state is not None:
            if key not in state.input_sizes:
                state.freed += size
            state = state.parent
    for call in calls:
        for key, size in call.input_sizes.items():
            entry = savers.get(key)
            if entry is None or not any(_holds(saver, call) for saver in entry[1:]):
                call.kept += size


def _holds(saver: Any, call: Any) -> bool:
    """Whether ``saver`` stays saving while ``call`` is wrapped: it is inside ``call`` or one of its ancestors."""
    if saver.depth >= call.depth:
        return _ancestor_at(saver, call.depth) is call
    return _ancestor_at(call, saver.depth) is saver


def storage_table(calls: Sequence[Any], savers: dict[int, list[Any]]) -> dict[str, list[Any]]:
    """One forward as plain lists, for ``saved_after``: the calls (``names``, ``parents`` as indexes, -1 for none)
    and the storages saved or taken as input (``sizes``, ``savers`` and ``inputs`` as lists of call indexes)."""
    index = {id(call): i for i, call in enumerate(calls)}
    rows: dict[int, list[Any]] = {}
    for key, entry in savers.items():
        rows[key] = [entry[0], sorted({index[id(s)] for s in entry[1:] if id(s) in index}), []]
    for i, call in enumerate(calls):
        for key, size in call.input_sizes.items():
            rows.setdefault(key, [size, [], []])[2].append(i)
    return {
        "names": [call.name for call in calls],
        "parents": [index.get(id(call.parent), -1) for call in calls],
        "sizes": [row[0] for row in rows.values()],
        "savers": [row[1] for row in rows.values()],
        "inputs": [row[2] for row in rows.values()],
    }


def saved_after(tables: Sequence[dict[str, list[Any]]], wrapped: set[str],
                runs: Sequence[Sequence[str]] = ()) -> int:
    """The bytes saved for backward once the modules named in ``wrapped`` run under non-reentrant checkpoint: a
    storage stays if a call outside every wrapped call saves it, or if it is an input of an outermost wrapped call
    (the checkpoint holds it). Exact where ``Σ (freed - kept)`` is additive only approximately. ``runs``: runs of
    consecutive sibling modules (names in call order) each under one checkpoint, which holds the first one's
    inputs only."""
    firsts = {run[0] for run in runs}
    members = {name for run in runs for name in run}
    total = 0
    for table in tables:
        names, parents = table["names"], table["parents"]
        inside = [False] * len(names)
        outermost = [False] * len(names)
        for i, name in enumerate(names):  # parents come before their children
            parent = parents[i]
            enclosed = parent >= 0 and inside[parent]
            outermost[i] = (name in wrapped or name in firsts) and not enclosed
            inside[i] = enclosed or outermost[i] or name in members
        for size, saved_by, taken_by in zip(table["sizes"], table["savers"], table["inputs"]):
            if any(not inside[i] for i in saved_by) or any(outermost[i] for i in taken_by):
                total += size
    return total


def regions(table: dict[str, list[Any]], wrapped: set[str], runs: Sequence[Sequence[str]] = ()) -> list[int]:
    """For each call of one forward's table, the index of the outermost wrapped call (or the first call of a run)
    whose checkpoint holds it, -1 for a call outside every checkpoint."""
    firsts = {run[0] for run in runs}
    run_of = {name: run[0] for run in runs for name in run}
    names, parents = table["names"], table["parents"]
    region = [-1] * len(names)
    opened: dict[str, int] = {}
    for i, name in enumerate(names):  # parents come before their children
        parent = parents[i]
        if parent >= 0 and region[parent] >= 0:
            region[i] = region[parent]
        elif name in wrapped or name in firsts:
            region[i] = opened[name] = i
        elif name in run_of and run_of[name] in opened:
            region[i] = opened[run_of[name]]
    return region


def saved_peak(tables: Sequence[dict[str, list[Any]]], wrapped: set[str],
                runs: Sequence[Sequence[str]] = ()) -> tuple[int, str | None]:
    """The most bytes held for backward at once in a step with ``wrapped`` (and ``runs``) under checkpoint, and
    the wrapped call where it is reached (None: at the end of forward, ``saved_after``). Backward releases a storage
    that stays saved when it reaches the earliest call holding it (a saver outside every wrapped call, or the
    outermost wrapped call whose input it is), and a wrapped call's recomputation saves its region's storages again,
    all at once: at that moment what the calls before it hold is still held. Summed over the forwards of a step."""
    total, where = 0, None
    for table in tables:
        names = table["names"]
        region = regions(table, wrapped, runs)
        held: list[tuple[int, int]] = []  # (the earliest call holding it, bytes) of each storage that stays saved
        again: dict[int, int] = {}  # wrapped call -> the bytes its recomputation saves again
        for size, saved_by, taken_by in zip(table["sizes"], table["savers"], table["inputs"]):
            holders = [i for i in saved_by if region[i] < 0] + [i for i in taken_by if region[i] == i]
            if holders:
                held.append((min(holders), size))
                continue
            for start in {region[i] for i in saved_by}:
                again[start] = again.get(start, 0) + size
        held.sort()
        best, best_at = sum(size for _, size in held), None
        position, alive = 0, 0
        for start in sorted(again):
            while position < len(held) and held[position][0] <= start:
                alive += held[position][1]
                position += 1
            if alive + again[start] > best:
                best, best_at = alive + again[start], names[start]
        total += best
        where = best_at if best_at is not None else where
    return total, where


def freed_by_runs(tables: Sequence[dict[str, list[Any]]], runs: Sequence[Sequence[str]]) -> list[int]:
    """For each run alone (as ``saved_after`` takes it), the bytes it frees: ``saved_after(tables, set())`` less
    ``saved_after(tables, set(), [run])``, touching only the run's calls and their storages (a plan weighs every
    run of every Sequential: a pass over the whole table a run took a minute on 10,000 modules)."""
    freed = [0] * len(runs)
    for table in tables:
        names, parents, savers, sizes = table["names"], table["parents"], table["savers"], table["sizes"]
        saves: list[list[int]] = [[] for _ in names]  # call -> the storages it saves
        takes: list[list[int]] = [[] for _ in names]  # call -> the storages it takes as input
        for row, (saved_by, taken_by) in enumerate(zip(savers, table["inputs"])):
            for call in saved_by:
                saves[call].append(row)
            for call in taken_by:
                takes[call].append(row)
        calls_of: dict[str, list[int]] = {}  # name -> its calls
        below: list[list[int]] = [[] for _ in names]  # call -> the calls made inside it
        for i, name in enumerate(names):
            calls_of.setdefault(name, []).append(i)
            if parents[i] >= 0:
                below[parents[i]].append(i)
        # The run's calls and every call inside them, per storage saved there how many of its savers are not, and
        # the bytes of those all of whose savers are: carried on to the next run where that is this one and one more
        # module (a Sequential's runs from one child, in order), so that each call is added once per first child.
        previous: Sequence[str] = ()
        inside: set[int] = set()
        missing: dict[int, int] = {}
        full = 0
        for k, run in enumerate(runs):
            added: Sequence[str] = run
            if len(run) > 1 and tuple(run[:-1]) == tuple(previous):
                added = run[-1:]
            else:
                inside, missing, full = set(), {}, 0
            for name in added:
                pending = list(calls_of.get(name, ()))
                while pending:
                    call = pending.pop()
                    if call in inside:
                        continue
                    inside.add(call)
                    pending.extend(below[call])
                    for row in saves[call]:
                        left = missing.get(row, len(savers[row])) - 1
                        missing[row] = left
                        if left == 0:
                            full += sizes[row]
            previous = run
            freed[k] += full
            held = {row for i in calls_of.get(run[0], ()) if not (parents[i] >= 0 and parents[i] in inside)
                    for row in takes[i]}
            for row in held:  # the checkpoint holds them: not freed, and those nothing saves are held on top
                if not savers[row] or missing.get(row) == 0:
                    freed[k] -= sizes[row]
    return freed
