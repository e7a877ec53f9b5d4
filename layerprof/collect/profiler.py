"""LayerProf: puts the tracker's hooks on a model while profiling, and hands back a Profile of records."""
from __future__ import annotations

import functools
import os
import sys
from operator import attrgetter, itemgetter
from typing import Any, Callable, Iterable, TypeVar

import torch
from torch import nn

from . import reuse
from .annotate import Annotator
from .clock import CpuClock, PausableClock
from .._derived import verified
from .._gc import gc_paused
from .._warn import PACKAGE, user_frame, warn_user
from .hook_cost import hook_cost
from .live_op_cost import live_op_cost
from .environment import environment_of, first_parameter, on_input_device, rank_facts, untimed
from .._check import check_bool, check_int
from ..metrics import Meter, make_meters, measures
from ..metrics.meter import meters_needed_since
from ..metrics.peaks import check_peaks
from .._torch import add_module_registration_hook, compiled_module_type, remove_module_registration_hook
from .._torch import calling_around, compiled_around, dynamo_compiled, submodules, torchscript_compiled
from .._torch import unbind_call_wrappers
from ..profile import Profile
from ..record.records import ModuleRecord, module_paths
from .schedule import Action, Schedule, first_recorded
from .statistics import StepStats, drop_times
from .unseen import ran_unseen, unseen_message
from .stepcall import RootStep
from .timing import StepTimes, all_returned, step_times
from .tracker import BATCHES, INPUT_DEVICE, INPUT_FAKE, NOTE_PREFIX, OTHER_DIMS, Tracker, backward_note
from .compiled import RefusedModel, compiled_while_profiling, refuse_compiled_in_place
from .recompute import roll_up_recompute
from .reprs import Reprs, read_reprs, write_reprs

__all__ = ["LayerProf"]

_T = TypeVar("_T")
_first, _second = itemgetter(0), itemgetter(1)
_own, _kind = attrgetter("__dict__"), attrgetter("kind")

# The LayerProfs running now (a dict as an ordered set), each with the modules it hooks in its ``_names`` (keyed by
# id(module): a running profiler holds its modules, ``_entries``, until its teardown takes it out of here, so an id
# cannot be reused while it is a key): two profilers on one module would time each other's hooks. One entry per
# profiler, not per module: a block on ten thousand modules writes and clears no ten thousand keys here.
_PROFILED: dict[LayerProf, None] = {}


def _cancel_in_child() -> None:
    """In a process forked while profiling (a DataLoader's workers, forked as the loop starts): cancel the copies
    of the running profilers. Their records never reach the parent, yet a FLOP meter's dispatch mode would slow
    every op the worker runs (a dataset's transforms), and a profiled module called there (a teacher in
    ``__getitem__``) would keep its calls until the worker exits."""
    for holder in list(_PROFILED):
        try:
            holder.cancel()
        except Exception:  # (CUDA, say, cannot be used in a forked child): at least the copy records nothing
            _PROFILED.pop(holder, None)
            if holder._tracker is not None:
                holder._tracker.active, holder._tracker._token = False, None


if hasattr(os, "register_at_fork"):  # (not on Windows, which spawns)
    os.register_at_fork(after_in_child=_cancel_in_child)


def _fill(tree: ModuleRecord | None, records: dict[str, ModuleRecord], stats: StepStats,
          meters: Iterable[Meter], timed: bool = True) -> None:
    """Write the block's numbers onto its records: the step statistics, recompute rolled up, every meter's.
    Not ``timed`` (a step on the meta device or fake tensors): calls and steps, and no time (``drop_times``)."""
    assert tree is not None
    stats.fill(records)
    if timed:
        roll_up_recompute(records, tree)
    else:
        drop_times(records)
    for meter in meters:
        meter.fill(records)


def _made_later(plan: reuse.Plan, reprs: Reprs, stats: StepStats, meters: tuple[Meter, ...], timed: bool = True
                ) -> tuple[ModuleRecord, dict[str, ModuleRecord]]:
    """The records of a block that made none while it ran, made and filled when its profile is first read: from
    its plan's record shapes, the reprs read as it stopped, its statistics and its meters' numbers."""
    tree, records = plan.records()
    write_reprs(list(records.values()), reprs)
    _fill(tree, records, stats, meters, timed)
    return tree, records


def _step_ms(stats: StepStats) -> dict[str, Any]:
    """The meta's per-step times of the model, for a profile that makes them when its meta is first read."""
    return {"step_ms": stats.step_totals()}


# The classes of the models that passed ``_refuse_model``: nn.Module subclasses that are neither TorchScript nor
# torch.compile's wrapper. What a class is a subclass of does not change (``torch.compile`` wraps a model in an
# instance of its own class, and no class made before dynamo was loaded can derive from dynamo's), so a model of a
# class seen here needs no ``isinstance`` (cold, each one is several microseconds as a block starts right after a
# step: the three took about 20 µs). Bounded, for classes made on the fly.
_PLAIN_MODELS: set[type] = set()


def _check_model(model: Any) -> list[tuple[str, nn.Module]] | None:
    """Refuse what LayerProf cannot profile (with what to do instead); the model's ``module_paths``, or None for a
    model profiled before, whose plan the block's start checks against the model (``reuse.plan_for``)."""
    kind = type(model)
    try:
        seen = kind in _PLAIN_MODELS
    except TypeError:  # a class whose metaclass makes it unhashable: checked every time
        seen = True
        _refuse_model(model)
    if not seen:
        _refuse_model(model)
        if len(_PLAIN_MODELS) >= 1024:
            _PLAIN_MODELS.clear()
        _PLAIN_MODELS.add(kind)
    if reuse.known(model):
        return None
    paths = module_paths(model)
    _check_children(paths, compiled_module_type())
    return paths


def _refuse_model(model: Any) -> None:
    """Raise for a model that is not an eager nn.Module (TorchScript, a torch.compile wrapper, anything else)."""
    if isinstance(model, torch.jit.ScriptModule):
        raise RefusedModel(
            "LayerProf cannot profile a TorchScript module: its submodules' hooks never run. "
            "Profile the eager nn.Module before torch.jit.script/trace."
        )
    compiled = compiled_module_type()
    if compiled is not None and isinstance(model, compiled):
        raise RefusedModel(
            "LayerProf cannot see inside a torch.compile'd module: compiled graphs skip module hooks. "
            "Profile the eager module instead: LayerProf(compiled._orig_mod)."
        )
    if not isinstance(model, nn.Module):
        raise RefusedModel(
            f"LayerProf expects a torch.nn.Module, got {type(model).__module__}.{type(model).__qualname__}")


def _check_children(paths: list[tuple[str, nn.Module]], compiled: type | None) -> None:
    script = torch.jit.ScriptModule
    for name, child in paths:
        if isinstance(child, script):
            raise RefusedModel(
                f"LayerProf cannot profile module '{name}' ({type(child).__name__}): it is TorchScript, whose "
                "submodules' hooks never run. Profile with the eager module in its place (before torch.jit.script/"
                "trace), or profile the parts of the model around it separately."
            )
        if compiled is not None and isinstance(child, compiled):
            raise RefusedModel(
                f"LayerProf cannot see inside module '{name}': it is torch.compile'd, and compiled graphs skip "
                "module hooks, so its modules would show as not run. Profile with the eager module in its place "
                "(the compiled module's ._orig_mod), and compile after profiling."
            )
    refuse_compiled_in_place(paths)


def _modules_in(model: nn.Module) -> list[nn.Module]:
    """Every module reachable from ``model`` (a shared one once per path), without names: a quick walk."""
    found = []
    stack = [model]
    while stack:
        module = stack.pop()
        found.append(module)
        children = submodules(module)
        if children:
            stack.extend(child for child in children.values() if child is not None)
    return found


