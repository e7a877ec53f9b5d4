"""``layerprof SPEC [options]``: parse, build the model and its inputs, profile, print and write."""
from __future__ import annotations

import argparse
import contextlib
import io
import os
import sys
import traceback
from typing import Iterator, Sequence

import torch
from torch import nn

from .._torch import fake_mode
from ..metrics import make_meters
from ..profile import Profile
from ..record.fields import FIELDS, canonical
from ..record.untimed import reads_time
from ..render.columns import resolve_columns
from ..render.plot_metrics import backward_only
from ..render.units import format_count, format_counted
from .checkpoint import check_checkpoint_options, plan_and_verify, planned, plot_options
from .errors import EXIT_INTERNAL, EXIT_INTERRUPTED, CLIError, RunError, UsageError, one_line
from .inputs import (InputSpec, check_forward_takes, check_input_names, check_input_sizes, check_input_vocab,
                     make_inputs, parse_dtype, parse_input)
from .outputs import Output, forward_only_mode, missing_meters, requested_outputs, write_outputs
from .parser import build_parser
from .run import autocast_in, autocast_step, metering_meters, run_profile
from .gather import run_gather
from .saved import SUBCOMMANDS, run_saved
from .spec import load_model, parse_kwargs

__all__ = ["main"]


def _device(text: str) -> torch.device:
    try:
        device = torch.device(text)
    except RuntimeError as exc:
        raise UsageError(f"--device {text!r} is not a device: use cpu, cuda, cuda:1, mps...") from exc
    if device.type == "cuda" and not torch.cuda.is_available():
        raise UsageError(f"--device {text}: CUDA is not available here (torch {torch.__version__}, "
                         f"built for CUDA {torch.version.cuda or 'none'}); use --device cpu")
    if device.type == "cuda" and device.index is not None and device.index >= torch.cuda.device_count():
        raise UsageError(f"--device {text}: only {format_counted(torch.cuda.device_count(), 'CUDA device')} here")
    if device.type == "mps" and not (getattr(torch.backends, "mps", None) and torch.backends.mps.is_available()):
        raise UsageError(f"--device {text}: MPS is not available here; use --device cpu")
    return device


def _check_names(options: argparse.Namespace) -> None:
    """Unknown metric or column names fail before the model is built, with the library's message; so does a
    column whose meter ``--metrics`` leaves out, or a backward column of a run with no backward pass (either would
    print "—" for every module)."""
    try:
        if options.metrics is not None:
            make_meters(options.metrics)
        columns = resolve_columns(options.columns) if options.columns is not None else []
    except ValueError as exc:
        raise UsageError(str(exc)) from exc
    missing = missing_meters(options, (meter for column in columns for meter in column.field.meters))
    if missing:
        asked = ",".join([*(options.metrics or ()), *missing])
        raise UsageError(f"--columns {','.join(options.columns)} needs the {' and '.join(missing)} meter: add "
                         f"--metrics {asked}")
    # (every name is declared here: resolve_columns refused any other)
    backward = [name for name in options.columns or () if backward_only(FIELDS[canonical(name) or name])]
    mode = forward_only_mode(options)
    if backward and mode is not None:
        them = "it" if len(backward) == 1 else "them"
        raise UsageError(f"--columns {','.join(options.columns)}: a run with {mode} has no backward pass, so "
                         f"{','.join(backward)} would show nothing on any module; drop {them} or {mode}")


def _headline(spec: str, model: torch.nn.Module, inputs: list[InputSpec], options: argparse.Namespace,
              dtype: torch.dtype | None, device: torch.device, autocast: torch.dtype | None = None) -> str:
    params = sum(p.numel() for p in model.parameters())
    mode = "inference (eval)" if options.eval else ("forward only" if options.no_backward else "forward + backward")
    dtype_name = str(dtype or torch.float32).replace("torch.", "")
    if autocast is not None:
        dtype_name += ", autocast " + str(autocast).replace("torch.", "")
    shown = ", ".join(map(str, inputs))
    shown_params = format_counted(params, "parameter", shown=format_count(params))
    if options.fake or device.type == "meta":
        steps = "1 step counted, not timed" + (" (fake tensors)" if options.fake else "")
    else:
        metering = metering_meters(options.metrics, options.warmup)
        metered = f"1 step counting {' and '.join(metering)} + " if metering else ""
        steps = f"{options.warmup} warm-up + {metered}{format_counted(options.steps, 'step')}"
    return (f"{type(model).__name__} from {spec}: {shown_params} | {device}, {dtype_name} | "
            f"input {shown} | {steps}, {mode}")


@contextlib.contextmanager
def _default_dtype(dtype: torch.dtype | None) -> Iterator[None]:
    """``dtype`` as torch's default float type for the length of the block (nothing for None): a model built in it
    has its float parameters and buffers in it."""
    before = torch.get_default_dtype()
    if dtype is not None:
        torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(before)


