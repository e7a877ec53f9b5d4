"""A griffe extension for the API reference: the docstrings' doctest examples (``>>>`` runs, which pytest runs with
--doctest-modules) are shown as Python console code blocks instead of being read as Markdown prose."""
from __future__ import annotations

import re
from typing import Any

import griffe

_PROMPT = re.compile(r"^(?P<indent>\s*)>>> ")


def fence_doctests(text: str) -> str:
    """Wrap each doctest run (from a ``>>>`` line to the next blank line) in a ```pycon fence."""
    out: list[str] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        prompt = _PROMPT.match(lines[i])
        if not prompt:
            out.append(lines[i])
            i += 1
            continue
        indent = prompt["indent"]
        j = i
        while j < len(lines) and lines[j].strip():
            j += 1
        out += ["", indent + "```pycon", *lines[i:j], indent + "```", ""]
        i = j
    return "\n".join(out)


class DoctestFences(griffe.Extension):
    """Fences the doctests of every object griffe loads."""

    def on_instance(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is not None and ">>> " in obj.docstring.value:
            obj.docstring.value = fence_doctests(obj.docstring.value)
