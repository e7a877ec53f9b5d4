"""The ``layerprof`` argument parser (argparse only)."""
from __future__ import annotations

import argparse
import math
from typing import Callable, NoReturn

from .._version import __version__
from .errors import UsageError
from .names import names_help

__all__ = ["build_parser", "nonnegative", "add_checkpoint_options", "add_common_options", "add_output_options",
           "EPILOG", "USAGE"]

# The four forms of the command; each subcommand's --help lists its own options.
USAGE = """\
%(prog)s SPEC --input SHAPE [options]
       %(prog)s show PROFILE.json [options]
       %(prog)s compare A.json B.json [options]
       %(prog)s gather RANK_FILE [RANK_FILE ...] [options]"""

EPILOG = """\
examples:
  layerprof torchvision.models:resnet18 --input 2,3,224,224
      ResNet-18, 1 warm-up + 3 training steps (forward + backward), the annotated tree to depth 2
  layerprof torchvision.models:vit_b_16 --input 8,3,224,224 --eval --device cuda --dtype bfloat16 --depth 3
      inference only (eval + inference_mode) on the GPU in bfloat16
  layerprof my_models.py:TinyLM --kwargs '{"vocab": 1000}' --input 4,128:int64 --vocab 1000 --steps 10
      a model from a file, built with keyword arguments, fed random token ids in [0, 1000)
  layerprof show resnet.json --depth 3 --report resnet.html
      render a saved profile (written with --json PATH or prof.to_json(path))
  layerprof compare before.json after.json --fail-if-slower 10
      compare two saved profiles; exit 1 when after's median step is more than 10 % above before's, beyond the
      noise of both (see layerprof compare --help for the gate)
  layerprof gather train-rank0.json train-rank1.json --fail-on-stragglers
      the cross-rank view of a distributed job's per-rank files; exit 1 when a rank is a straggler

exit status:
  0 ok, 1 compare found B slower (gather --fail-on-stragglers: a straggler rank), 2 usage error, 3 a profile is
  missing or unreadable, 4 compare was given profiles of two different models or measured otherwise (device,
  dtype, threads, autocast), 5 the run failed (the model, its factory or an export raised), 70 internal error (a
  bug of layerprof: rerun with --debug), 130 interrupted
"""


