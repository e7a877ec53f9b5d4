"""``layerprof show PROFILE.json`` and ``layerprof compare A.json B.json``: the command on saved profiles.

``show`` renders a profile written by ``prof.to_json(path)`` or ``layerprof SPEC --json PATH`` (the annotated
summary, and any of the files ``layerprof SPEC`` writes). ``compare`` prints the comparison of two and, with
``--fail-if-slower PCT``, gates on performance (``render/gate.py``): exit 1 when B's median step is more than
PCT % above A's and beyond the noise of both, 4 when the two are profiles of different models or were measured
otherwise (another device, dtype or thread count).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Sequence

from .._machine import environment_in
from ..metrics.roofline import ROOFLINE_FIELDS
from ..plan.candidates import require_figures
from ..profile import Profile, compare, load
from ..render.gate import (MAX_SHARE, MIN_MODULE_STEPS, MIN_SHARE, PASSES, Gate, different_machines,
                           different_models, different_settings, settings_that_differ)
from ..record.fields import Field, stored_fields
from ..record.records import preorder
from ..record.roofs import no_roofs_reason
from ..record.untimed import untimed_in
from ..render.columns import resolve_columns
from ..render.plot_metrics import resolve_metric
from .checkpoint import check_budget_options, plan_lines, planned, plot_options
from .errors import EXIT_OK, EXIT_SLOWER, NotComparable, UnreadableInput, UsageError, one_line
from .outputs import COMPARE_METHODS, requested_outputs, write_outputs
from .parser import (_Parser, _depth, _names, add_checkpoint_options, add_common_options, add_output_options,
                     nonnegative, number_pair)

__all__ = ["SUBCOMMANDS", "load_profile", "run_saved"]

SUBCOMMANDS = ("show", "compare")

_GATE_HELP = f"""\
the gate (--fail-if-slower PCT):
  Each profile is a distribution over its recorded steps. B fails when its median step is more than PCT %
  above A's and the two stand apart: B's fastest step is slower than A's 95th percentile step. A single
  slow step moves neither. With --per-module the same test runs on every module taking {MIN_SHARE:g} to
  {MAX_SHARE:g} % of the model's time, judged against the rest of the model (profiles of at least
  {MIN_MODULE_STEPS} steps); the failing line names the modules that got slower. Profile 20 steps or more.

exit status:
  0 ok, 1 B is slower, 2 usage error, 3 a profile is missing or unreadable, 4 the two profiles are of
  different models (another root type, under half the modules alike, another batch size or input shape) or
  were measured otherwise (another device, dtype, thread count or torch.autocast, forward only against forward
  and backward, a step timed with meters that slow it against one without), 70 internal error
