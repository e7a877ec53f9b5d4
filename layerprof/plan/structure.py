"""Whether a model has the structure of the one a plan was made for, beyond the names the plan wraps.

Names alone resolve on more models than the profiled one: a plan made on a 4-layer BERT wraps ``encoder.layer.0``
of a 12-layer one too, and one wrapping a Sequential's run ``[0:3]`` applies to any Sequential of three children or
more. The plan keeps the qualified names of the profiled model's modules (its records, one per module, under the
name ``named_modules()`` gives it first) and compares them as it applies:

- under a module or run it wraps, the model must hold the same modules by name (what the plan frees and re-runs is
  that subtree's): else the plan is refused;
- elsewhere, modules the profile did not have or that the model lacks change what the step keeps and takes
  beside the plan's modules, so its figures are not the model's: a warning.

Types are not compared below the wrapped modules: FSDP2's ``fully_shard`` gives a module a class of its own
(``FSDPLinear``), and a plan made before sharding still fits.
"""
from __future__ import annotations

from typing import Collection, Iterable

__all__ = ["under_each", "structure_differs"]


def under_each(names: Iterable[str], roots: Collection[str]) -> dict[str, set[str]]:
    """For each name in ``roots``, the names of ``names`` at or below it (``""`` is the whole model). Linear in the
    names and their depth: each name's prefixes are looked up, not each root scanned."""
    found: dict[str, set[str]] = {root: set() for root in roots}
    whole = found.get("")
    for name in names:
        if whole is not None:
            whole.add(name)
        end = len(name)
        while end > 0:
            below = found.get(name[:end])
            if below is not None:
                below.add(name)
            end = name.rfind(".", 0, end)
    return found


def _shown(names: set[str]) -> str:
    ordered = sorted(names, key=lambda name: (name.count("."), name))
    return ", ".join(repr(name) for name in ordered[:3]) + (f" and {len(ordered) - 3} more" if len(ordered) > 3 else "")


def structure_differs(profiled: Collection[str], model: Collection[str], wrapped: dict[str, Collection[str]]
                      ) -> tuple[str | None, str | None]:
    """(refusal, warning): what keeps the plan from applying, and what makes its figures another model's, or None.
    ``profiled``/``model``: the modules' qualified names; ``wrapped``: each wrapped module's or run's name, with the
    names of the modules whose subtrees it wraps (the module itself, or the run's children)."""
    roots = {root for roots in wrapped.values() for root in roots}
    before, now = under_each(profiled, roots), under_each(model, roots)
    for name, parts in wrapped.items():
        then = set().union(*(before[root] for root in parts))
        here = set().union(*(now[root] for root in parts))
        if then != here:
            change = "; ".join(part for part in (
                f"it has {_shown(here - then)} that the profiled one had not" if here - then else "",
                f"it lacks {_shown(then - here)}" if then - here else "") if part)
            return (f"model: the plan wraps {name!r}, whose modules in this model are not the profiled model's "
                    f"({change}); the plan frees and re-runs what the profiled model's held. Profile this model and "
                    "plan on that profile"), None
    model_set, profiled_set = set(model), set(profiled)
    if model_set == profiled_set:
        return None, None
    added, missing = model_set - profiled_set, profiled_set - model_set
    change = "; ".join(part for part in (
        f"{len(added)} module(s) the profiled model had not ({_shown(added)})" if added else "",
        f"{len(missing)} of its module(s) missing ({_shown(missing)})" if missing else "") if part)
    return None, (f"the plan was made on a model other than this one: this one has {change}. The modules the plan "
                  "wraps are as profiled, but the saved bytes and extra time it predicts are the profiled model's: "
                  "profile this model and plan on that profile for its figures")