class _Parser(argparse.ArgumentParser):
    """argparse, but its errors are one line, like every other error of the command."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{message} (see {self.prog} --help)")


def _depth(text: str) -> int | None:
    if text.lower() in ("all", "none", "-1"):
        return None
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"expected a depth >= 0 or 'all', got {text!r}")
    return int(text)


_MOST = 2**63 - 1  # what torch takes as an integer (a seed, a thread count, a sampling bound)


def _count(minimum: int, most: int = _MOST) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"expected an integer >= {minimum}, got {value}")
        if value > most:
            raise argparse.ArgumentTypeError(f"expected an integer <= {most}, got {value}")
        return value
    parse.__name__ = "integer"
    return parse


def nonnegative(what: str, example: str) -> Callable[[str], float]:
    """An argparse type: a finite number >= 0, refused naming ``what`` it is and an ``example``."""
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a {what} such as {example}, got {text!r}") from None
        if not math.isfinite(value) or value < 0:
            raise argparse.ArgumentTypeError(f"expected a finite {what} >= 0 such as {example}, got {text!r}")
        return value

    return parse


def _names(text: str) -> list[str]:
    return [name.strip() for name in text.split(",") if name.strip()]


# What --plot draws when not told: an option set otherwise without --plot is refused (``outputs``).
PLOT_DEFAULTS = {"plot_kind": "sunburst", "plot_metric": "total"}


def add_output_options(group: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    """The ``--csv/--json/--html/--trace/--speedscope/--report/--plot`` options (``layerprof SPEC`` and ``show``)."""
    for flag, what in (("csv", "a CSV table"), ("json", "JSON"), ("html", "an HTML table"),
                       ("trace", "a Chrome/Perfetto trace"), ("speedscope", "a speedscope file"),
                       ("report", "an interactive HTML report (icicle, table, timeline)")):
        group.add_argument(f"--{flag}", metavar="PATH", help=f"write the profile as {what}")
    group.add_argument("--plot", metavar="PATH", help="write a figure of the profile (see --plot-kind)")
    group.add_argument("--plot-kind", choices=("sunburst", "icicle", "top", "roofline", "checkpoint"),
                       default=PLOT_DEFAULTS["plot_kind"], help="the figure --plot draws (default sunburst)")
    group.add_argument("--plot-metric", default=PLOT_DEFAULTS["plot_metric"], metavar="NAME",
                       help="the quantity --plot shows (default total)")


def build_parser(prog: str | None = None) -> argparse.ArgumentParser:
    """The parser of ``layerprof SPEC [options]``."""
    parser = _Parser(
        prog=prog or "layerprof",
        description="Profile a PyTorch model module by module: forward and backward time of every module, "
                    "printed as the model's repr annotated with its costs.",
        usage=USAGE,
        epilog=EPILOG + "\n" + names_help(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("spec", metavar="SPEC",
                        help="the model: package.module:callable or path/to/file.py:callable, a class or "
                             "factory that returns an nn.Module (e.g. torchvision.models:resnet18)")
    parser.add_argument("--kwargs", metavar="JSON", help="keyword arguments for the callable, a JSON object")
    model = parser.add_argument_group("inputs and run")
    model.add_argument("--input", "-i", action="append", default=[], metavar="[NAME=]SHAPE[:DTYPE]",
                       help="a random input of that shape, e.g. 2,3,224,224 or 2,32:int64 (repeat for several "
                            "positional inputs; NAME= passes it as a keyword). Floats are randn, integers "
                            "uniform in [0, --vocab)")
    model.add_argument("--vocab", type=_count(1), default=100, metavar="N",
                       help="integer inputs are drawn from [0, N) (default 100)")
    model.add_argument("--warmup", type=_count(0), default=1, metavar="N", help="unrecorded first steps (default 1)")
    model.add_argument("--steps", type=_count(1), default=3, metavar="N", help="recorded steps (default 3)")
    model.add_argument("--no-backward", action="store_true",
                       help="forward only, the model in training mode (dropout, batch statistics)")
    model.add_argument("--eval", action="store_true", help="inference: model.eval() and torch.inference_mode()")
    model.add_argument("--device", default="cpu", help="cpu, cuda, cuda:1, mps... (default cpu)")
    model.add_argument("--fake", action="store_true",
                       help="count without memory: build the model and its inputs as fake tensors (torch's "
                            "FakeTensorMode) on --device, and run one step that counts FLOPs, bytes, parameters, "
                            "shapes and saved bytes and times nothing (--metrics flops,params,memory unless "
                            "given); for models that --device meta cannot run (Hugging Face's read tensor values)")
    model.add_argument("--dtype", metavar="DTYPE", help="cast the model and float inputs, e.g. bfloat16")
    model.add_argument("--autocast", metavar="DTYPE",
                       help="mixed precision: run each forward under torch.autocast in DTYPE (bfloat16 or float16), "
                            "the model and inputs left float32, backward outside, as a training script does")
    model.add_argument("--threads", type=_count(1, 2**31 - 1), metavar="N", help="torch.set_num_threads(N)")
    model.add_argument("--seed", type=_count(-2**63, 2**64 - 1), default=0,  # (torch.manual_seed's range)
                       help="seed of the model's init and the inputs (default 0)")
    model.add_argument("--metrics", type=_names, metavar="A,B",
                       help="meters beside timing (e.g. flops,params; all names listed below)")
    model.add_argument("--sync", action="store_true",
                       help="on CUDA, synchronize at every module boundary instead of recording events")
    add_checkpoint_options(model, "print the plan and verify it on the model",
                           "profiles with live_memory on the CPU")
    shown = parser.add_argument_group("output")
    shown.add_argument("--depth", type=_depth, default=2, metavar="N",
                       help="expand modules down to this depth, root = 0; 'all' (or -1) for every level (default 2)")
    shown.add_argument("--columns", type=_names, metavar="A,B",
                       help="columns of the annotated tree (default forward,backward; all names listed below)")
    add_output_options(shown)
    add_common_options(shown)
    return parser


def add_checkpoint_options(group: argparse.ArgumentParser | argparse._ArgumentGroup, then: str, peak_needs: str
                           ) -> None:
    """``--checkpoint-budget``, ``--checkpoint-peak`` and ``--allow-side-effects``; ``then``: what is done with the
    plan; ``peak_needs``: what a peak budget needs of the profile."""
    group.add_argument("--checkpoint-budget", metavar="BUDGET",
                       help="plan which modules to recompute so that the memory saved for backward fits BUDGET "
                            f"(50%%, 0.5, 2GiB, bytes), {then}")
    group.add_argument("--checkpoint-peak", metavar="PEAK",
                       help="plan instead so that the step's predicted peak memory fits PEAK (80%%, 0.8 of the "
                            "profiled peak, 2GiB, bytes): the cheapest plan on the saved-bytes frontier that fits; "
                            f"{peak_needs}; {then}")
    group.add_argument("--allow-side-effects", action="store_true",
                       help="with --checkpoint-budget: let the plan recompute modules with side effects (BatchNorm "
                            "in training: its running statistics then move twice a step)")
    group.add_argument("--wrap-cost", type=number_pair("MS_CALL,MS_TENSOR in milliseconds", "0.4,0.012", zero=True),
                       metavar="MS_CALL,MS_TENSOR",
                       help="with a checkpoint plan: the checkpoint wrapper's price, ms per wrapped call and per "
                            "tensor saved inside, instead of measuring it on this machine (a profile from another "
                            "machine: layerprof.plan.wrap_cost.wrap_cost() run there)")


def number_pair(form: str, example: str, zero: bool = False) -> Callable[[str], tuple[float, float]]:
    """An argparse type: two finite numbers given as "A,B" (``form`` says what they are, ``example`` shows two),
    each above 0, or at least 0 where ``zero``."""
    def parse(text: str) -> tuple[float, float]:
        try:
            first, second = (float(part) for part in text.split(","))
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {form} such as {example}, got {text!r}") from None
        if not all((0 <= number if zero else 0 < number) and number < float("inf") for number in (first, second)):
            kind = "finite numbers >= 0" if zero else "positive finite numbers"
            raise argparse.ArgumentTypeError(f"expected two {kind}, got {text!r}")
        return first, second

    return parse


def add_common_options(group: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    """``--debug`` and ``--version``, on the command and on every subcommand."""
    group.add_argument("--debug", action="store_true", help="show the traceback of an error")
    group.add_argument("--version", action="version", version=f"layerprof {__version__}")

