"""Figures derived from a model (the parameter figures), kept from one profiling block to the next while the
block's check of the model finds it unchanged (``collect/reuse.py``). Here, not in ``collect``, so that meters,
which must not import the collection layer, can keep theirs."""
from __future__ import annotations

from typing import Any, Callable

__all__ = ["derived", "verified"]

# (model, the values kept for it) while a block starts, right after its plan was checked against the model.
_CURRENT: list[Any] = [None, None]


def derived(model: Any, name: str, compute: Callable[[], Any]) -> Any:
    """``compute()``, or inside ``verified(model, values)`` the value kept under ``name`` (computed and kept
    there the first time)."""
    current, values = _CURRENT
    if values is None or current is not model:
        return compute()
    try:
        return values[name]
    except KeyError:
        value = values[name] = compute()
        return value


class verified:
    """While a block starts: ``derived`` values of ``model`` come from (and go to) ``values``; None: nothing is
    kept (the model cannot be checked cheaply, e.g. it has lazy parameters)."""

    def __init__(self, model: Any, values: dict[str, Any] | None) -> None:
        self.state = [model, values]

    def __enter__(self) -> None:
        _CURRENT[:] = self.state

    def __exit__(self, *exc: Any) -> None:
        _CURRENT[:] = [None, None]