def _cast_fake(model: nn.Module, dtype: torch.dtype) -> None:
    """``model.to(dtype)`` for a model of fake tensors, which ``Module.to`` cannot swap: the float parameters and
    buffers that its code made in another dtype than the default it was built under (a float32 buffer or parameter
    made with an explicit dtype) are cast one by one, as ``to`` would cast them."""
    for module in model.modules():
        for tensor in module._parameters.values():
            if tensor is not None and tensor.is_floating_point() and tensor.dtype != dtype:
                tensor.data = tensor.data.to(dtype)
        for name, tensor in module._buffers.items():
            if tensor is not None and tensor.is_floating_point() and tensor.dtype != dtype:
                module._buffers[name] = tensor.to(dtype)


def _timed(name: str) -> bool:
    """Whether the column or plot metric ``name`` (a declared one) reads a measured time: a time, a rate over one
    (FLOP/s, bandwidth), a share of the step's time, the roofline's efficiency."""
    declared = FIELDS.get(canonical(name) or name)
    return declared is not None and reads_time(declared)


# What a run on the meta device or fake tensors counts where --metrics is not given: without it the timing meter alone
# would run, and show nothing but the parameters of the headline.
UNTIMED_METRICS = ("flops", "params", "memory")


def _check_untimed(options: argparse.Namespace) -> None:
    """On the meta device or fake tensors, before the model is built: what needs a measured time is a usage error
    (it would print "—" on every module, or find nothing to plot or plan)."""
    if options.fake and str(options.device).startswith("meta"):
        raise UsageError("--fake with --device meta: meta tensors hold no data already; give one of the two (--fake "
                         "on a real device for models that read tensor values)")
    flag = "--fake" if options.fake else "--device meta"
    why = f"{flag} counts and does not time (its ops compute nothing)"
    timed = [name for name in options.columns or () if _timed(name)]
    if timed:
        raise UsageError(f"--columns {','.join(options.columns)}: {why}, so {','.join(timed)} would show nothing; "
                         "show counted columns, such as --columns flops,params,saved_bytes")
    if planned(options):
        raise UsageError(f"{why}, and a checkpoint plan prices recomputation by time: plan on a device")
    if options.plot and (options.plot_kind == "roofline" or _timed(options.plot_metric)):
        what = "--plot-kind roofline" if options.plot_kind == "roofline" else f"--plot-metric {options.plot_metric}"
        raise UsageError(f"{what}: {why}; plot a counted figure, such as --plot-metric flops")


def _measure_roofs_if_saved(profile: Profile, options: argparse.Namespace, outputs: list[Output]) -> None:
    """Measure the machine's roofs now (under a second) when a profile with FLOPs is saved, so the file holds those
    of the machine it ran on: else whoever reads it measures their own (``layerprof show`` elsewhere), or finds
    none (a CUDA profile read without a GPU), and the roofline columns of the file are of the wrong machine."""
    if "flops" in (options.metrics or ()) and any(output.flag == "json" for output in outputs):
        profile.peaks()


