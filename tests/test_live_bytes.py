"""The CPU's live tensor bytes (``LiveBytesReader``, ``metrics=("live_memory",)``): exact numbers by hand, against
torch.profiler's allocator events, with the FLOP meter's mode and torch.utils.checkpoint."""
from __future__ import annotations

import io
import warnings
from typing import Any, Callable

import pytest
import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

import layerprof
from layerprof import LayerProf
from layerprof.metrics import make_meters
from layerprof.metrics.live_bytes import read_step
from layerprof.metrics.memory import TIMELINE_ATTRIBUTE


def _mlp() -> tuple[nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(64, 128), nn.Tanh(), nn.Linear(128, 10)), torch.randn(32, 64)


def test_per_call_figures_and_the_step_peak_by_hand() -> None:
    model, x = _mlp()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # one step under a distorting meter
        with LayerProf(model, metrics=("live_memory",)) as prof:
            model(x).sum().backward()
    first, tanh, last, root = prof.records["0"], prof.records["1"], prof.records["2"], prof.tree
    # Forward (float32, x made before: the baseline): Linear 0 makes [32, 128] = 16384 B, Tanh another 16384 B,
    # Linear 2 [32, 10] = 1280 B; Linear 0's output dies between Tanh and Linear 2 (Tanh saves its own output).
    assert [(r.cuda_forward_delta_bytes, r.cuda_forward_peak_bytes) for r in (first, tanh, last)] == [
        (16384, 16384), (16384, 16384), (1280, 1280)]
    assert (root.cuda_forward_delta_bytes, root.cuda_forward_peak_bytes) == (16384 + 1280, 2 * 16384)
    # Backward of Linear 2: the gradient of its input [32, 128] 16384 B, of its weight [10, 128] 5120 B and bias
    # 40 B; of Tanh: 16384 B more (Linear 2's gradient and the saved output go only after its end).
    assert (last.cuda_backward_delta_bytes, last.cuda_backward_peak_bytes) == (16384 + 5120 + 40,) * 2
    assert (tanh.cuda_backward_delta_bytes, tanh.cuda_backward_peak_bytes) == (16384, 16384)
    # The step's peak is in Linear 0's backward: the loss and its seed (4 + 4 B), Linear 2's gradients (5160 B),
    # Tanh's gradient (16384 B), then Linear 0's weight [128, 64] 32768 B and bias 512 B gradients.
    meta = prof.profile.meta["live_memory"]
    assert meta == {"device": "cpu", "step_peak_bytes": 8 + 5160 + 16384 + 32768 + 512, "step_start_bytes": 0,
                    "step_end_bytes": 5160 + 32768 + 512,  # the gradients stay; the loss, seed and Tanh's go
                    "training": True, "dtype": "float32", "autocast": False}
    timeline = root.__dict__[TIMELINE_ATTRIBUTE]
    # Index 0, then boundaries: 8 in forward (the model's and each layer's start and end), 6 in backward (each
    # layer's start and end; the model's start with Linear 2's and end with Linear 0's), the step's end.
    assert len(timeline["levels"]) == 1 + 8 + 6 + 1 and max(timeline["peaks"]) == meta["step_peak_bytes"]


def test_a_plain_step_reads_what_the_profiled_one_did_and_the_allocator_agrees() -> None:
    model, x = _mlp()
    step = lambda: model(x).sum().backward()  # noqa: E731
    step()  # the gradients exist: later steps add into them
    with LayerProf(model, metrics=("live_memory",)) as prof:
        step()
        prof.step()
        step()
    profiled = prof.profile.meta["live_memory"]["step_peak_bytes"]
    reader = read_step(step)
    assert (reader.peak, reader.current) == (profiled, 0)
    # With the gradients there (added into, then freed), in Linear 0's backward: the loss and seed (8 B), Tanh's
    # gradient (16384 B) and Linear 0's new weight and bias gradients (32768 + 512 B) before they are added in.
    assert profiled == 8 + 16384 + 32768 + 512
    events = _allocator_events(step)
    if events is None:
        pytest.skip("this torch's profiler does not hand out its memory events")
    # The CPU allocator's own record of the same step: the same peak and the same bytes left.
    assert events == (reader.peak, reader.current)