"""


def _show_parser(prog: str) -> argparse.ArgumentParser:
    parser = _Parser(prog=f"{prog} show", description="Render a saved profile (a layerprof JSON file).")
    parser.add_argument("profile", metavar="PROFILE.json", help="written by prof.to_json(path) or --json PATH")
    parser.add_argument("--depth", type=_depth, default=2, metavar="N",
                        help="expand modules down to this depth, root = 0; 'all' for every level (default 2)")
    parser.add_argument("--columns", type=_names, metavar="A,B",
                        help="columns of the annotated tree (the names: layerprof --help)")
    parser.add_argument("--peaks", type=number_pair("FLOPS,BANDWIDTH in FLOP/s and bytes/s", "989e12,3.35e12"),
                        metavar="FLOPS,BANDWIDTH",
                        help="the roofs of the machine that measured the profile, in FLOP/s and bytes/s (e.g. "
                             "989e12,3.35e12), for the roofline of a file saved without them elsewhere")
    add_checkpoint_options(parser, "and print the plan (a saved profile has no model to verify it on: run "
                                   "layerprof SPEC --checkpoint-budget for that)",
                           "needs a profile saved from a run with --metrics live_memory (CPU) or memory (CUDA)")
    add_output_options(parser)
    add_common_options(parser)
    return parser


def _compare_parser(prog: str) -> argparse.ArgumentParser:
    parser = _Parser(prog=f"{prog} compare", epilog=_GATE_HELP, formatter_class=argparse.RawDescriptionHelpFormatter,
                     description="Compare two saved profiles; with --fail-if-slower, a performance gate for CI.")
    parser.add_argument("a", metavar="A.json", help="the reference profile")
    parser.add_argument("b", metavar="B.json", help="the profile compared with it")
    parser.add_argument("--by", choices=PASSES, default="total",
                        help="the time --fail-if-slower checks (default total)")
    parser.add_argument("--fail-if-slower", type=nonnegative("percentage", "10"), metavar="PCT",
                        help="exit 1 when B's median step is more than PCT %% above A's, beyond the noise")
    parser.add_argument("--per-module", action="store_true",
                        help="with --fail-if-slower, also fail when any module is slower by the same test")
    for flag, what in (("csv", "CSV (raw numbers)"), ("markdown", "a Markdown table"),
                       ("latex", "a booktabs LaTeX table")):
        parser.add_argument(f"--{flag}", metavar="PATH", help=f"write the model-level comparison as {what}")
    add_common_options(parser)
    return parser


def load_profile(path: str, what: str) -> Profile:
    """The profile saved at ``path``; ``what`` names the argument in the error of a file that is not one."""
    if not Path(path).is_file():
        if Path(path).is_dir():
            raise UnreadableInput(f"{what} {path!r} is a folder, not a profile file")
        raise UnreadableInput(f"{what} {path!r}: no such file")
    try:
        return load(path)
    except (ValueError, KeyError, TypeError) as exc:
        raise UnreadableInput(f"{what} {path!r} is not a layerprof profile: {one_line(exc)}") from exc
    except OSError as exc:
        raise UnreadableInput(f"{what} {path!r} cannot be read: {exc.strerror or one_line(exc)}") from exc


def _show(options: argparse.Namespace) -> int:
    outputs = requested_outputs(options)
    check_budget_options(options)
    profile = load_profile(options.profile, "PROFILE")
    if options.peaks is not None:
        flops, bandwidth = options.peaks
        profile.meta["peaks"] = {"flops": flops, "bandwidth": bandwidth, "source": "given"}
    # What the profile must hold for what was asked is checked before anything is printed: a usage error after
    # the whole summary reads as a run that half worked.
    if options.plot is not None:
        _check_plot_figures(profile, options)
    try:
        columns = resolve_columns(options.columns, root=profile.tree) if options.columns is not None else []
    except ValueError as exc:  # an unknown name: the message lists the profile's columns
        raise UsageError(str(exc)) from None
    _check_column_figures(profile, options, [column.field for column in columns])
    plan = None
    if planned(options):
        try:
            plan = plan_lines(profile, options)[1]
        except ValueError as exc:  # a profile without the memory meter's figures (or, for a peak, the timeline)
            flag, metric = (("--checkpoint-budget", "memory") if options.checkpoint_peak is None
                            else ("--checkpoint-peak", "live_memory"))
            shell = ("" if untimed_in(profile.meta) is not None else  # (its advice is a device's run already)
                     f" (from the shell: layerprof SPEC --metrics {metric} --json PATH)")
            raise UsageError(f"{flag}: {one_line(exc)}{shell}") from None
    try:
        print(profile.layerwise_summary(columns=options.columns, depth=options.depth), flush=True)
    except ValueError as exc:
        raise UsageError(str(exc)) from exc
    if plan is not None:
        print("\n".join(plan), flush=True)
    for path in write_outputs(profile, outputs, options.plot_kind, options.plot_metric, **plot_options(options)):
        print(f"layerprof: wrote {path}", file=sys.stderr)
    return EXIT_OK


def _recorded(profile: Profile, meter: str) -> bool:
    """Whether the saved profile holds figures of ``meter``: some record has one of its fields."""
    names = [field.name for field in stored_fields() if field.meter == meter]
    return any(getattr(record, name, None) is not None for record in preorder(profile.tree) for name in names)


def _check_plot_figures(profile: Profile, options: argparse.Namespace) -> None:
    if options.plot_kind == "checkpoint":
        try:
            require_figures(profile.tree)
        except ValueError as exc:
            raise UsageError(f"--plot-kind checkpoint: {options.profile!r} was saved without the memory meter's "
                             "figures, which the frontier of checkpoint plans is drawn from: profile with --metrics "
                             "memory --json PATH") from exc
        return
    if options.plot_kind == "roofline":
        if not _recorded(profile, "flops"):
            raise UsageError(f"--plot-kind roofline: {options.profile!r} was saved without the flops meter's "
                             "figures (FLOPs and bytes): profile with --metrics flops --json PATH")
        _check_roofs(profile, options, "--plot-kind roofline")
        return
    try:
        resolve_metric(options.plot_metric, profile.tree)
    except ValueError as exc:
        if profile.meta.get("steps") == 0:  # (not the option's fault: the file holds no step)
            raise UnreadableInput(f"--plot: {options.profile!r} recorded no step, so it holds no "
                                  f"{options.plot_metric!r} figure to plot: profile at least one step") from None
        raise UsageError(f"--plot-metric: {exc}") from None


def _check_column_figures(profile: Profile, options: argparse.Namespace, fields: list[Field]) -> None:
    """A column whose meter left no figure in the profile would print "—" for every module."""
    missing = [meter for meter in dict.fromkeys(m for field in fields for m in field.meters)
               if not _recorded(profile, meter)]
    if missing:
        raise UsageError(f"--columns {','.join(options.columns)}: {options.profile!r} was saved without the "
                         f"{' and '.join(missing)} meter's figures: profile with --metrics {','.join(missing)} "
                         "--json PATH")
    if any(field.name in ROOFLINE_FIELDS for field in fields):
        _check_roofs(profile, options, f"--columns {','.join(options.columns)}")


def _check_roofs(profile: Profile, options: argparse.Namespace, asked: str) -> None:
    """Roofline figures need the roofs of the machine that measured the profile (``Profile.peaks``)."""
    try:
        roofs = profile.peaks()
    except (RuntimeError, ValueError, TypeError) as exc:  # measured here, and the measurement failed
        raise UsageError(f"{asked}: {options.profile!r} holds no roofs, and this machine's could not be measured "
                         f"for it ({one_line(exc)}). Give them with --peaks FLOPS,BANDWIDTH (FLOP/s, bytes/s)") from exc
    if roofs is None:
        why = no_roofs_reason(environment_in(profile.meta))
        raise UsageError(f"{asked}: {options.profile!r} holds no roofs: {why}. Give that machine's roofs with "
                         "--peaks FLOPS,BANDWIDTH (FLOP/s, bytes/s: its spec sheet, or layerprof.peaks() run there)")


def _alike_options(a: Profile, b: Profile) -> str:
    """The options a gate's two runs need alike: ``--autocast`` named among them where the runs' autocast differs
    (``layerprof SPEC --autocast bf16``), a script's torch.autocast beside it."""
    if "autocast" in settings_that_differ(a, b):
        return "--device, --dtype, --threads and --autocast (or none; in a script, the same torch.autocast)"
    return "--device, --dtype and --threads, under the same torch.autocast (or none)"


