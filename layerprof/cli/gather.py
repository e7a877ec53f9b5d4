"""``layerprof gather RANK_FILE...``: the cross-rank view of a torch.distributed job from its per-rank saved
profiles, what ``layerprof.gather_saved`` makes in Python, after the run and on any machine.

Each file saved under a process group knows its rank and the job's size; one saved outside a group (or by an
earlier layerprof) is given as ``RANK=PATH``. ``--fail-on-stragglers`` makes it a check for a CI job or a
launcher's epilogue: exit 1 when a rank is slower than the median on the whole step by the margin.
"""
from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path
from typing import Sequence

from ..distributed.gather import GatheredProfile, gathered_from_saved
from .errors import EXIT_OK, EXIT_SLOWER, UnreadableInput, UsageError
from .outputs import check_writable
from .parser import _Parser, _depth, add_common_options, nonnegative
from .saved import load_profile

__all__ = ["gather_parser", "run_gather"]

_RANKED = re.compile(r"(\d+)=(.+)", re.DOTALL)  # RANK=PATH (a path of digits then '=' is given as ./12=a.json)

_EPILOG = """\
exit status:
  0 the view was printed (and, with --fail-on-stragglers, no rank is a straggler), 1 --fail-on-stragglers found
  a straggler rank or a rank of the job without a profile, 2 usage error (a rank given twice, files of jobs of
  different sizes, a bad option), 3 a file is missing, unreadable or not a layerprof profile, 70 internal error
"""


def gather_parser(prog: str) -> argparse.ArgumentParser:
    parser = _Parser(prog=f"{prog} gather", epilog=_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter,
                     description="The cross-rank view of a distributed job from its per-rank saved profiles: per "
                                 "module the min, median and max over ranks, the slowest rank and the stragglers.")
    parser.add_argument("files", nargs="+", metavar="RANK_FILE",
                        help="a per-rank profile (prof.to_json(path) or layerprof SPEC --json PATH on each rank); "
                             "RANK=PATH for a file saved outside a process group, which holds no rank")
    parser.add_argument("--margin", type=nonnegative("fraction", "0.2"), default=0.2, metavar="FRACTION",
                        help="a straggler is slower than the median by more than this fraction (default 0.2) ...")
    parser.add_argument("--min-ms", type=nonnegative("number of milliseconds", "5"), metavar="MS",
                        help="... and by more than this many ms (default: 1 %% of the median step)")
    parser.add_argument("--depth", type=_depth, default=None, metavar="N",
                        help="show modules down to this depth, root = 0 (default: every level)")
    parser.add_argument("--csv", metavar="PATH", help="write the rows (min, median, max, slowest rank) as CSV")
    parser.add_argument("--markdown", metavar="PATH", help="write the rows as a Markdown table")
    parser.add_argument("--fail-on-stragglers", action="store_true",
                        help="exit 1 when a rank is a straggler on the whole step, or has no profile")
    add_common_options(parser)
    return parser


def _ranked(text: str) -> tuple[int | None, str]:
    """``(rank, path)`` of a ``RANK=PATH`` argument, ``(None, text)`` of a plain path."""
    match = _RANKED.fullmatch(text)
    if match is None or Path(text).exists():  # (a file really named "1=x.json" is read as that file)
        return None, text
    return int(match.group(1)), match.group(2)


def run_gather(argv: Sequence[str], prog: str = "layerprof") -> int:
    options = gather_parser(prog).parse_args(list(argv))
    for flag in ("csv", "markdown"):
        path = getattr(options, flag)
        if path is not None:
            check_writable(flag, Path(path))
    given = list(map(_ranked, options.files))
    triples = [(rank, repr(path), load_profile(path, "RANK_FILE")) for rank, path in given]
    try:
        gathered = gathered_from_saved(triples, margin=options.margin, min_ms=options.min_ms)
    except ValueError as exc:  # a rank given twice, jobs of different sizes, a rank the files cannot place
        raise UsageError(str(exc)) from None
    except RuntimeError as exc:  # no file holds a recorded step
        raise UnreadableInput(str(exc)) from None
    print(gathered.table(depth=options.depth), flush=True)
    table = gathered.to_table()
    if options.csv is not None:
        table.to_csv(options.csv)
        print(f"layerprof: wrote {options.csv}", file=sys.stderr)
    if options.markdown is not None:
        table.to_markdown(options.markdown)
        print(f"layerprof: wrote {options.markdown}", file=sys.stderr)
    return _verdict(gathered, options.fail_on_stragglers)


def _verdict(gathered: GatheredProfile, failing: bool) -> int:
    stragglers = gathered.straggler_ranks
    if not failing:
        return EXIT_OK
    if gathered.failed_ranks:  # a rank the view lacks may be the slow one: the check cannot pass without it
        shown = "; ".join(f"rank {rank}: {why}" for rank, why in gathered.failed_ranks.items())
        print(f"layerprof gather: {len(gathered.failed_ranks)} of {gathered.world_size} ranks have no profile to "
              f"compare ({shown}): give every rank's file", file=sys.stderr)
        return EXIT_SLOWER
    if stragglers:
        shown = ", ".join(map(str, stragglers))
        print(f"layerprof gather: rank{'s' if len(stragglers) > 1 else ''} {shown} slower than the median step by "
              f"more than {gathered.margin:g} and {gathered.min_ms:.3g} ms", file=sys.stderr)
        return EXIT_SLOWER
    print(f"layerprof gather: no straggler among {len(gathered.ranks)} ranks", file=sys.stderr)
    return EXIT_OK