def _place(started_at: tuple[Any, int] | None) -> str:
    """``at FILE:LINE`` of a code object's instruction at byte offset ``lasti`` (a frame's ``f_lasti``)."""
    if started_at is None:
        return "at ?"
    code, lasti = started_at
    line = next((line for start, end, line in code.co_lines() if start <= lasti < end), None)
    line_text = "?" if line is None else line
    cell = _notebook_cell(code.co_filename)
    return f"at {code.co_filename}:{line_text}" if cell is None else f"at cell {cell}, line {line_text}"


def _notebook_cell(filename: str) -> str | None:
    """``In[3]`` for code run in an IPython cell, as its tracebacks name it: the cell's file is a temporary name
    (``/tmp/ipykernel_.../123.py``) that says nothing to whoever reads the message. IPython is not imported here."""
    ipython = sys.modules.get("IPython")
    shell = getattr(ipython, "get_ipython", lambda: None)()
    name_of = getattr(getattr(shell, "compile", None), "format_code_name", None)
    named = name_of(filename) if name_of is not None else None
    return named[1] if named else None


def example_facts(example: dict[str, Any]) -> dict[str, Any]:
    """The profile's input facts from the tracker's ``example``: the first input's, with the batch size most of the
    root's calls had where they differ (a short first or last batch is not the workload), and ``batch_sizes``, each
    one's count of calls (pairs, in the order first seen); ``input_shape`` only where every call's input had the
    same sizes beyond the batch, else ``input_shape_variants``, how many such sizes the calls had."""
    found = dict(example)
    found.pop(INPUT_DEVICE, None)
    found.pop(INPUT_FAKE, None)
    other = len(found.pop(OTHER_DIMS, ()))
    if other > 1:  # inputs of several shapes beyond the batch: no one shape to name, but how many
        found.pop("input_shape", None)
        found["input_shape_variants"] = other
    batches = found.pop(BATCHES, None)
    if batches and len(batches) > 1:
        found["batch_size"] = max(batches, key=batches.__getitem__)  # (a tie: the first seen)
        found["batch_sizes"] = [[size, count] for size, count in batches.items()]
    return found


# The code of the functions every module call runs through (``Module.__call__`` and torch's ``_call_impl``).
_CALL_CODES = frozenset(
    getattr(vars(nn.Module).get(name), "__code__", None) for name in ("_wrapped_call_impl", "_call_impl")
) - {None}


def _inside_a_module_call() -> bool:
    """Whether a module's call is running on this thread (a frame of torch's call functions is on the stack)."""
    frame: Any = sys._getframe(1)
    while frame is not None:
        if frame.f_code in _CALL_CODES:
            return True
        frame = frame.f_back
    return False


def _shape_counts(example: dict[str, Any]) -> tuple[set[Any], int]:
    """The batch sizes, and how many shapes beyond the batch, the root's calls have had (the tracker's ``example``)."""
    return set(example.get(BATCHES, ())), len(example.get(OTHER_DIMS, ()))


def _other_shapes_later(counted: tuple[set[Any], int], example: dict[str, Any]) -> bool:
    """Whether the root's calls since ``counted`` (``_shape_counts`` then) had shapes beyond the batch the counted
    step's did not, or their most common batch size is not one it had (an epoch's last short batch is not)."""
    batches = example.get(BATCHES) or {}
    common = max(batches, key=batches.__getitem__) if batches else None
    return len(example.get(OTHER_DIMS, ())) > counted[1] or (common is not None and common not in counted[0])


# What a model that reads a tensor's value (``.item()``, ``if mask.all():``) raises on the meta device: torch's
# "Tensor.item() cannot be called on meta tensors", "Cannot copy out of meta tensor"...
_META_READ = (
    "tensors on the meta device hold no values, and the model reads one (.item(), .tolist(), a Python if on a "
    "tensor), so it cannot run there. Fake tensors carry the same shapes and take those reads where the code checks "
    "for them (Hugging Face models do): build the model and its inputs under "
    "torch._subclasses.fake_tensor.FakeTensorMode() and profile there, with the same metrics"
)


def _warn_not_counted(records: dict[str, ModuleRecord], counted_names: frozenset[str], counted: list[str]) -> None:
    """Modules that ran in recorded steps, but not in the one step the counting meters counted: their figures are
    missing (None), and their ancestors' leave them out."""
    names = [name for name, record in records.items() if record.steps_run and name not in counted_names]
    if not names:
        return
    shown = ", ".join("the model" if not name else f"'{name}'" for name in names[:5])
    more = f" and {len(names) - 5} more" if len(names) > 5 else ""
    warn_user(
        f"{len(names)} module(s) ({shown}{more}) ran in recorded steps but not in the first profiled step, the one "
        f"that metrics {counted} count: their figures (FLOPs, bytes, saved bytes) are None, and their ancestors' "
        "leave them out. Make the first profiled step run every module (an auxiliary head, every layer that "
        "stochastic depth or a condition may skip) for figures of each."
    )


def _warn_late_backward(names: list[str]) -> None:
    """Calls whose backward began only after ``prof.step()`` had closed their step (``Tracker.late``)."""
    shown = ", ".join("the model" if not name else f"'{name}'" for name in names[:5])
    more = f" and {len(names) - 5} more" if len(names) > 5 else ""
    warn_user(
        f"layerprof: the backward of {len(names)} module(s) ({shown}{more}) began after prof.step() had ended the "
        "step of their forward, so their backward time is not in the profile. Call prof.step() after "
        "loss.backward() (and the optimizer step), not between a forward and its backward."
    )


def _live_op_ms() -> float | None:
    """``live_op_cost()``, or None where its calibration fails: the figure is left out (nothing taken off a plan's
    prices) rather than the user's plan or save broken."""
    try:
        return live_op_cost()
    except Exception:  # noqa: BLE001 - a missing figure is the fallback for any failure
        return None


def _stop_all(meters: list[Meter]) -> None:
    """Stop every meter, last started first, even when one of them raises (the first error is re-raised)."""
    error: BaseException | None = None
    for meter in reversed(meters):
        try:
            meter.stop()
        except BaseException as raised:  # noqa: BLE001 - re-raised below, after the others are stopped
            error = error or raised
    if error is not None:
        raise error


def _result(method: Callable[..., _T]) -> Callable[..., _T]:
    """A LayerProf method that calls ``method`` on the finished profile (``prof.profile``)."""

    @functools.wraps(method)
    def forwarded(self: LayerProf, *args: Any, **kwargs: Any) -> _T:
        return method(self.profile, *args, **kwargs)

    return forwarded


