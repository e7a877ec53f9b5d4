"""Argument checks at the public boundary: one message shape everywhere, naming the argument and what is allowed.

``True`` is an int to Python, a string compares badly with numbers, and a float silently truncates: each of
those is refused here, once, rather than failing later with Python's own message (or not at all).
"""
from __future__ import annotations

import numbers
import os
from typing import Any, Callable

__all__ = ["check_int", "check_real", "check_bool", "check_names", "check_text", "check_path"]


def _shown(value: Any) -> str:
    return f"{value!r} ({type(value).__name__})"


def check_int(name: str, value: Any, *, minimum: int | None = 0, none: bool = False) -> Any:
    """``value`` as an int >= ``minimum`` (None passes when ``none``); a TypeError or ValueError naming ``name``.

    >>> check_int("warmup", 2)
    2
    >>> check_int("warmup", "2")
    Traceback (most recent call last):
    ...
    TypeError: warmup must be an int >= 0, got '2' (str)
    """
    if type(value) is int and (minimum is None or value >= minimum):
        return value  # the common case, without the message made or the ABC check
    allowed = "an int" + ("" if minimum is None else f" >= {minimum}") + (" or None" if none else "")
    if value is None and none:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be {allowed}, got {_shown(value)}")
    value = int(value)
    if minimum is not None and value < minimum:
        raise ValueError(f"{name} must be >= {minimum}" + (" or None" if none else "") + f", got {value}")
    return value


def check_real(name: str, value: Any, allowed: str, within: Callable[[float], bool], refused: str | None = None
               ) -> float:
    """``value`` as a float where it is a real number (not a bool) that ``within`` accepts; a TypeError naming
    ``name`` for one that is no number, a ValueError for one ``within`` refuses (NaN included, where ``within``
    compares). ``allowed`` says what to give; ``refused``, where set, says it in the ValueError instead.

    >>> check_real("margin", "0.2", "a fraction such as 0.2", lambda x: x >= 0)
    Traceback (most recent call last):
    ...
    TypeError: margin must be a fraction such as 0.2, got '0.2' (str)
    """
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be {allowed}, got {_shown(value)}")
    if not within(value):
        raise ValueError(f"{name} must be {refused or allowed}, got {value!r}")
    return float(value)


def check_bool(name: str, value: Any) -> bool:
    """``value`` if it is True or False (numpy bools too); a TypeError naming ``name`` otherwise."""
    if isinstance(value, bool) or type(value).__name__ == "bool_":
        return bool(value)
    raise TypeError(f"{name} must be True or False, got {_shown(value)}")


def check_names(name: str, value: Any, example: str) -> tuple[str, ...]:
    """A tuple of names from an iterable of strings. A single string is refused with a hint that splits it on
    commas (``"flops,params"`` -> ``("flops", "params")``), the likely intent."""
    if isinstance(value, str):
        parts = tuple(part.strip() for part in value.split(",") if part.strip()) or (value,)
        raise TypeError(f"{name} must be a sequence of names, not a string: write {name}={parts!r}")
    try:
        names = tuple(value)
    except TypeError:
        raise TypeError(f"{name} must be a sequence of names such as {example}, got {_shown(value)}") from None
    for item in names:
        if not isinstance(item, str):
            raise TypeError(f"{name} must hold names (strings) such as {example}, got {_shown(item)} among them")
    return names


def check_text(name: str, value: Any) -> str | None:
    """``value`` if it is a string or None; a TypeError naming ``name`` otherwise."""
    if value is None or isinstance(value, str):
        return value
    raise TypeError(f"{name} must be a string or None, got {_shown(value)}")


def check_path(value: Any, *, columns: bool = False) -> Any:
    """``value`` if it is a file path (str or os.PathLike) or None; a TypeError otherwise. Where the method also
    takes ``columns``, a list is most likely columns given where the path goes (``to_csv(["name", "forward"])``):
    the message then says to write ``columns=``.

    >>> check_path(["name"], columns=True)
    Traceback (most recent call last):
    ...
    TypeError: path must be a file path (a str or a Path) or None, got ['name'] (list); to choose columns, write columns=['name']
    """
    if value is None or isinstance(value, (str, os.PathLike)):
        return value
    hint = f"; to choose columns, write columns={value!r}" if columns and isinstance(value, (list, tuple)) else ""
    raise TypeError(f"path must be a file path (a str or a Path) or None, got {_shown(value)}{hint}")