def _compare(options: argparse.Namespace) -> int:
    if options.per_module and options.fail_if_slower is None:
        raise UsageError("--per-module applies the --fail-if-slower limit to each module: give --fail-if-slower PCT")
    if options.by != "total" and options.fail_if_slower is None:  # (the comparison printed is the same by any)
        raise UsageError(f"--by {options.by} chooses the time the --fail-if-slower limit checks: give "
                         "--fail-if-slower PCT")
    outputs = requested_outputs(options, COMPARE_METHODS)
    a, b = load_profile(options.a, "A"), load_profile(options.b, "B")
    comparison = compare(a, b, names=("A", "B"))
    print(comparison, flush=True)
    # (written before the gate's verdict: a failed gate is when the tables are read)
    for path in write_outputs(comparison, outputs):
        print(f"layerprof: wrote {path}", file=sys.stderr)
    if options.fail_if_slower is None:
        return EXIT_OK
    for name, path, profile in (("A", options.a, a), ("B", options.b, b)):
        if profile.meta.get("steps") == 0:  # (not "forward only", nor "no total time": nothing was timed)
            raise UnreadableInput(f"--fail-if-slower: profile {name} ({str(path)!r}) recorded no step, so it holds "
                                  "no time to gate on: profile at least one step (the model called inside the "
                                  "block, past any warm-up)")
    why = different_models(a, b)
    if why is not None:
        raise NotComparable(f"--fail-if-slower: A and B are not profiles of the same model ({why}); a gate "
                            "compares one model before and after a change. Without --fail-if-slower the "
                            "comparison is printed")
    why = different_settings(a, b)
    if why is not None:
        raise NotComparable(f"--fail-if-slower: A and B were not measured the same way ({why}); a gate compares "
                            f"two runs made alike: profile both with the same {_alike_options(a, b)}, both with "
                            "backward or both without, and with the same --metrics over several steps. "
                            "Without --fail-if-slower the comparison is printed")
    machines = different_machines(a, b)
    if machines is not None:
        print(f"layerprof: note: {machines}; the verdict below holds that difference too: keep the reference "
              "profile of the machine the gate runs on", file=sys.stderr)
    try:
        gate = Gate(a, b, options.fail_if_slower, options.by)
    except ValueError as exc:
        raise UnreadableInput(f"--fail-if-slower: {exc}") from exc
    steps = min(gate.model.a.steps, gate.model.b.steps)
    if options.per_module and steps < MIN_MODULE_STEPS:
        raise UsageError(f"--per-module needs at least {MIN_MODULE_STEPS} recorded steps in each profile, and "
                         f"{'A' if gate.model.a.steps == steps else 'B'} has {steps}: with fewer, some of the "
                         "dozens of modules judged stand apart by chance. Profile with --steps 20")
    print(f"layerprof compare: {gate.line(options.per_module)}", file=sys.stderr)
    return EXIT_SLOWER if gate.failed(options.per_module) else EXIT_OK


def run_saved(argv: Sequence[str], prog: str = "layerprof") -> int:
    """Run ``show`` or ``compare`` (``argv[0]``) with the rest of ``argv``."""
    command, rest = argv[0], list(argv[1:])
    if command == "show":
        return _show(_show_parser(prog).parse_args(rest))
    return _compare(_compare_parser(prog).parse_args(rest))