def _run(options: argparse.Namespace) -> int:
    inputs = [parse_input(text) for text in options.input]
    if not inputs:
        raise UsageError("give the model's input shape, e.g. --input 2,3,224,224 (repeat for several inputs)")
    check_input_names(inputs)
    check_input_vocab(inputs, options.vocab)
    kwargs = parse_kwargs(options.kwargs)
    dtype = parse_dtype(options.dtype, "--dtype") if options.dtype else None
    if dtype is not None and not dtype.is_floating_point:
        raise UsageError(f"--dtype {options.dtype}: the model's dtype must be a floating type such as bfloat16")
    if dtype is not None and dtype.itemsize == 1:
        # float8 stores tensors: its matmuls need scales (torch._scaled_mm, torchao), a cast model's layers have none.
        raise UsageError(f"--dtype {options.dtype}: a model cannot compute in a float8 type; give float32, bfloat16 "
                         f"or float16 (a model that casts inside its forward takes --input SHAPE:{options.dtype})")
    device = _device(options.device)
    autocast = autocast_in(options.autocast, dtype, device) if options.autocast else None
    precision = autocast_step(device, autocast)
    untimed = options.fake or device.type == "meta"
    check_input_sizes(inputs, dtype or torch.float32, device)
    if untimed:
        _check_untimed(options)
        if options.metrics is None:  # (timing alone would count nothing: the run is for its counts)
            options.metrics = list(UNTIMED_METRICS)
    check_checkpoint_options(options)
    _check_names(options)
    outputs = requested_outputs(options)
    if options.threads:
        torch.set_num_threads(options.threads)
    torch.manual_seed(options.seed)

    # On meta (or fake tensors, the model and its whole run), built there: a model that does not fit in memory is
    # never allocated (a 7B model is 27 GB in float32).
    with fake_mode() if options.fake else contextlib.nullcontext():
        if options.fake:  # (a fake model cannot move: Module.to cannot swap fake parameters; built where it runs)
            with torch.device(device), _default_dtype(dtype):
                model = load_model(options.spec, kwargs)
        else:
            with torch.device("meta") if device.type == "meta" else contextlib.nullcontext():
                model = load_model(options.spec, kwargs)
        check_forward_takes(model, inputs)
        try:
            if not options.fake:
                model.to(device=device, dtype=dtype)
            elif dtype is not None:
                _cast_fake(model, dtype)
        except Exception as exc:
            target = f"{device} {options.dtype}" if dtype else str(device)
            raise RunError(f"moving the model to {target} raised {one_line(exc)}") from exc
        args, named = make_inputs(inputs, float_dtype=dtype or torch.float32, vocab=options.vocab, device=device)
        print(_headline(options.spec, model, inputs, options, dtype, device, autocast), flush=True)
        # No times to warm up or average: one step counts everything.
        profile = run_profile(model, args, named, steps=1 if untimed else options.steps,
                              warmup=0 if untimed else options.warmup, backward=not options.no_backward,
                              inference=options.eval, metrics=options.metrics, sync=options.sync, untimed=untimed,
                              precision=precision)
    print(profile.layerwise_summary(columns=options.columns, depth=options.depth), flush=True)
    if planned(options):
        print(plan_and_verify(profile, model, args, named, options, precision), flush=True)
    _measure_roofs_if_saved(profile, options, outputs)
    for path in write_outputs(profile, outputs, options.plot_kind, options.plot_metric, **plot_options(options)):
        print(f"layerprof: wrote {path}", file=sys.stderr)
    return 0


class _Stdout(io.TextIOBase):
    """stdout for a reader that may leave early (``layerprof ... | head``): once the pipe is closed, what is
    printed is dropped and the command goes on, so the files asked for are still written and ``compare``'s gate
    still decides the exit status (a BrokenPipeError would end the run as an internal error)."""

    def __init__(self, stream: io.TextIOBase) -> None:
        super().__init__()
        self._stream = stream
        self._gone = False

    def write(self, text: str) -> int:
        self._forward("write", text)
        return len(text)

    def flush(self) -> None:
        self._forward("flush")

    # What callers ask of a terminal (the progress bar shows only on one) is the stream's.
    def isatty(self) -> bool:
        return not self._gone and self._stream.isatty()

    def fileno(self) -> int:
        return self._stream.fileno()

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return self._stream.encoding

    def _forward(self, method: str, *args: str) -> None:
        if self._gone:
            return
        try:
            getattr(self._stream, method)(*args)
        except BrokenPipeError:
            self._gone = True
            self._silence()

    def _silence(self) -> None:
        # What the closed pipe left in the stream's buffer would raise again when Python flushes it at exit.
        with contextlib.suppress(OSError, ValueError, io.UnsupportedOperation):
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, self._stream.fileno())
            os.close(devnull)


@contextlib.contextmanager
def _stdout_reader_may_leave() -> Iterator[None]:
    stdout = sys.stdout
    sys.stdout = _Stdout(stdout)
    try:
        yield
    finally:
        sys.stdout = stdout


def main(argv: Sequence[str] | None = None, prog: str = "layerprof") -> int:
    """Entry point of ``layerprof`` and ``python -m layerprof``; returns the exit status.

    ``layerprof show PROFILE.json`` and ``layerprof compare A.json B.json`` work on saved profiles (``saved.py``),
    ``layerprof gather RANK_FILE...`` on a distributed job's per-rank files (``gather.py``).
    Each kind of failure has its own exit status (``errors.py``: 1 slower, 2 usage, 3 unreadable profile,
    4 different models, 5 run failed, 70 internal error). Errors are one line on stderr, with the traceback above
    it only under ``--debug`` (accepted by every subcommand).
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in argv
    with _stdout_reader_may_leave():
        return _main(argv, prog, debug)


def _main(argv: list[str], prog: str, debug: bool) -> int:
    try:
        if argv and argv[0] in SUBCOMMANDS:  # a SPEC always has a ':', so these names are free
            return run_saved(argv, prog)
        if argv and argv[0] == "gather":
            return run_gather(argv[1:], prog)
        options = build_parser(prog).parse_args(argv)
        return _run(options)
    except CLIError as exc:
        if debug:
            traceback.print_exc()
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except Exception as exc:  # a bug of layerprof itself: still one line, the traceback with --debug
        if debug:
            traceback.print_exc()
        print(f"{prog}: internal error: {type(exc).__name__}: {exc} (rerun with --debug for the traceback)",
              file=sys.stderr)
        return EXIT_INTERNAL