def _allocator_events(step: Callable[[], Any]) -> tuple[int, int] | None:
    """The peak and the net of the CPU allocator's events in one step, from torch.profiler(profile_memory=True)."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True) as prof:
        step()
    try:
        found = sorted((e.start_ns(), e.nbytes()) for e in prof.profiler.kineto_results.events()
                       if e.name() == "[memory]")
    except AttributeError:
        return None
    level = peak = 0
    for _, size in found:
        level += size
        peak = max(peak, level)
    return peak, level


def test_views_in_place_and_out_ops_of_older_tensors_count_nothing() -> None:
    weight = torch.ones(64)
    made: list[torch.Tensor] = []

    def step() -> None:
        weight.view(8, 8).t()  # views of a tensor made before: nothing new
        weight.mul_(1.0)  # in place
        torch.add(weight, 1.0, out=weight)
        out = torch.empty(0)  # made in the step, then grown by an out= op: 0 B, then 64 * 4
        torch.add(weight, 1.0, out=out)
        made.append(out)

    reader = read_step(step)
    assert (reader.current, reader.peak) == (256, 256)
    made.clear()
    assert reader.current == 256  # closed: frees after it change nothing


def test_the_flop_meter_and_a_model_that_checkpoints_itself_read_the_same() -> None:
    model, x = _mlp()

    class Checkpointed(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner = model

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return checkpoint(self.inner, x, use_reentrant=False)

    wrapped = Checkpointed()
    x.requires_grad_(True)  # a checkpoint needs an input that needs grad to save anything
    step = lambda: wrapped(x).sum().backward()  # noqa: E731
    step()
    plain = read_step(step).peak
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with LayerProf(wrapped, metrics=("flops", "live_memory")) as both:
            step()
        with LayerProf(wrapped, metrics=("flops",)) as flops:
            step()
    # The recomputation's tensors count (its outputs are real memory in backward), under the FLOP meter's mode too.
    assert both.profile.meta["live_memory"]["step_peak_bytes"] == plain
    assert (both.tree.flops_forward, both.tree.flops_backward) == (flops.tree.flops_forward, flops.tree.flops_backward)
    # In backward the recomputed Linear 0 and Tanh outputs (2 * 16384) live beside the input's gradient.
    assert plain > 2 * 16384


def test_live_memory_replaces_memory() -> None:
    with pytest.raises(ValueError, match="'live_memory' is 'memory' with more"):
        make_meters(("memory", "live_memory"))


def test_a_start_refused_by_torch_leaves_no_dispatch_mode() -> None:
    # Where saved-tensor hooks are disabled (functorch transforms), the meter's start raises: the reader's mode,
    # which would slow every later op of the process, must not stay pushed.
    net = nn.Linear(4, 4)
    before = torch._C._len_torch_dispatch_stack()
    with torch.autograd.graph.disable_saved_tensors_hooks("no saved-tensor hooks here"):
        with pytest.raises(RuntimeError, match="no saved-tensor hooks here"):
            with LayerProf(net, metrics=("live_memory",)):
                pass
    assert torch._C._len_torch_dispatch_stack() == before
    assert not net._forward_hooks and not net._forward_pre_hooks


def test_a_closed_reader_keeps_no_weak_reference() -> None:
    # The weak references (and their callbacks, which hold the reader's table) go with close(), without waiting
    # for a cyclic collection: with the collector off, a storage that outlives the reader has none left.
    import gc
    import weakref

    from layerprof.metrics.live_bytes import LiveBytesReader

    enabled = gc.isenabled()
    gc.disable()
    try:
        reader = LiveBytesReader()
        reader.open()
        kept = torch.ones(256) * 2  # two new 1 KiB storages, the first freed: 1 KiB live, 2 KiB at the most
        reader.close()
        assert reader.read("cpu") == (1024, 2048)
        assert weakref.getweakrefcount(kept.untyped_storage()) == 0
    finally:
        if enabled:
            gc.enable()


def test_calls_run_on_another_thread_read_unknown_not_zero() -> None:
    # The reader's dispatch mode is its thread's own: a step run on another thread makes tensors it never sees.
    # Its calls read None, as the plain memory meter's CPU calls do (they read 0 before, a figure never measured).
    import threading

    def on_a_thread(work: Callable[[], Any]) -> None:
        thread = threading.Thread(target=work)
        thread.start()
        thread.join()

    model, x = _mlp()
    fields = ("cuda_forward_delta_bytes", "cuda_forward_peak_bytes", "cuda_backward_delta_bytes",
              "cuda_backward_peak_bytes")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # one step under a distorting meter
        with LayerProf(model, metrics=("live_memory",)) as prof:
            on_a_thread(lambda: model(x).sum().backward())
    assert {name: [getattr(r, f) for f in fields] for name, r in prof.records.items()} == {
        name: [None] * 4 for name in ("", "0", "1", "2")}
    assert "step_peak_bytes" not in prof.profile.meta["live_memory"]  # no step peak either (the mode only)
    assert prof.records["0"].activation_bytes == 16384  # the meter's own figures: [32, 128] float32
    # The forward on the block's thread, the backward on another: the forward's figures (by hand in the first
    # test), the backward's unknown.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with LayerProf(model, metrics=("live_memory",)) as prof:
            loss = model(x).sum()
            on_a_thread(loss.backward)
    first = prof.records["0"]
    assert (first.cuda_forward_delta_bytes, first.cuda_forward_peak_bytes) == (16384, 16384)
    assert (first.cuda_backward_delta_bytes, first.cuda_backward_peak_bytes) == (None, None)


def test_ops_counted_per_module_for_the_planner() -> None:
    model, x = _mlp()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # one step under a distorting meter: its times hold the reader's
        with LayerProf(model, metrics=("live_memory",)) as prof:
            model(x).sum().backward()
    # Ops the reader's mode sees in each forward: Linear 0 runs t and addmm, and the memory meter's pack hook
    # detaches the one tensor addmm saves (x, the weight's gradient needs it; x needs none, so w.t() is not
    # saved): 3. Tanh: tanh and a detach of its saved output: 2. Linear 2: t, addmm and a detach of w.t(): its input
    # is Tanh's output, packed just before, whose alias the pack hook hands again (one tensor, one alias): 3. The
    # root: 3 + 2 + 3 = 8 (sum runs after its forward).
    assert [prof.records[name].live_forward_ops for name in ("0", "1", "2", "")] == [3, 2, 3, 8]
    assert prof.profile.meta["timing_distorted_by"] == ["live_memory"]
    # The reader's time per op is measured when the profile is first planned or saved, not as the block ends.
    assert "live_op_ms" not in prof.profile.meta
    again = layerprof.load(io.StringIO(prof.profile.to_json()))
    assert 0 < prof.profile.meta["live_op_ms"] < 1  # tens of µs an op on a 2-core VM
    assert again.records["2"].live_forward_ops == 3 and again.meta["live_op_ms"] == prof.profile.meta["live_op_ms"]
    with LayerProf(model, metrics=("live_memory",)) as clean:
        for _ in range(2):  # the reader counts in the first step, which the times leave out: nothing to take off
            model(x).sum().backward()
            clean.step()
    assert clean.records[""].live_forward_ops == 8 and "live_op_ms" not in clean.profile.meta
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with LayerProf(model, metrics=("memory",)) as plain:
            model(x).sum().backward()
    assert not hasattr(plain.records[""], "live_forward_ops") or plain.records[""].live_forward_ops is None


class _RaisesOnce(nn.Module):
    """A Linear whose first call raises before any op (a caller catches it and calls again)."""

    def __init__(self) -> None:
        super().__init__()
        self.l = nn.Linear(4, 4)
        self.raised = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.raised:
            self.raised = True
            raise ValueError("first call")
        return self.l(x)


class _Retries(nn.Module):
    """Many ops of its own first (the reader's running count is then large), then ``f`` twice: once raising."""

    def __init__(self) -> None:
        super().__init__()
        self.f = _RaisesOnce()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for _ in range(50):
            x = x * 1
        try:
            return self.f(x)
        except ValueError:
            return self.f(x)


def test_a_forward_that_raised_counts_no_ops() -> None:
    # A call whose forward raised never ends: its ops are unknown and count nothing (they read the reader's running
    # count since the block opened before, 50 mul ops and more, which the planner took off the module's price).
    model, x = _Retries(), torch.randn(2, 4, requires_grad=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # one step under a distorting meter
        with LayerProf(model, metrics=("live_memory",)) as prof:
            model(x).sum().backward()
    ops = {name: prof.records[name].live_forward_ops for name in ("", "f", "f.l")}
    # f's one call that returned is f.l's: t, addmm, and the meter's detaches of the two tensors addmm saves (its
    # input, for the weight's gradient, and w.t(), for the input's: x requires grad): 4. The root adds its 50 muls
    # (x * 1 saves no tensor): 54. Before, f read 4 + its raised call's start count (the 50 muls and more).
    assert ops == {"": 54, "f": 4, "f.l": 4}, ops


def test_a_failing_reader_calibration_leaves_its_figure_out(monkeypatch: pytest.MonkeyPatch) -> None:
    # The reader's cost per op is measured when a one-step live profile is first planned: where that fails, the
    # profile keeps every figure of the step and leaves ``live_op_ms`` out (nothing is taken off a plan's prices),
    # instead of the plan raising.
    import layerprof.collect.profiler as profiler

    def broken() -> float:
        raise RuntimeError("no cost per op to measure")

    monkeypatch.setattr(profiler, "live_op_cost", broken)
    model, x = _mlp()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # one step under a distorting meter
        with LayerProf(model, metrics=("live_memory",)) as prof:
            model(x).sum().backward()
    assert "live_op_ms" not in prof.profile.meta
    assert prof.records[""].live_forward_ops == 8  # as in test_ops_counted_per_module_for_the_planner
    assert prof.checkpoint_plan(0.5, wrap_cost=None).saved_bytes_before > 0
    assert "live_op_ms" not in prof.profile.meta and "hook_ms" in prof.profile.meta
    assert "live_op_ms" not in prof.profile.measures  # failed once: not measured again at every plan and save


class _TensorParallelMLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up, self.act, self.down = nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(self.act(self.up(x)))


def _live_figures(model: nn.Module, x: torch.Tensor) -> tuple[dict[str, Any], list[tuple[Any, ...]]]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # one step under a distorting meter
        with LayerProf(model, metrics=("live_memory",)) as prof:
            model(x).sum().backward()
    records = [prof.records[name] for name in ("up", "act", "down")]
    return prof.profile.meta["live_memory"], [(r.cuda_forward_delta_bytes, r.cuda_forward_peak_bytes) for r in records]


def test_tensor_parallel_step_counts_the_shards(tmp_path: Any) -> None:
    # Under parallelize_module (ColwiseParallel / RowwiseParallel) the parameters, activations and gradients are
    # DTensors: the reader skipped ops returning a tensor subclass, and a DTensor's own storage is a placeholder
    # (freed as soon as read), so up and down read 0 and the step's peak 264 bytes. Their local shards hold the data.
    dist = pytest.importorskip("torch.distributed")
    if not dist.is_available() or not dist.is_gloo_available() or dist.is_initialized():
        pytest.skip("needs a gloo group of this process's own")
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
    torch.manual_seed(0)
    plain, x = _TensorParallelMLP(), torch.randn(4, 8)
    parallel = _TensorParallelMLP()
    parallel.load_state_dict(plain.state_dict())
    dist.init_process_group("gloo", store=dist.FileStore(str(tmp_path / "store"), 1), rank=0, world_size=1)
    try:
        plan = {"up": ColwiseParallel(), "down": RowwiseParallel()}
        parallelize_module(parallel, init_device_mesh("cpu", (1,)), plan)
        assert type(parallel.up.weight).__name__ == "DTensor"
        step, calls = _live_figures(parallel, x)
    finally:
        dist.destroy_process_group()
    # up's output [4, 16] float32: 256 bytes, GELU's 256, down's [4, 8]: 128, as in the plain model's step
    assert calls == [(256, 256), (256, 256), (128, 128)]
    assert (step, calls) == _live_figures(plain, x)
    # the gradients left at the end: 8 * 16 + 16 + 16 * 8 + 8 = 280 float32
    assert step["step_end_bytes"] == 280 * 4


def test_a_sparse_tensor_made_in_the_step_counts_its_indices_and_values() -> None:
    # A sparse tensor has no storage of its own: one made in the step (x.to_sparse() in a forward) counted 0.
    x, kept = torch.eye(6), []
    reader = read_step(lambda: kept.append(x.to_sparse()))
    assert (reader.current, reader.peak) == (2 * 6 * 8 + 6 * 4,) * 2  # indices [2, 6] int64, values [6] float32
