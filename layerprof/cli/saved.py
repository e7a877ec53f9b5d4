"""``layerprof show PROFILE.json`` and ``layerprof compare A.json B.json``: the command on saved profiles.

``show`` renders a profile written by ``prof.to_json(path)`` or ``layerprof SPEC --json PATH`` (the annotated
summary, and any of the files ``layerprof SPEC`` writes). ``compare`` prints the comparison of two and, with
``--fail-if-slower PCT``, exits 1 when B's time (``--by``: forward, backward or total) is more than PCT % above
A's, so a CI job can gate on performance.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Sequence

from ..profile import Profile, compare, load
from ..record.fields import FIELDS
from ..render.units import format_value
from .errors import RunError, UsageError, one_line
from .outputs import requested_outputs, write_outputs
from .parser import _Parser, _depth, _names, add_output_options

__all__ = ["SUBCOMMANDS", "run_saved"]

SUBCOMMANDS = ("show", "compare")
EXIT_SLOWER = 1


def _show_parser(prog: str) -> argparse.ArgumentParser:
    parser = _Parser(prog=f"{prog} show", description="Render a saved profile (a layerprof JSON file).")
    parser.add_argument("profile", metavar="PROFILE.json", help="written by prof.to_json(path) or --json PATH")
    parser.add_argument("--depth", type=_depth, default=2, metavar="N",
                        help="expand modules down to this depth, root = 0; 'all' for every level (default 2)")
    parser.add_argument("--columns", type=_names, metavar="A,B", help="columns of the annotated tree")
    add_output_options(parser)
    return parser


def _compare_parser(prog: str) -> argparse.ArgumentParser:
    parser = _Parser(prog=f"{prog} compare",
                     description="Compare two saved profiles; with --fail-if-slower, exit 1 on a slowdown.")
    parser.add_argument("a", metavar="A.json", help="the reference profile")
    parser.add_argument("b", metavar="B.json", help="the profile compared with it")
    parser.add_argument("--by", choices=("forward", "backward", "total"), default="total",
                        help="the time --fail-if-slower checks (default total)")
    parser.add_argument("--fail-if-slower", type=float, metavar="PCT",
                        help="exit 1 when B's time is more than PCT %% above A's")
    return parser


def _load(path: str, what: str) -> Profile:
    if not Path(path).is_file():
        raise UsageError(f"{what} {path!r}: no such file")
    try:
        return load(path)
    except (ValueError, KeyError, TypeError) as exc:
        raise RunError(f"{what} {path!r} is not a layerprof profile: {one_line(exc)}") from exc


def _show(options: argparse.Namespace) -> int:
    outputs = requested_outputs(options)
    profile = _load(options.profile, "PROFILE")
    try:
        print(profile.layerwise_summary(columns=options.columns, depth=options.depth), flush=True)
    except ValueError as exc:
        raise UsageError(str(exc)) from exc
    for path in write_outputs(profile, outputs, options.plot_kind, options.plot_metric):
        print(f"layerprof: wrote {path}", file=sys.stderr)
    return 0


def slowdown_percent(a: Profile, b: Profile, by: str = "total") -> float | None:
    """How much slower B is than A in ``by`` time (forward, backward, total), in percent; None when unknown."""
    field = FIELDS[f"{by}_ms"]
    time_a, time_b = field.value(a.tree), field.value(b.tree)
    if time_a is None or time_b is None or time_a <= 0:
        return None
    return 100.0 * (time_b - time_a) / time_a


def _compare(options: argparse.Namespace) -> int:
    a, b = _load(options.a, "A"), _load(options.b, "B")
    print(compare(a, b, names=("A", "B")), flush=True)
    change = slowdown_percent(a, b, options.by)
    if options.fail_if_slower is None:
        return 0
    if change is None:
        raise RunError(f"--fail-if-slower: the profiles hold no {options.by} time to compare")
    field = FIELDS[f"{options.by}_ms"]
    shown = (f"{options.by} time {format_value('ms', field.value(a.tree))} -> {format_value('ms', field.value(b.tree))}"
             f" ({change:+.1f} %, limit +{options.fail_if_slower:g} %)")
    if change > options.fail_if_slower:
        print(f"layerprof compare: FAIL: B is slower: {shown}", file=sys.stderr)
        return EXIT_SLOWER
    print(f"layerprof compare: ok: {shown}", file=sys.stderr)
    return 0


def run_saved(argv: Sequence[str], prog: str = "layerprof") -> int:
    """Run ``show`` or ``compare`` (``argv[0]``) with the rest of ``argv``."""
    command, rest = argv[0], list(argv[1:])
    if command == "show":
        return _show(_show_parser(prog).parse_args(rest))
    return _compare(_compare_parser(prog).parse_args(rest))