class LayerProf:
    """Time every module's forward and backward pass, over one step or many.

    >>> import torch
    >>> net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
    >>> with LayerProf(net) as prof:
    ...     net(torch.randn(2, 4)).sum().backward()
    >>> prof.tree.calls, prof.tree.backward_ms > 0
    (1, True)
    >>> sorted(prof.to_dict())
    ['', '0', '1', '2']

    Several steps: call ``prof.step()`` after each; records then hold the mean per step, with the median, std,
    min, max and p95 beside it. Without ``step()``, everything inside the block is one step.

    Args:
        model: the module to profile; every module in ``model.named_modules()`` is hooked.
        sync: on CUDA, synchronize at every boundary and read the wall clock, instead of recording CUDA events
            that are read once per step (the default, which adds no synchronization inside a step).
        metrics: names of meters to run beside timing (see ``layerprof.metrics.METERS``); None: the defaults.
            Meters that slow the step down (``Meter.distorts_timing``) run during the first profiled step only,
            and that step is left out of the timings when other steps were recorded.
        warmup: number of first steps whose times are dropped.
        schedule: a ``layerprof.schedule(wait=, warmup=, active=, repeat=)``: hooks are off in ``wait`` steps and
            after the last cycle, so those steps cost nothing. Exclusive with ``warmup``.
        max_samples: step values kept per module and pass for the median and p95 (the memory bound).
        annotate: open a ``torch.profiler.record_function`` range (and NVTX on CUDA) named after the module
            around each forward call and backward interval, for torch.profiler traces and Nsight Systems.
        peaks: the machine's roofs for the roofline fields, ``{"flops": FLOP/s, "bandwidth": bytes/s}`` (a spec
            sheet's); kept in ``meta["peaks"]``. None: measured by ``layerprof.peaks()`` when first needed.
    """

    # State that starts as these defaults, read from the class until a block sets it on the instance: a one-shot
    # block writes 26 attributes on its LayerProf, not 31. Past 30, CPython (3.11) moves an instance's attributes
    # from the compact values that share their class's keys into a dict of its own (made, filled and freed per
    # block): the defaults here took about 20 µs off a one-shot block, cold right after a step.
    # The block's records, made from its plan only when something reads them while it runs (a meter that is not
    # ``deferrable``, a module that joins): else the profile makes them when it is first read.
    _tree: ModuleRecord | None = None
    _records: dict[str, ModuleRecord] | None = None
    _counting_step: dict[str, StepTimes] | None = None
    _counting_done = False
    _replaced = False  # whether a profiled module was replaced by one registered in its place during the step
    # The batch sizes, and the count of shapes beyond the batch, the root's calls had when the counting meters
    # stopped (``_shape_counts``): where the shapes meter does not run, what tells that later (timed) steps ran
    # shapes the counted step did not.
    _counted_shapes: tuple[set[Any], int] | None = None
    _counted_names: frozenset[str] = frozenset()  # the modules that ran in the step the counting meters counted
    _example_before: dict[str, Any] | None = None  # the tracker's example as the step under way began
    _observed = False  # whether some meter observes calls (set as the block starts)
    _tracker: Tracker | None = None
    _owns: list[dict[str, Any]] | None = None  # the entries' ``__dict__``, where the start read them
    _registration: Any = None  # the global hook that sees submodules registered while profiling
    _plan: reuse.Plan | None = None
    _around: list[nn.Module] | None = None  # the modules calling around the wrapper, as the start read them
    _profile: Profile | None = None
    _in_block = False  # inside `with`: stop() is the block's job
    _failure = ""
    # Where start() was called, for the error of a second profiler on the model: the code and the offset of its
    # instruction, made into a file and line only for that error (a line number is read from the code's line
    # table: cold C code as a block starts right after a step).
    _started_at: tuple[Any, int] | None = None
    # Set by an integration: ends this profiler, and returns True, when the run that owns it is over (a trainer
    # that raised never calls its profiler again), so that a new profiler on the model need not wait for it.
    _give_way: Callable[[], bool] | None = None

    def __init__(self, model: nn.Module, *, sync: bool = False, metrics: Iterable[str] | None = None,
                 warmup: int = 0, schedule: Schedule | None = None, max_samples: int = 1024,
                 annotate: bool = False, peaks: dict[str, Any] | None = None) -> None:
        self._paths = _check_model(model)
        # The checks' functions called only where a value is not a plain default's kind: each is a frame of code
        # that is cache misses as a one-shot block starts right after a step.
        self._given_peaks = None if peaks is None else check_peaks(peaks)
        if type(warmup) is not int or warmup < 0:
            warmup = check_int("warmup", warmup)
        if type(max_samples) is not int or max_samples < 1:
            max_samples = check_int("max_samples", max_samples, minimum=1)
        if schedule is not None and not isinstance(schedule, Schedule):
            raise TypeError(
                f"schedule must be a layerprof.schedule(wait=, warmup=, active=, repeat=), got {schedule!r}"
            )
        if schedule is not None and warmup:
            raise ValueError("give either warmup= or schedule= (which has its own warmup), not both")
        self.model = model
        self.sync = sync if sync is False or sync is True else check_bool("sync", sync)
        self.warmup = warmup
        self.schedule = schedule
        self.metrics: list[Meter] = make_meters(metrics, model)
        annotate = annotate if annotate is False or annotate is True else check_bool("annotate", annotate)
        if annotate:  # an observer on the meters' hooks: nothing runs for it when off
            self.metrics.append(Annotator())
        self.step_num = 0
        self._stats = StepStats(max_samples=max_samples)
        self._unrecorded_names: set[str] = set()  # modules seen in steps not recorded (warm-up)
        self._counting: list[Meter] = []  # timing-distorting meters while they run
        self._steps_with_calls = 0
        self._entries: reuse.Entries | list[tuple[str, nn.Module]] = []
        self._entry_modules: list[nn.Module] = []
        self._names: dict[int, str] = {}
        self._state = "new"  # new -> running -> done, or failed when the block raised

    # -- lifecycle -------------------------------------------------------------------------------------------
    def _action(self, step: int) -> Action:
        if self.schedule is not None:
            return self.schedule(step)
        return Action.WARMUP if step < self.warmup else Action.RECORD

    def start(self) -> LayerProf:
        """Begin profiling (what ``with`` does on entry); pair with ``stop()``."""
        with gc_paused():
            return self._start()

    def _start(self) -> LayerProf:
        if self._state == "running":
            raise RuntimeError(
                "this LayerProf is already running: it was started (start() or `with`) and not stopped yet; "
                "profile again after stop() or the end of the block, with a new LayerProf(model)"
            )
        if self._state != "new":
            raise RuntimeError(
                "this LayerProf was already used; create a new LayerProf(model) for each profile"
            )
        checked = self._paths

        def check(paths: list[tuple[str, nn.Module]]) -> None:
            if paths != checked:  # changed since __init__ checked it (the same modules compare equal at once)
                _check_children(paths, compiled_module_type())

        # The earlier block's walk, names and record shape when the model has not changed since (reuse.py).
        plan, modules, owns = reuse.plan_for(self.model, check)
        self._paths = []
        self._plan = plan
        entries = plan.entries(modules)
        # Whatever checked the model before (here, or a reused plan): .compile() since then changes no path. Not
        # read again where no module's ``__dict__`` was written into since a block's end found none compiled
        # (``Plan.checked``: the key just read the classes), and no class's forward is compiled.
        checked = plan.checked
        if (checked is None or owns is None or list(map(reuse.dict_version, owns)) != checked[0]
                or not plan.eager()):
            refuse_compiled_in_place(entries, modules, owns)
            # And the modules compiled in place with disable=True, whose calls skip the call wrapper: the same where
            # nothing was written into a module since.
            plan.around = compiled_around(modules, owns)
        # For the first attach: those, and the modules of a class with a _call_impl of its own (read each time: a
        # class decorated since keeps its name and forward). A later attach (a schedule's) reads the modules.
        self._around = calling_around(modules, plan.classes, plan.around)
        for holder in list(_PROFILED):  # (giving way stops a holder, which takes it out of _PROFILED)
            held = holder._names
            if not held.keys().isdisjoint(plan.names) and not (holder._give_way is not None and holder._give_way()):
                name, module = next((name, module) for name, module in entries if id(module) in held)
                shown = f"module '{name}'" if name else "the model"
                theirs = held[id(module)]
                # The same model twice, or a part of one model profiled on its own while the whole is, or one
                # module shared by two models (a teacher and a student sharing an embedding).
                where = ("" if not name and not theirs else
                         f" (it is '{theirs}' in the model that one profiles)" if theirs else
                         " (it is the model that one profiles)")
                both = ("" if not name and not theirs else
                        " To profile two models that share modules, or a model and a part of it, use one LayerProf "
                        "on a module that holds them all (an nn.ModuleDict of the models, say): each part then has "
                        "its own rows.")
                raise RuntimeError(
                    f"{shown} ({type(module).__name__}) is already being profiled by another active LayerProf "
                    f"(started {_place(holder._started_at)}){where}; two profilers on one module would time each "
                    "other's hooks. Stop that one first: prof.stop() for its profile, or prof.cancel() to drop it; "
                    "if you no longer hold it (a notebook cell run again), LayerProf.running_on(model).cancel()."
                    + both
                )
        self._entries = entries
        self._entry_modules = modules  # the entries' modules while no module joins (then len(entries) > _built)
        self._owns = owns
        self._built = len(entries)
        # A meter the model came to need since LayerProf(model) (fully_shard applied after it: its communication
        # would be in the modules' times without the fsdp_comm meter).
        self.metrics.extend(meters_needed_since(self.metrics, self.model))
        pausing = []
        forward_observed = backward_observed = False
        for meter in self.metrics:  # one loop here, not a generator per question (each a cold frame on entry)
            if meter.pauses_clock:
                pausing.append(meter)
            forward_observed = forward_observed or meter.wants_forward_hooks
            backward_observed = backward_observed or meter.wants_backward_hooks
        self._observed = forward_observed or backward_observed
        clock = PausableClock() if pausing else None
        for meter in pausing:
            meter.use_clock(clock)
        # The tracker's call wrapper, meters or not: a hook on a module itself changes what some modules run (an
        # nn.TransformerEncoderLayer in inference takes its fused path only while it and its children carry none),
        # and a meter observing forward calls is given their kwargs by the wrapper.
        self._tracker = Tracker.made(sync=self.sync, cpu_clock=clock)
        # The plan's names, copied only when a module joins (``_module_registered``).
        self._names = plan.names
        _PROFILED[self] = None
        started: list[Meter] = []
        try:
            with verified(self.model, plan.values if plan.key is not None else None):
                for meter in self.metrics:
                    if not meter.distorts_timing:
                        meter.start(self.model, {} if meter.deferrable else self._records_now(), entries)
                        started.append(meter)
            self._registration = add_module_registration_hook(self._module_registered)
            self._begin_step()
            self._around = None  # not attached in a schedule's wait: a later attach reads the modules
        except BaseException:
            self._teardown(started + self._counting)
            raise
        self._state = "running"
        # (``start()`` and ``__enter__`` call this: their caller's frame is the user's, unless layerprof's own code
        # started the block; one frame object made, not one per level walked)
        try:
            frame: Any = sys._getframe(2)
        except ValueError:  # called from C with no Python frame above
            frame = None
        if frame is not None and frame.f_code.co_filename.startswith(PACKAGE):
            frame = user_frame()[0]
        self._started_at = None if frame is None else (frame.f_code, frame.f_lasti)
        return self

    def __enter__(self) -> LayerProf:
        with gc_paused():  # (start()'s work, without its frame)
            self._start()
        self._in_block = True
        return self

    def step(self) -> None:
        """Mark the end of a step (call it after each training step) and begin the next one."""
        if self._state != "running":
            raise RuntimeError("prof.step() is for inside a running profile: after start() or inside `with`")
        tracker = self._tracker
        open_call = tracker.open_here() if tracker is not None and tracker.active else None
        if open_call is not None and _inside_a_module_call():  # (else a stale call: a KeyboardInterrupt skipped
            # its post-hook, and the step's end clears it)
            shown = f"module '{open_call.name}'" if open_call.name else "the model"
            raise RuntimeError(
                f"prof.step() was called while the forward of {shown} is running (from a forward hook on one of its "
                "submodules?): the step would end inside that call and lose it. Call prof.step() once the model's "
                "call has returned; for a step per generated token, from a StoppingCriteria or a forward hook on "
                "the model itself"
            )
        with gc_paused():
            self._end_step()
            self.step_num += 1
            self._begin_step()

    def stop(self, *, partial: str | None = None, error: BaseException | None = None) -> None:
        """End profiling (what ``with`` does on exit) and compute the profile.

        ``partial``: why profiling ends before the run did (an exception in a training step, an interrupt): the
        step under way is dropped, and the profile of the steps completed so far says it is partial
        (``meta["partial"]``, and the summary's first line). With no step recorded there is no profile, and
        ``prof.profile`` says why; the hooks come off either way.

        ``error``: the exception that ended the run, where you hold it (in an ``except`` or ``finally``): it gets
        the notes an exception leaving a ``with`` block gets (the module whose backward raised it, what a meter
        knows of it), read before the hooks come off. The profile is still made, as ``partial`` says."""
        if self._in_block:
            # Refused before anything changes: the block goes on profiling and stops when it exits.
            raise RuntimeError(
                "prof.stop() was called inside `with LayerProf(model) as prof:`; the block stops profiling when it "
                "exits: remove the stop() call, or use prof.start() ... prof.stop() without `with`"
            )
        if self._state != "running":
            raise RuntimeError(f"prof.stop() needs a running profile, and this one {self._state_text()}")
        if error is not None and not isinstance(error, BaseException):
            raise TypeError(f"prof.stop(error=...) takes the exception that ended the run, got {type(error).__name__}"
                            ": pass the exception object (`except Exception as error: prof.stop(partial=..., "
                            "error=error)`), or leave it out")
        self._stop(None, None, partial, error)

    def cancel(self) -> None:
        """Take everything off the model and keep no profile (a run that crashed, a notebook cell run again).
        Does nothing unless running; inside ``with``, the block then exits without a profile."""
        if self._state != "running":
            return
        with gc_paused():
            self._state, self._failure = "failed", "it was cancelled"
            try:
                self._teardown(self._running_meters())
            finally:
                self._tracker = None

    @property
    def running(self) -> bool:
        """Whether this LayerProf is profiling now (started and not stopped)."""
        return self._state == "running"

    def root_step(self) -> RootStep:
        """For a trainer integration, while running: times the trainer's step as one call of the model's root,
        for trainers whose step never calls the root (``collect/stepcall.py``)."""
        if self._tracker is None:
            raise RuntimeError("prof.root_step() is for a running profile: after start()")
        self._tracker.lent = True
        return RootStep(self._tracker, self.model)

    @staticmethod
    def running_on(model: nn.Module) -> LayerProf | None:
        """The LayerProf running on ``model`` (or on one of its modules), None if none: to stop or cancel one
        whose variable is lost."""
        for module in _modules_in(model):
            for holder in _PROFILED:
                if id(module) in holder._names:
                    return holder
        return None

    def __exit__(self, exc_type: Any, exc: BaseException | None, traceback: Any) -> bool:
        if self._state == "failed" and self._failure == "it was cancelled":
            self._in_block = False
            return False
        if self._state != "running":
            raise RuntimeError(f"LayerProf.__exit__ needs a running profile, and this one {self._state_text()}")
        self._in_block = False
        with gc_paused():  # (_stop()'s work, without its frame)
            self._stop_profiling(exc, traceback)
        return False

    def _stop(self, exc: BaseException | None, traceback: Any, partial: str | None = None,
              error: BaseException | None = None) -> None:
        with gc_paused():
            self._stop_profiling(exc, traceback, partial, error)

    def _stop_profiling(self, exc: BaseException | None, traceback: Any, partial: str | None = None,
                        error: BaseException | None = None) -> None:
        """``exc``: what is leaving the block (no profile then); ``error``: what ended the run, told by ``stop()``
        (noted as ``exc`` would be, the profile made as ``partial`` says)."""
        tracker = self._tracker
        assert tracker is not None  # set by start() while running
        self._state = "failed"  # until the profile is made
        # Read before the hooks come off: ending the step forgets which module's backward ran last.
        note = backward_note(tracker, exc, traceback) if exc is not None else None
        if error is not None:
            self._add_notes(error, backward_note(tracker, error, error.__traceback__))
        if isinstance(exc, KeyboardInterrupt) and partial is None:
            # An interrupt (a notebook's stop button, Ctrl-C) ends a loop its user chose to end, not a failed one:
            # the steps completed are kept, as stop(partial=...) keeps them, and the interrupt goes on.
            self._add_notes(exc, note)
            self._stop_interrupted()
            return
        ended = False  # whether the tracker's step was just closed: its detach need not close it again
        made = False
        try:
            try:
                if partial is not None:
                    self._drop_step()
                elif exc is None:
                    self._end_step(last=True)
                    ended = True
            except BaseException as error:
                self._failure = f"ending the last step raised {type(error).__name__}"
                raise
            finally:
                # A tracker whose block ended cleanly is detached only, and parked once the profile is made.
                self._teardown(self._running_meters(), ended, parking=ended)
            if exc is not None:
                self._failure = f"the block raised {type(exc).__name__}"
                self._add_notes(exc, note)
                self._tracker = None
                return
            if partial is not None and self._stats.steps == 0 and self._counting_step is None:
                self._failure = partial
                self._tracker = None
                return
            try:
                self._finish(partial)
            except BaseException as error:
                self._failure = f"computing the profile raised {type(error).__name__}"
                raise
            made = True
            self._state = "done"
        finally:
            if ended:
                tracker.park(made)

    def _stop_interrupted(self) -> None:
        """The end of a block left by a KeyboardInterrupt: a partial profile of the steps completed, or none. The
        interrupt may have landed anywhere in a hook, so a profile that cannot be made is no profile, said by
        ``prof.profile``, rather than an error in place of the interrupt."""
        why = "interrupted (KeyboardInterrupt)"
        try:
            try:
                self._drop_step()
            finally:
                self._teardown(self._running_meters())
            if self._stats.steps == 0 and self._counting_step is None:
                if self.step_num and not any(self._action(step) is Action.RECORD for step in range(self.step_num)):
                    # Steps completed, each one warm-up or a schedule's wait: "no step completed" was untrue.
                    left_out = (f"warm-up (warmup={self.warmup})" if self.schedule is None else
                                f"before the schedule's first recorded step, step {first_recorded(self.schedule)}")
                    self._failure = (f"the block raised KeyboardInterrupt in step {self.step_num}, with no step "
                                     f"recorded: steps 0 to {self.step_num - 1} were all {left_out}")
                elif self.step_num:
                    self._failure = (f"the block raised KeyboardInterrupt in step {self.step_num}, with no step "
                                     "recorded: no completed step called the model")
                else:
                    self._failure = "the block raised KeyboardInterrupt with no step completed (prof.step())"
                return
            self._finish(why)
            self._state = "done"
        except Exception as error:  # noqa: BLE001 - the interrupt is what leaves the block
            self._failure = (f"the block raised KeyboardInterrupt, and its partial profile could not be made "
                             f"({type(error).__name__}: {error})")
        finally:
            if self._state != "done":
                self._tracker = None

    def _add_notes(self, error: BaseException, note: str | None) -> None:
        """The notes of an exception that ended the run: ``note`` (``backward_note``'s), then what each meter
        explains of it."""
        if note is not None:
            error.add_note(note)
        if isinstance(error, RuntimeError) and "meta tensor" in str(error):
            error.add_note(f"{NOTE_PREFIX}{_META_READ}")
        for meter in self.metrics:
            explained = meter.explain(error)
            if explained is not None:
                error.add_note(f"{NOTE_PREFIX}{explained}")

    def _state_text(self) -> str:
        if self._state == "new":
            return "was never started: call prof.start() first"
        if self._state == "failed":
            return f"has stopped ({self._failure})"
        return "has already stopped"

    def _teardown(self, meters: list[Meter], ended: bool = False, parking: bool = False) -> None:
        """Take everything off the model; runs on every exit path (``ended``: the tracker's step was just
        closed; ``parking``: the tracker is only detached, its hook functions kept for ``Tracker.park``)."""
        try:
            if self._tracker is not None:
                if parking:
                    self._tracker.detach(ended)
                else:
                    self._tracker.release(ended)
                # A module compiled in place with disable=True in the block holds the wrapper: torch's call for it.
                modules = self._entry_modules
                if len(self._entries) != len(modules):  # (modules joined while profiling)
                    modules = list(map(_second, self._entries))
                owns = self._owns
                unbind_call_wrappers(modules, owns if owns is not None and len(owns) == len(modules) else None)
            if self._registration is not None:
                remove_module_registration_hook(self._registration)
                self._registration = None
        finally:
            try:
                _stop_all(meters)
            finally:
                self._counting = []
                _PROFILED.pop(self, None)

    # -- steps -----------------------------------------------------------------------------------------------
    def _begin_step(self) -> None:
        tracker = self._tracker
        assert tracker is not None
        action = self._action(self.step_num)
        wanted = action is not Action.NONE
        if wanted and not self._counting_done:
            for meter in self.metrics:
                if meter.distorts_timing:
                    meter.start(self.model, self._records_for(meter), self._entries)
                    self._counting.append(meter)
            self._counting_done = True
        if self._observed:  # (else the tracker's observers stay none)
            self._set_observers()
        if wanted and not tracker.active:
            plan = self._plan
            # The plan's names while the block's modules are the plan's (none joined while profiling).
            names = plan.hook_names if plan is not None and len(self._entries) == self._built else {}
            # Where TorchScript may run in the forward (a profiled model holds none: refused), or a module of the
            # model hooks its outputs inside its forward (FSDP1), the start nodes of the walks put off are hooked as
            # their calls return (``Tracker.early_hooks``).
            tracker.early_hooks = torchscript_compiled() or plan is None or plan.hooks_outputs_in_forward()
            tracker.attach(self._entries, names or None, self._around if names else None)
        elif not wanted and tracker.active:
            tracker.detach()
        # A step left out (warm-up, or dropped by ``stop(partial=)``) is not the profile's workload: the example is
        # put back as it was.
        self._example_before = None if not wanted else {
            key: dict(value) if isinstance(value, dict) else value for key, value in tracker.example.items()}

    def _restore_example(self) -> None:
        """Put the tracker's example (batch size, input facts) back as the step under way found it: that step is not
        the profile's workload (a warm-up step, one dropped)."""
        before, self._example_before = self._example_before, None
        if before is not None:
            example = self._tracker.example  # type: ignore[union-attr]
            example.clear()
            example.update(before)

    def _end_step(self, last: bool = False) -> None:
        """Close the step under way (``last``: the block's last, as it stops)."""
        tracker = self._tracker
        assert tracker is not None
        action = self._action(self.step_num)
        timed = False  # whether some call of the step was timed
        if tracker.calls:
            calls = tracker.calls
            if (last and action is Action.RECORD and not self._stats.steps and not self._counting
                    and isinstance(tracker.cpu_clock, CpuClock)  # (and the CUDA clocks: no generator where none)
                    and (not tracker.cuda_clocks or all(isinstance(c, CpuClock) for c in tracker.cuda_clocks.values()))
                    and (tracker.counted_all_returned() or all_returned(calls))):
                # The block's only step, stamped by wall clocks (no event to settle): its times are made when the
                # profile is first read (a one-shot profile that is never read never makes them), from the calls,
                # which hold nothing else of the step then.
                held = calls.copy()
                self._stats.add_later(functools.partial(step_times, held, self.step_num), held)
                timed = True
            else:
                for clock in tracker.clocks():
                    clock.settle()
                times = step_times(calls, self.step_num)
                for clock in tracker.clocks():
                    clock.recycle()  # every stamp of the step is read: CUDA events go back to their pool
                # (no times: every call of the step raised, and the loop caught it; a step that ran nothing is no
                # step, as one without a call is not)
                if action is not Action.RECORD and times:  # (warm-up: seen run, for ``_ran_unseen``)
                    self._unrecorded_names.update(times)
                if action is Action.RECORD and times:
                    if self._counting:
                        self._counting_step = times
                    else:
                        self._stats.add(times)
                timed = bool(times)
            tracker.clear_calls()
            self._steps_with_calls += 1
        # Close the step: its graph hooks stop stamping, and every thread's call stack, walked nodes and owners
        # start clean (kept across steps they grew without bound; a KeyboardInterrupt inside a forward skips its
        # post-hook): after the last, the tracker's release clears them.
        tracker.end_step(last)
        # A step slowed by counting meters is left out of the timings (when others exist): out of meters' too.
        recorded = action is Action.RECORD and timed and not self._counting
        for meter in self._running_meters():
            meter.end_step(recorded)
        if timed and self._counting:  # counting meters stay on until a step has run something to count
            counting, self._counting = self._counting, []
            _stop_all(counting)
            self._counted_shapes = _shape_counts(tracker.example)
            self._counted_names = frozenset(times)  # (``times``: the step's, made above whenever meters count)
        if action is not Action.RECORD:
            self._restore_example()
        if self._observed and not last:  # (the last step's observers go with the tracker)
            self._set_observers()
        if self._replaced:
            self._drop_replaced()

    def _own_names(self) -> dict[int, str]:
        """The block's names by module id, to change: a copy of the plan's where the block still reads those (the
        plan's stay those of its modules)."""
        if self._plan is not None and self._names is self._plan.names:
            self._names = dict(self._names)
        return self._names

    def _drop_replaced(self) -> None:
        """Forget the modules that left the model during the step, replaced by modules registered in their place
        (a new head each step): kept, each stayed alive with its parameters for the whole block and took hooks at
        every attach. Their records stay, as a replaced module's record is its successor's."""
        self._replaced = False
        present = {id(module) for module in self.model.modules()}
        gone = [module for _, module in self._entries if id(module) not in present]
        if not gone:
            return
        self._entries = [(name, module) for name, module in self._entries if id(module) in present]
        self._entry_modules = list(map(_second, self._entries))
        self._built = -1  # (never the plan's modules again in this block)
        names = self._own_names()
        for module in gone:
            names.pop(id(module), None)
        if self._tracker is not None:
            self._tracker.forget(gone)

    def _drop_step(self) -> None:
        """Forget the step under way (it did not complete): its calls, and the meters' numbers for it."""
        assert self._tracker is not None
        self._tracker.clear_calls()
        self._restore_example()
        for meter in self._running_meters():
            meter.end_step(False)

    def _running_meters(self) -> list[Meter]:
        """Meters on now: the ones that run throughout, then the timing-distorting ones while they count."""
        return [m for m in self.metrics if not m.distorts_timing] + self._counting

    def _set_observers(self) -> None:
        running = self._running_meters()
        assert self._tracker is not None
        self._tracker.observers = tuple(m for m in running if m.wants_forward_hooks)
        self._tracker.backward_observers = tuple(m for m in running if m.wants_backward_hooks)

    def _module_registered(self, parent: nn.Module, name: str, submodule: Any) -> None:
        """A submodule registered on a profiled module while profiling (made lazily in a forward): give it and
        its own submodules records and hooks at once, so its calls count from the step it appears in."""
        parent_name = self._names.get(id(parent))
        if parent_name is None or not isinstance(submodule, nn.Module) or self._tracker is None:
            return None
        prefix = f"{parent_name}.{name}" if parent_name else name
        table = getattr(parent, "_modules", None)
        old = table.get(name) if isinstance(table, dict) else None
        if old is not None and old is not submodule and id(old) in self._names:
            self._replaced = True  # (forgotten as the step ends, where it left the model: ``_drop_replaced``)
            # What was at ``prefix`` or under it and goes on inside ``submodule`` (an adapter around the Linear it
            # replaces: the Linear is now ``prefix.base``) leaves its old name, entry and hooks, and joins again
            # below under its new name, after its new parent, as in a first profile of the changed model. A module
            # profiled under another name stays shared.
            under = prefix + "."
            inside = [module for module in submodule.modules()
                      if (known := self._names.get(id(module))) is not None
                      and (known == prefix or known.startswith(under))]
            if inside:
                moved = set(map(id, inside))
                self._entries = [(name, module) for name, module in self._entries if id(module) not in moved]
                self._entry_modules = list(map(_second, self._entries))
                self._built = -1  # (never the plan's modules again in this block)
                names = self._own_names()
                for module in inside:
                    names.pop(id(module), None)  # (so that the loop below names and hooks them anew)
                self._tracker.forget(inside)
        added = []
        records = self._records_now()
        for qualified, module in submodule.named_modules(prefix=prefix):
            if id(module) in self._names:
                continue  # already profiled under another name: one record, as for any shared module
            if qualified not in records:  # a replaced submodule keeps the record of its name
                holder = records[qualified.rsplit(".", 1)[0] if "." in qualified else ""]
                records[qualified] = ModuleRecord(qualified, type(module).__name__, module.extra_repr(), holder)
            self._tracker.drop_copied_hooks(module)  # a copy of a profiled module (deepcopy inside the block)
            self._own_names()[id(module)] = qualified
            self._entries.append((qualified, module))
            added.append((qualified, module))
        if added:
            for meter in self._running_meters():
                meter.modules_added(added)
            if self._tracker.active:
                self._tracker.attach(added)
        return None

    def _warn_unseen_modules(self, owns: list[dict[str, Any]]) -> bool:
        """Modules in the model now that were never hooked (put into ``_modules`` without registration);
        ``owns``: the ``__dict__`` of the block's modules, in the order of its entries. True where the model holds
        the plan's modules, and no other."""
        names = self._names
        plan = self._plan
        if plan is not None and len(self._entries) == self._built and plan.same_children(owns):
            return True  # the model holds the modules it held at the start, each hooked
        if all(id(module) in names for module in _modules_in(self.model)):
            return False
        unseen = [(name, module) for name, module in module_paths(self.model) if id(module) not in names]
        if unseen:
            shown = ", ".join(f"'{name}' ({type(module).__name__})" for name, module in unseen[:5])
            warn_user(
                f"layerprof: {len(unseen)} module(s) joined the model while profiling without nn.Module registration "
                f"and were not profiled: {shown}. Create submodules with attribute assignment or add_module, or "
                "before profiling.",
            )
        return False

    def _ran_unseen(self) -> list[str]:
        """The outermost modules no step saw called (recorded, warm-up or counted) under which a parameter holds a
        gradient, in a process where dynamo compiled a graph (only read where some module was not seen:
        ``collect/unseen.py``)."""
        if not self._stats.steps or not dynamo_compiled():
            return []
        ran = self._stats.ran() | self._unrecorded_names | self._counted_names  # (the counted step: seen run too)
        return [] if len(ran) >= len(self._entries) else ran_unseen(self._entries, ran)

    def _finish(self, partial: str | None = None) -> None:
        tracker = self._tracker
        assert tracker is not None
        owns, self._owns = self._owns, None
        reused = owns is not None  # (the start reads them where it reused a plan)
        if len(self._entries) == self._built:
            modules = self._entry_modules
        else:
            modules, owns = list(map(_second, self._entries)), None
        # Read once for the checks and the reprs (each pass over them costs misses), or kept from the start: what
        # is written into a module (``setattr``, ``.compile()``, a child put in ``_modules``) goes into the same
        # ``__dict__`` (only code that assigns ``module.__dict__`` itself would escape it; torch has none).
        if owns is None:
            owns = list(map(_own, modules))
        plan = self._plan
        # Nothing written into a module (``reuse.written``) since the end of a block on the plan whose checks all
        # passed, the plan's classes, none with a compiled forward: the checks pass as they did then, and what the
        # reprs read of the modules is what they read then (read from the second block on a plan: a first block on
        # a model reads no more than before).
        ours = plan is not None and plan.key is not None and len(self._entries) == self._built
        read = reuse.written(owns) if ours and reused else None
        unchanged = (read is not None and read == plan.checked and list(map(type, modules)) == plan.types
                     and plan.eager())
        passed = False  # whether the checks below all passed, on a plan's modules whose versions were read
        if not unchanged:
            compiled = compiled_while_profiling(self._entries, modules, owns)
            if compiled is not None:  # its times are partial: no profile rather than a wrong one
                raise RuntimeError(compiled)
            passed = self._warn_unseen_modules(owns) and read is not None
        # The model's device and dtype from its first parameter: the plan's where nothing was written into the
        # model since a clean end (its tables hold what the plan was made from), without a walk of the model.
        parameter = plan.first_parameter() if unchanged and plan is not None else reuse.UNKNOWN
        if parameter is reuse.UNKNOWN:
            parameter = first_parameter(self.model)
        facts = environment_of(parameter)
        if facts["device"] == "meta":
            facts = on_input_device(facts, tracker.example.get(INPUT_DEVICE))
            if facts["device"] == "meta" and any(meter.name == "live_memory" for meter in self.metrics):
                warn_user(
                    "live_memory ran on a model and an input on the meta device, which allocates nothing: its "
                    "readings of allocated bytes (the peaks, cuda_*/live figures) are 0 and say nothing. The saved "
                    "and activation bytes, counted from the tensors' sizes, hold: profile with metrics=('memory',) "
                    "for them"
                )
        meta: dict[str, Any] = {"environment": {**facts, **example_facts(tracker.example)}}
        # On the meta device or fake tensors every op only works out its output's shape: the hooks' clocks read
        # that bookkeeping, not the model's work, so no time is kept (FLOPs, bytes, shapes and sizes hold).
        without_times = untimed(facts, parameter, tracker.example.get(INPUT_DEVICE), tracker.example.get(INPUT_FAKE))
        if without_times is not None:
            meta["untimed"] = without_times
        ranks = rank_facts()
        if ranks is not None:  # (saved per rank: which rank of how many, for layerprof.gather_saved)
            meta["distributed"] = ranks
        if self._stats.steps == 0 and self._counting_step is not None:
            distorting = [m.name for m in self.metrics if m.distorts_timing]
            # Only set while a distorting meter counted, so ``distorting`` is not empty here.
            self._stats.add(self._counting_step)
            if without_times is None:  # (else there are no times to distort)
                meta["timing_distorted_by"] = distorting
                warn_user(
                    f"only one step was profiled, and metrics {distorting} slowed it down: its times include their "
                    "overhead. Profile several steps (call prof.step() after each) for clean times.",
                )
        if tracker.late:
            _warn_late_backward(list(tracker.late))
        unseen = self._ran_unseen()
        if unseen:
            meta["unseen_with_gradients"] = unseen
            warn_user(unseen_message(unseen))
        # What the records show of the model is read now, whenever they are made: a later change of the model
        # cannot change the profile.
        reprs = read_reprs(modules, plan if len(self._entries) == self._built else None, owns, unchanged)
        if passed:  # (the texts the plan keeps are this reading's)
            assert plan is not None
            plan.checked = read
            plan.around = compiled_around(modules, owns)  # (a module compiled in place in the block, or since)
        stats, meters = self._stats, tuple(self.metrics)
        # Made when the profile is first read where nothing needed the records while the block ran, and every
        # meter fills from its own numbers: a one-shot profile that is never read never makes them.
        later = self._records is None and plan is not None
        for meter in meters:  # (a loop here: no generator frame, cold as the block exits)
            later = later and meter.deferrable
        if not later:
            records = self._records_now()
            write_reprs(list(map(records.__getitem__, map(_first, self._entries))), reprs)
            _fill(self._tree, records, stats, meters, without_times is None)
        for meter in meters:
            extra = meter.meta()
            if extra:
                meta[meter.name] = extra
        other_shapes = meta.get("shapes", {}).get("steps_with_other_shapes")
        counted = [m.name for m in meters if m.distorts_timing]
        changed = f"the steps' inputs changed shape ({other_shapes} step(s) other than the first's)" if (
            other_shapes) else None
        if (changed is None and counted and self._counted_shapes is not None and self._stats.steps
                and not measures(self.metrics, "shapes")
                and _other_shapes_later(self._counted_shapes, tracker.example)):
            changed = "the model's inputs changed shape after the counted step"  # (told by the root's inputs)
        if changed is not None and counted:
            warn_user(
                f"{changed}, and metrics {counted} count one step: their figures (FLOPs, bytes, saved bytes) are of "
                "that step's shapes, while the times are over every timed step, so FLOP/s, the roofline and "
                "checkpoint plans mix the two. Profile steps of one shape (a fixed length, or one bucket) for "
                "figures that go together."
            )
        if counted and not later:
            _warn_not_counted(self._records_now(), self._counted_names, counted)
        if partial is not None:
            meta["partial"] = partial
        if self._given_peaks is not None:
            meta["peaks"] = dict(self._given_peaks)
        meta["steps"], meta["steps_seen"], meta["warmup"] = self._stats.steps, self._steps_with_calls, self.warmup
        meta["schedule"] = None if self.schedule is None else vars(self.schedule).copy()
        cuda_clocks = tracker.cuda_clocks
        meta["clock"] = (sorted({tracker.cpu_clock.kind, *map(_kind, cuda_clocks.values())}) if cuda_clocks
                         else [tracker.cpu_clock.kind])
        if not later and without_times is None:
            meta["step_ms"] = stats.step_totals()
        note = None if self.schedule is None or self._stats.steps else self.schedule.no_step_note(self.step_num)
        if note is not None:  # (a framework's schedule, in its own steps)
            warn_user(note)
        elif self._stats.steps == 0:
            if self._steps_with_calls:  # the model ran, in steps the profile was told to leave out
                left_out, fix = ((f"warm-up (warmup={self.warmup})", "lower warmup") if self.schedule is None else
                                 (f"warm-up or outside the schedule ({self.schedule!r})", "change the schedule"))
                warn_user(
                    f"LayerProf recorded no step: the {self._steps_with_calls} step(s) that ran the model were all "
                    f"{left_out}, or every call in them raised. A step ends at prof.step() or at the end of the "
                    f"block: run more steps, or {fix}.",
                )
            elif not any(self._action(step) is Action.RECORD for step in range(self.step_num + 1)):
                # Every step was warm-up or a schedule's wait, whose calls no hook sees: the model may have run.
                # (A schedule takes no warmup= beside it: "lower warmup" was advice the user could not take.)
                left_out, fix = ((f"warm-up (warmup={self.warmup})", "lower warmup") if self.schedule is None else
                                 (f"before the schedule's first recorded step, step {first_recorded(self.schedule)} "
                                  f"({self.schedule!r})", "change the schedule"))
                warn_user(
                    f"LayerProf recorded no step: steps 0 to {self.step_num} (counted by prof.step()) were all "
                    f"{left_out}. A step ends at prof.step() or at the end of the block: run more steps, or {fix}.",
                )
            elif dynamo_compiled():
                # (a model called only inside a torch.compile'd function: dynamo inlines its modules' forwards into
                # the compiled code, which calls no hook of layerprof's)
                warn_user("LayerProf recorded no step: call the model inside the block. If it ran there inside a "
                          "torch.compile'd function, its modules were compiled into that function's code, which "
                          "runs no profiler's hooks: profile the same step without torch.compile, and compile after "
                          "profiling")
            else:
                warn_user("LayerProf recorded no step: call the model inside the block")
        self._tracker = None
        if later:
            assert plan is not None
            self._profile = Profile.deferred(
                meta, functools.partial(_made_later, plan, reprs, stats, meters, without_times is None),
                functools.partial(_step_ms, stats) if without_times is None else None)
        else:
            assert self._tree is not None and self._records is not None
            # The records are in tree order unless modules joined while profiling (then the tree is walked again).
            in_order = len(self._records) == self._built
            self._profile = Profile(self._tree, meta, self._records if in_order else None)
        events = [index for index, clock in tracker.cuda_clocks.items() if _kind(clock) == "cuda_event"]
        on_events = bool(events) and "cuda_sync" not in meta["clock"]
        if (meta["clock"] == ["wall"] or on_events) and measures(self.metrics, "memory") and without_times is None:
            # A profile to plan checkpoints on: what the hooks add to each ancestor's forward, which a
            # recomputation does not pay (the planner takes it off), measured by its first plan. Where CUDA events
            # timed the modules, what they add to the host's time of each forward (``host_forward_ms``).
            shapes = tuple(m.name for m in self.metrics if m.name == "shapes")
            device = f"cuda:{events[0]}" if on_events else "cpu"
            later_figures = {"hook_ms": functools.partial(hook_cost, LayerProf, shapes, device)}
            if "live_memory" in meta.get("timing_distorted_by", ()):
                # The live-bytes reader ran in the one timed step: its time per op, taken off recomputations with
                # each module's op count (live_op_cost.py), measured as hook_ms is (about 0.1 s once a process).
                later_figures["live_op_ms"] = _live_op_ms
            self._profile.measures = later_figures

    def _records_now(self) -> dict[str, ModuleRecord]:
        """The block's records (while it runs, or as it stops), made from its plan when first asked for."""
        if self._records is None:
            assert self._plan is not None  # set by start()
            self._tree, self._records = self._plan.records()  # extra_repr is read when the block stops
        return self._records

    def _records_for(self, meter: Meter) -> dict[str, ModuleRecord]:
        """What ``meter.start`` is handed: the records, or nothing for a meter that reads none there."""
        return {} if meter.deferrable else self._records_now()

    @property
    def tree(self) -> ModuleRecord | None:
        """The root record: the profile's once profiling has stopped; while running, the records being filled
        (made when first read), whose times and figures are written as profiling stops: until then they read None
        or 0, not the steps so far; None before start. After a block that raised or was cancelled, a
        RuntimeError that says so, as ``profile`` gives."""
        if self._state == "done" and self._profile is not None:
            return self._profile.tree
        if self._state == "failed":
            return self.profile.tree  # (raises, saying why there is no profile)
        if self._state == "running":
            self._records_now()
        return self._tree

    @property
    def records(self) -> dict[str, ModuleRecord]:
        """Records by qualified name, as ``tree``."""
        if self._state == "done" and self._profile is not None:
            return self._profile.records
        if self._state == "failed":
            return self.profile.records  # (raises, saying why there is no profile)
        if self._state == "running":
            return self._records_now()
        return {} if self._records is None else self._records

    # -- results: after the block, a LayerProf answers for its Profile ----------------------------------------
    @property
    def profile(self) -> Profile:
        """The result; available once profiling has stopped."""
        if self._state == "failed":
            raise RuntimeError(self._no_profile())
        if self._state != "done" or self._profile is None:
            when = "has not started" if self._state == "new" else "is still running"
            raise RuntimeError(
                f"the profile is not ready: profiling {when}. It is ready after the `with LayerProf(model) as prof:` "
                "block has exited (or after prof.stop())"
            )
        return self._profile

    def _no_profile(self) -> str:
        """Why a failed block has no profile, and what to do."""
        # (as a profile counts them: the step the counting meters slowed only where no other was recorded)
        recorded = self._stats.steps or int(self._counting_step is not None)
        if self._failure.startswith("the block raised KeyboardInterrupt") and not recorded:
            # (an interrupt is no error to fix: the steps it keeps are the recorded ones)
            return (f"no profile: {self._failure}, so nothing was recorded. Profile again with a new "
                    "LayerProf(model), and interrupt it once a step is recorded")
        if not recorded or not self._failure.startswith("the block raised"):
            return (f"no profile: {self._failure} before profiling finished, so nothing was recorded. "
                    "Fix the error and profile again with a new LayerProf(model)")
        return (f"no profile: {self._failure} in step {self.step_num} (counted from 0), after {recorded} recorded "
                "step(s), and a `with LayerProf(model)` block that raises keeps none. To keep the steps completed "
                "before an error, profile with prof = LayerProf(model).start() and call "
                "prof.stop(partial=str(error), error=error) in your `except`; or fix the error and profile again "
                "with a new LayerProf(model)")

    @property
    def meta(self) -> dict[str, Any]:
        """Where and how the profile was measured (environment, steps, clocks, meters' totals)."""
        return self.profile.meta

    # The result's API, forwarded by name so that ``prof.layerwise_summary()`` works on the LayerProf after its
    # block: this list is the whole of it (no ``__getattr__``), each with the Profile method's signature and doc.
    to_dict = _result(Profile.to_dict)
    layerwise_summary = _result(Profile.layerwise_summary)
    layerwise_timepool = _result(Profile.layerwise_timepool)
    render_tree = _result(Profile.render_tree)
    select = _result(Profile.select)
    rows = _result(Profile.rows)
    aggregate = _result(Profile.aggregate)
    top = _result(Profile.top)
    roofline = _result(Profile.roofline)
    peaks = _result(Profile.peaks)
    to_dataframe = _result(Profile.to_dataframe)
    to_csv = _result(Profile.to_csv)
    to_markdown = _result(Profile.to_markdown)
    to_latex = _result(Profile.to_latex)
    to_html = _result(Profile.to_html)
    to_json = _result(Profile.to_json)
    to_trace = _result(Profile.to_trace)
    to_speedscope = _result(Profile.to_speedscope)
    to_report = _result(Profile.to_report)
    to_tensorboard = _result(Profile.to_tensorboard)
    plot = _result(Profile.plot)

    @functools.wraps(Profile.gather)
    def gather(self, dst: int = 0, group: Any = None, margin: float = 0.2, min_ms: float | None = None) -> Any:
        if self._state == "failed":
            # A collective: this rank still takes part, sending why it has no profile (the other ranks would wait
            # for it until the group's timeout), then raises as ``prof.profile`` does.
            Profile.gather_failure(f"{self._failure}", dst, group)
        elif self._state != "done":  # called inside the block, or before it: as a failed rank, then the same error
            Profile.gather_failure("profiling was still running when it called gather()" if self._state == "running"
                                   else "profiling never started when it called gather()", dst, group)
        return self.profile.gather(dst, group, margin, min_ms)
    unknown_ops = _result(Profile.unknown_ops)
    checkpoint_plan = _result(Profile.checkpoint_plan)

    def _repr_html_(self) -> str | None:
        # None makes a notebook fall back to __repr__ while the profile is not ready.
        return self._profile._repr_html_() if self._state == "done" and self._profile is not None else None

    def __reduce_ex__(self, protocol: Any) -> Any:
        # A LayerProf holds the model and its hooks' state: pickled (``torch.save(prof)``, a result sent back from
        # a worker) it failed on a weak reference deep inside, and a deep copy copied the model. What travels is
        # the profile.
        raise TypeError(
            "a LayerProf cannot be pickled or copied (it holds the model it profiles and its hooks' state): pickle, "
            "copy or torch.save prof.profile after the block, or write prof.to_json(path) and read it with "
            "layerprof.load(path)"
        )

    def __repr__(self) -> str:
        if self._state != "done" or self._profile is None:
            return f"<LayerProf {type(self.model).__name__} ({self._state})>"
        return repr(self._profile).replace("<Profile", "<LayerProf", 1)
