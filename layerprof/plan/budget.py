"""Reading a memory budget: bytes (an int, or a string of digits), a size with a unit ("2GiB", "300MB", "1.5 gb"),
a percentage ("50%") or a fraction of today's saved bytes (a float in (0, 1], or a string that spells one: ``0.5``,
``"0.5"``). A float above 1 is refused rather than read as bytes: ``1.0`` is all of today's, and ``2.0`` bytes is
almost surely not what was meant."""
from __future__ import annotations

import math
import numbers
import re

__all__ = ["parse_budget"]

_UNITS = {
    "": 1, "b": 1,
    "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
    "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40,
    "k": 2**10, "m": 2**20, "g": 2**30,
}
_SIZE = re.compile(r"^\s*([+-]?[0-9]*\.?[0-9]+(?:e[+-]?[0-9]+)?)\s*([a-z]*)\s*$", re.IGNORECASE)
_HINT = "give bytes (an int), a size such as '2GiB' or '300MB', a percentage such as '50%', or a fraction in (0, 1]"


def parse_budget(budget: object, today: int, name: str = "budget") -> int:
    """The budget in bytes, given ``today``'s bytes (for fractions): of saved-for-backward memory, or of the step's
    peak (``name``: the argument that gave it, named in errors).

    >>> parse_budget("2GiB", 0), parse_budget("50%", 1000), parse_budget(0.25, 1000), parse_budget(300, 1000)
    (2147483648, 500, 250, 300)
    """
    if not isinstance(budget, (numbers.Real, str)) and getattr(budget, "shape", None) == () and hasattr(budget, "item"):
        budget = budget.item()  # a 0-d tensor (or array): a budget computed from tensors
    if isinstance(budget, bool) or not isinstance(budget, (numbers.Real, str)):
        raise TypeError(f"{name} must be bytes, a size string or a fraction, got {type(budget).__name__}; {_HINT}")
    given = budget
    if isinstance(budget, str):
        text = budget.strip()
        if text.endswith("%"):
            try:
                share = float(text[:-1]) / 100
            except ValueError:
                raise ValueError(f"{name} {budget!r} is not a percentage; {_HINT}") from None
            return _fraction(share, today, budget, name)
        match = _SIZE.match(text)
        if match is None or match.group(2).lower() not in _UNITS:
            raise ValueError(f"cannot read {name} {budget!r}; {_HINT}")
        if match.group(2):
            return _bytes(float(match.group(1)) * _UNITS[match.group(2).lower()], budget, name)
        # A bare number reads as the number it spells: "300" bytes as 300 does, "0.5" a fraction as 0.5 does; a
        # whole number in scientific notation ("1e6", as a shell gives it) is bytes, as 10**6 is
        number = match.group(1)
        digits = number.lstrip("+-")
        if digits.isdigit():
            budget = int(number)
        else:
            budget = float(number)
            if "e" in number.lower() and budget > 1 and budget.is_integer():
                budget = int(budget)
    # numpy's and torch's scalars as Python's: a budget computed from an array or a tensor
    budget = int(budget) if isinstance(budget, numbers.Integral) else float(budget)
    if isinstance(budget, int):
        return _bytes(budget, given, name)
    if 0 < budget <= 1:
        return _fraction(budget, today, given, name)
    if math.isfinite(budget) and budget > 1:
        raise ValueError(f"{name} {given!r}: a {name} given as a float or with a decimal point is a fraction in "
                         f"(0, 1]; for bytes give a whole number ({int(budget)}) or a size such as '2GiB'")
    return _bytes(budget, given, name)


def _fraction(share: float, today: int, given: object, name: str) -> int:
    if not math.isfinite(share) or share < 0:
        raise ValueError(f"{name} {given!r} must be a share of 0 or more (0%, 50%; above 100% is more than "
                         f"today's); {_HINT}")
    return int(math.floor(share * today))


def _bytes(value: float, given: object, name: str) -> int:
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"{name} {given!r} must be a non-negative number of bytes; {_HINT}")
    return int(value)
