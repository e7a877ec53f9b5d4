"""Which ancestors hold a call made outside their own calls: the record tree's inclusive figures.

A module's inclusive figures (forward and backward time, FLOPs, bytes, activations and saved bytes) cover the
work of every module of its subtree in the record tree, each instant once. Its own calls cover the calls made
inside them; a call of a descendant made while no call of a module of the subtree was open is outside them, and
the ancestor *adopts* it: its inclusive figures add the call's, once. Transformers' ``generate()`` on an
encoder-decoder calls the encoder by itself, then the whole model once per token: the model and its base model
adopt the encoder's call. So does a container called sometimes and iterated other times, for the children its
parent calls directly, and a module whose record lies under another subtree than the one calling it (a sibling's
forward calling it, a module shared by two parents under its first name): each subtree then holds the call, and
the parent's children can add up to more than the parent, as the subtrees overlap.

An adopted call is not a call of the ancestor: ``calls``, ``call_times`` and the self figures (the module's own
code) are the ancestor's own calls only. An ancestor that never ran in the step adopts nothing: a ModuleList,
never called, keeps None, and renderers sum its children as before. A checkpoint re-run adopts nothing (its time
is recompute, rolled up the tree apart).

"Open" is on the call's thread and, for a call made with no call open on its thread (a DataParallel replica's, on
a thread of its own), on the thread that was running a call when it began (``elsewhere``): a call made while its
ancestor runs on another thread is inside that ancestor's call, not beside it.
"""
from __future__ import annotations

from typing import Any

__all__ = ["PREFIXES", "adopters", "caller", "tree_parent", "prefix_of"]

# Name -> its prefix (``prefix_of``), for the check made on every call of every step: a lookup costs half a
# ``rpartition``, and a caller in a hot loop reads the dict itself.
PREFIXES: dict[str, str] = {}


def tree_parent(name: str) -> str | None:
    """The name of the record tree's parent of the record ``name`` (``build_tree`` attaches a record under its
    name's prefix), None for the root."""
    return name.rpartition(".")[0] if name else None


def prefix_of(name: str) -> str:
    """``name.rpartition(".")[0]``, remembered: the tree parent's name ("" for the root and its children)."""
    prefix = PREFIXES.get(name)
    if prefix is None:
        if len(PREFIXES) > 100_000:  # names of many models: start again rather than grow without bound
            PREFIXES.clear()
        prefix = PREFIXES[name] = name.rpartition(".")[0]
    return prefix


def caller(call: Any) -> Any:
    """The call open around ``call``: its parent, or where it has none, the call running on another thread."""
    parent = call.parent
    return parent if parent is not None else getattr(call, "elsewhere", None)


def _covers(ancestor: str, opened: list[str]) -> bool:
    """Whether a module of ``ancestor``'s subtree is among the open ones."""
    if not ancestor:
        return bool(opened)
    prefix = ancestor + "."
    for name in opened:
        if name == ancestor or name.startswith(prefix):
            return True
    return False


def adopters(call: Any) -> tuple[str, ...]:
    """The tree ancestors of ``call``'s module that adopt it, nearest first: each one up from its parent while no
    module of that ancestor's subtree has a call open around it (one that does covers it, and so does every
    ancestor above). Whether an ancestor ran in the step, and so adopts anything, is for the caller to say.

    ``call``: anything with ``name``, ``parent`` (the enclosing call, or None), ``recompute`` and optionally
    ``elsewhere`` (the call running on another thread when it began, where ``parent`` is None)."""
    name = call.name
    if not name or call.recompute:
        return ()
    parent_name = prefix_of(name)
    around = caller(call)
    if around is not None and around.name == parent_name:  # the common case: called by its parent
        return ()
    # The chain cannot loop: a parent, and the call another thread was running, began before the call.
    opened: list[str] = []
    while around is not None:
        opened.append(around.name)
        around = caller(around)
    found: list[str] = []
    ancestor: str | None = parent_name
    while ancestor is not None and not _covers(ancestor, opened):
        found.append(ancestor)
        ancestor = tree_parent(ancestor)
    return tuple(found)
