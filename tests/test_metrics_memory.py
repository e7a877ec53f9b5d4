"""The memory meter: activation and saved bytes on CPU with exact numbers, checkpointing, no_grad, and the CUDA
delta/peak logic driven by a fake allocator (plus a real CUDA check where a GPU exists)."""
from __future__ import annotations

import gc
import warnings
from typing import Any

import pytest
import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from layerprof import LayerProf
from layerprof.metrics import memory
from layerprof.metrics.memory import MEMORY_FIELDS, MemoryMeter, MemoryReader, PeakLog
from layerprof.render.footer import summary_footer

from .conftest import hook_state

torchvision = pytest.importorskip("torchvision")
transformers = pytest.importorskip("transformers")

INCLUSIVE = ("activation_bytes", "saved_bytes")


def _profile(model: nn.Module, x: torch.Tensor, backward: bool = True) -> LayerProf:
    with LayerProf(model, metrics=("memory",)) as prof:
        out = model(x)
        if backward:
            out.sum().backward()
    return prof


def _check_sums(prof: LayerProf) -> None:
    """Children <= parent for inclusive fields; the self parts add up to the root's inclusive totals."""
    records = prof.records
    for record in records.values():
        if record.calls == 0:
            continue  # a container that is never called (ModuleList) has no numbers of its own
        for child in record.children:
            for field in INCLUSIVE:
                if getattr(child, field) is not None:
                    assert getattr(child, field) <= getattr(record, field), (record.name, child.name, field)
    root = prof.tree
    assert sum(r.self_saved_bytes or 0 for r in records.values()) == root.saved_bytes
    assert sum(r.self_activation_bytes or 0 for r in records.values()) == root.activation_bytes


def test_linear_saves_its_input_and_relu_its_output() -> None:
    model = nn.Sequential(nn.Linear(10, 20), nn.ReLU())
    prof = _profile(model, torch.randn(4, 10))
    linear, relu, root = prof.records["0"], prof.records["1"], prof.tree
    # Linear saves its input for the weight gradient: 4*10 float32 = 160 B (the weight is a parameter: not counted).
    assert linear.saved_bytes == linear.self_saved_bytes == 4 * 10 * 4 == 160
    # ReLU saves its output for threshold_backward: 4*20*4 = 320 B.
    assert relu.saved_bytes == 4 * 20 * 4 == 320
    assert root.saved_bytes == 160 + 320 and root.self_saved_bytes == 0
    # Each returns a new [4, 20] tensor: 320 B of activations each; the root returns ReLU's, counted there.
    assert linear.activation_bytes == relu.activation_bytes == 320
    assert root.activation_bytes == 640 and root.self_activation_bytes == 0
    assert all(getattr(root, field) is None for field in memory.CUDA_FIELDS)  # not measured on CPU
    assert MemoryMeter.distorts_timing


class _BuildsItsHead(nn.Module):
    """A head made in the first call (a lazily built module: it joins the profile as it is registered)."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Linear(64, 64)
        self.head: nn.Module | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.body(x)
        if self.head is None:
            self.head = nn.Linear(64, 512)
        return self.head(h)


@pytest.mark.parametrize("metrics", [("memory",), ("live_memory",), ("shapes",)])
def test_a_module_made_while_profiling_and_a_lazy_module_are_measured(metrics: tuple[str, ...]) -> None:
    # Before: the meters kept the names they started with, and the block's exit raised KeyError('head') (memory) or
    # left the head without shape fields; a LazyLinear not yet run made the memory meters raise as the block began
    # (its parameter has no storage). Their parameters, made in the block, are the model's, not saved tensors.
    torch.manual_seed(0)
    model = _BuildsItsHead()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (one step with a meter that slows it)
        with LayerProf(model, metrics=metrics) as prof:
            model(torch.randn(8, 64)).sum().backward()
        lazy = nn.Sequential(nn.LazyLinear(32), nn.ReLU(), nn.Linear(32, 1))
        with LayerProf(lazy, metrics=metrics) as lazy_prof:
            lazy(torch.randn(4, 16)).sum().backward()
    head, first = prof.records["head"], lazy_prof.records["0"]
    if metrics == ("shapes",):
        assert head.input_shapes == [[8, 64]] and head.output_shapes == [[8, 512]]
        assert first.input_shapes == [[4, 16]] and first.output_shapes == [[4, 32]]
        return
    # The head saves its input, 8*64 float32 = 2,048 B; its weight (512*64*4 = 131,072 B), made in the block, is a
    # parameter. The LazyLinear saves its input, 4*16*4 = 256 B, and the ReLU its output, 4*32*4 = 512 B.
    assert head.saved_bytes == 8 * 64 * 4 == 2048
    assert prof.tree.saved_bytes == 2048 + 2048  # (the body's input too)
    assert first.saved_bytes == 4 * 16 * 4 and lazy_prof.records["1"].saved_bytes == 4 * 32 * 4
    assert lazy_prof.tree.saved_bytes == 256 + 512


def test_a_storage_saved_twice_counts_once() -> None:
    model = nn.Sequential(nn.Linear(10, 20), nn.ReLU(), nn.Linear(20, 5))
    prof = _profile(model, torch.randn(4, 10, requires_grad=True))
    # The second Linear saves its input, ReLU's output, which ReLU already saved: 0 more. The first Linear also
    # saves weight.t(), a view of a parameter: not counted. 160 + 320 = 480 B.
    assert prof.records["2"].saved_bytes == 0
    assert prof.tree.saved_bytes == 480
    # New outputs: 320 (Linear) + 320 (ReLU) + 4*5*4 = 80 (Linear) = 720 B.
    assert prof.tree.activation_bytes == 720
    _check_sums(prof)


def test_inplace_relu_creates_no_activation() -> None:
    model = nn.Sequential(nn.Linear(10, 20), nn.ReLU(inplace=True))
    prof = _profile(model, torch.randn(4, 10))
    relu = prof.records["1"]
    assert relu.activation_bytes == 0  # it returns its input's storage
    assert relu.saved_bytes == 320  # relu_ saves its result, the Linear's output storage
    assert prof.tree.activation_bytes == 320


class Checkpointed(nn.Module):
    def __init__(self, mode: str) -> None:
        super().__init__()
        self.block = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 8))
        self.head = nn.Linear(8, 1)
        self.mode = mode

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.mode == "none":
            return self.head(self.block(x))
        return self.head(checkpoint(self.block, x, use_reentrant=self.mode == "reentrant"))


@pytest.mark.parametrize("mode", ["non_reentrant", "reentrant"])
def test_checkpointing_reduces_saved_bytes(mode: str) -> None:
    x = torch.randn(4, 8, requires_grad=True)
    plain = _profile(Checkpointed("none"), x)
    # block.0 saves x: 4*8*4 = 128 B; block.1 (ReLU) its output: 4*16*4 = 256 B; block.2's input is that same
    # storage: 0; head saves its input: 4*8*4 = 128 B. 128 + 256 + 128 = 512 B.
    assert plain.records["block"].saved_bytes == 384 and plain.tree.saved_bytes == 512
    ckpt = _profile(Checkpointed(mode), x)
    # Checkpointed: the block saves nothing; checkpoint keeps x (128 B) to recompute it; head 128 B. 256 B.
    assert ckpt.records["block"].saved_bytes == 0 and ckpt.records["block.1"].saved_bytes == 0
    assert ckpt.records["block"].recompute_ms is not None
    assert ckpt.tree.saved_bytes == 256 < plain.tree.saved_bytes
    assert ckpt.tree.self_saved_bytes == 128
    assert ckpt.tree.activation_bytes == plain.tree.activation_bytes  # the forward returns the same tensors


class CheckpointedSelfAttention(nn.Module):
    """A model that checkpoints its own attention call, as self-attention: the same tensor as query, key, value."""

    def __init__(self) -> None:
        super().__init__()
        self.attn = nn.MultiheadAttention(8, 2, batch_first=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return checkpoint(self.attn, x, x, x, use_reentrant=False)[0]


@pytest.mark.parametrize("metrics", [("memory",), ("live_memory",)])
def test_a_tensor_saved_in_slots_in_a_row_unpacks_as_one(metrics: tuple[str, ...]) -> None:
    # checkpoint saves its inputs x, x, x; unpacked as three objects, the recomputation would take
    # MultiheadAttention's other path (it tests ``query is key``) and torch raises a CheckpointError. The pack hook
    # hands one alias for the three, which autograd unpacks as one object where x needs no grad.
    torch.manual_seed(0)
    model = CheckpointedSelfAttention()
    x = torch.randn(2, 5, 8)
    model(x).sum().backward()
    expected = [p.grad.clone() for p in model.parameters()]
    model.zero_grad(set_to_none=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # one step under a distorting meter
        with LayerProf(model, metrics=metrics) as prof:
            model(x).sum().backward()
    got = [p.grad for p in model.parameters()]
    assert all(torch.equal(a, b) for a, b in zip(got, expected))
    assert prof.records["attn"].recompute_ms is not None
    # Where x needs grad autograd unpacks each slot as a new object whatever the hook hands (torch's save_on_cpu
    # fails the same way): the error says why, and what to do
    x.requires_grad_(True)
    with pytest.raises(torch.utils.checkpoint.CheckpointError) as raised:
        with LayerProf(model, metrics=metrics):
            model(x).sum().backward()
    assert any("query is key" in note and "checkpoint(lambda x: attn(x, x, x), x)" in note
               for note in raised.value.__notes__)


def test_a_recomputation_that_runs_other_code_is_not_blamed_on_the_meter_alone() -> None:
    # Under torch.nn.utils.parametrize.cached(), the second call reads the cached orthogonal weight while its
    # recomputation in backward, outside the cache, computes it afresh: torch raises a CheckpointError with or
    # without layerprof. The note said only that the memory meter's saved-tensor hooks were the cause, and to
    # profile without it, which raises the same.
    torch.manual_seed(0)
    layer = nn.utils.parametrizations.orthogonal(nn.Linear(6, 6))
    x = torch.randn(3, 6)

    def step() -> None:
        with nn.utils.parametrize.cached():
            out = checkpoint(layer, x, use_reentrant=False) + checkpoint(layer, 2 * x, use_reentrant=False)
        out.sum().backward()

    with pytest.raises(torch.utils.checkpoint.CheckpointError):
        step()  # torch's own limitation, no profiler
    with pytest.raises(torch.utils.checkpoint.CheckpointError) as raised:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # one step under a distorting meter
            with LayerProf(layer, metrics=("memory",)):
                step()
    notes = [note for note in raised.value.__notes__ if "saved-tensor hooks" in note]
    assert len(notes) == 1 and "without the metric too" in notes[0] and "parametrize.cached()" in notes[0]


def test_torch_func_under_the_memory_meter_says_why_it_raises() -> None:
    model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))
    params = {name: value.detach() for name, value in model.named_parameters()}

    def loss(p: dict[str, torch.Tensor], x: torch.Tensor) -> torch.Tensor:
        return torch.func.functional_call(model, p, (x.unsqueeze(0),)).squeeze()

    per_sample = torch.func.vmap(torch.func.grad(loss), in_dims=(None, 0))
    before = hook_state(model)
    with pytest.raises(RuntimeError, match="saved tensor hooks") as raised:
        with LayerProf(model, metrics=("memory",)):
            per_sample(params, torch.randn(4, 8))
    assert any("metrics=('memory',) counts what autograd saves with saved-tensor hooks" in note
               and "'flops' and 'shapes' work there" in note for note in raised.value.__notes__)
    assert hook_state(model) == before
    with LayerProf(model, metrics=("shapes",)) as prof:  # the same code, profiled without the meter
        per_sample(params, torch.randn(4, 8))
    assert prof.tree.calls == 1


@pytest.mark.parametrize("mode", [torch.no_grad, torch.inference_mode])
def test_forward_only(mode: Any) -> None:
    model = nn.Sequential(nn.Linear(10, 20), nn.ReLU())
    with mode():
        prof = _profile(model, torch.randn(4, 10), backward=False)
    assert prof.tree.saved_bytes == 0  # nothing is saved without a graph
    assert prof.tree.activation_bytes == 640


def test_real_models_gradients_unchanged_and_sums() -> None:
    model = torchvision.models.resnet18(weights=None)
    x = torch.randn(2, 3, 32, 32)
    torch.manual_seed(0)
    model(x).sum().backward()
    expected = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    with LayerProf(model, metrics=("memory",)) as prof:
        model(x).sum().backward()
    assert all(torch.equal(p.grad, g) for p, g in zip(model.parameters(), expected))
    _check_sums(prof)
    # The first conv saves the input images, 2*3*32*32 float32 = 24576 B (its weight is a parameter).
    assert prof.records["conv1"].saved_bytes == 2 * 3 * 32 * 32 * 4
    # The in-place ReLUs return their input: no activation of their own.
    assert prof.records["relu"].activation_bytes == 0 and prof.records["layer1.0.relu"].activation_bytes == 0
    footer = summary_footer(prof.tree)
    assert footer.startswith("Activations: ") and footer.count("' (") == 3  # the three largest savers


def test_gpt2_sums_and_footer() -> None:
    config = transformers.GPT2Config(vocab_size=100, n_embd=32, n_layer=2, n_head=2, n_positions=32)
    model = transformers.GPT2LMHeadModel(config)
    ids = torch.randint(0, 100, (2, 8))
    with LayerProf(model, metrics=("params", "memory")) as prof:
        model(input_ids=ids, labels=ids).loss.backward()
    _check_sums(prof)
    # Embedding saves its int64 indices for the backward: 2*8*8 = 128 B.
    assert prof.records["transformer.wte"].self_saved_bytes == 2 * 8 * 8
    text = prof.layerwise_summary(columns=("saved_bytes",), footer=True)
    assert "Model size: " in text and "saved for backward; most saved: " in text


def test_inplace_change_of_a_saved_tensor_still_raises() -> None:
    layer = nn.Linear(4, 4)
    with LayerProf(layer, metrics=("memory",)):
        y = torch.exp(layer(torch.randn(2, 4)))  # exp saves its output
        y.add_(1)
        with pytest.raises(RuntimeError, match="modified by an inplace operation"):
            y.sum().backward()


def test_hooks_chain_and_come_off() -> None:
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU())
    before = hook_state(model)
    packed = []

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        packed.append(tensor.shape)
        return tensor.detach()

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        with LayerProf(model, metrics=("memory",)) as prof:
            model(torch.randn(2, 4)).sum().backward()
        assert len(packed) == 2  # the hooks installed before profiling still ran (Linear input, ReLU output)
    assert prof.tree.saved_bytes == 2 * 4 * 4 + 2 * 4 * 4
    assert torch._C._autograd._top_saved_tensors_default_hooks(False) is None
    with pytest.raises(ValueError):
        with LayerProf(model, metrics=("memory",)):
            raise ValueError("boom")
    assert torch._C._autograd._top_saved_tensors_default_hooks(False) is None
    assert hook_state(model) == before


def test_fields_present_only_when_on() -> None:
    model = nn.Linear(2, 2)
    with LayerProf(model, metrics=("memory",)) as prof:
        model(torch.randn(1, 2))
    assert all(field in prof.to_dict()[""] for field in MEMORY_FIELDS)
    with LayerProf(model) as prof:
        model(torch.randn(1, 2))
    assert "saved_bytes" not in prof.to_dict()[""]


# -- the CUDA path, driven on CPU by a fake allocator --------------------------------------------------------
class FakeAllocator(MemoryReader):
    """Counts bytes that the test modules "allocate"; covers the CPU so the CUDA logic runs here."""

    def __init__(self) -> None:
        self.current = self.peak = 0
        self.reads = 0

    def malloc(self, size: int) -> None:
        self.current += size
        self.peak = max(self.peak, self.current)

    def free(self, size: int) -> None:
        self.current -= size

    def covers(self, device: str) -> bool:
        return device == "cpu"

    def read(self, device: str) -> tuple[int, int]:
        self.reads += 1
        return self.current, self.peak

    def reset_peak(self, device: str) -> None:
        self.peak = self.current


ALLOCATOR = FakeAllocator()


class _Spend(torch.autograd.Function):
    """Identity that allocates ``keep`` bytes (and briefly ``temp`` more) in forward and in backward."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, keep: int, temp: int) -> torch.Tensor:
        ctx.keep, ctx.temp = keep, temp
        ALLOCATOR.malloc(temp)
        ALLOCATOR.free(temp)
        ALLOCATOR.malloc(keep)
        return x.clone()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        ALLOCATOR.malloc(ctx.temp)
        ALLOCATOR.free(ctx.temp)
        ALLOCATOR.malloc(ctx.keep)
        return grad, None, None


class Spend(nn.Module):
    def __init__(self, keep: int, temp: int) -> None:
        super().__init__()
        self.keep, self.temp = keep, temp

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _Spend.apply(x, self.keep, self.temp)


def test_cuda_logic_nested_deltas_and_peaks(monkeypatch: pytest.MonkeyPatch) -> None:
    global ALLOCATOR
    ALLOCATOR = FakeAllocator()
    monkeypatch.setattr(MemoryMeter, "reader_factory", lambda: ALLOCATOR)
    model = nn.Sequential(Spend(keep=100, temp=1000), Spend(keep=50, temp=300))
    with LayerProf(model, metrics=("memory",)) as prof:
        model(torch.randn(2, requires_grad=True)).sum().backward()
    first, second, root = prof.records["0"], prof.records["1"], prof.tree
    # Forward: '0' starts at 0, peaks at 1000, ends at 100; '1' starts at 100, peaks at 400 (+300), ends at 150.
    assert (first.cuda_forward_delta_bytes, first.cuda_forward_peak_bytes) == (100, 1000)
    assert (second.cuda_forward_delta_bytes, second.cuda_forward_peak_bytes) == (50, 300)
    # The root saw both: +150 at the end, and '0''s peak of 1000 although the counter was reset since.
    assert (root.cuda_forward_delta_bytes, root.cuda_forward_peak_bytes) == (150, 1000)
    # Backward runs '1' then '0', from 150: '1' +300 then keeps 50 (peak 300); '0' starts at 200, +1000 then keeps
    # 100 (peak 1000); the root: +150 at the end, peak 50 + 1000 = 1050 above its start.
    assert (second.cuda_backward_delta_bytes, second.cuda_backward_peak_bytes) == (50, 300)
    assert (first.cuda_backward_delta_bytes, first.cuda_backward_peak_bytes) == (100, 1000)
    assert (root.cuda_backward_delta_bytes, root.cuda_backward_peak_bytes) == (150, 1050)
    # Without the profile's meta the line names both cases; with it, the one the profile has (the fake allocator
    # read the CPU's calls here, as live_memory does).
    assert "Allocated above the start (CUDA; CPU with live_memory): forward peak 1000 B, backward peak 1.03 KiB." in summary_footer(root)
    assert prof.profile.meta["memory"]["device"] == "cpu"
    assert ("Allocated above the start (CPU, live_memory): forward peak 1000 B, backward peak 1.03 KiB."
            in prof.profile.layerwise_summary(footer=True))


@pytest.mark.parametrize("meta,named", [
    ({"clock": ["cuda_event", "wall"], "memory": {"device": "cuda:0"}}, "CUDA"),
    ({"clock": ["cuda_sync", "wall"]}, "CUDA"),  # no step peak read, a call on a CUDA clock
    ({"clock": ["wall"], "live_memory": {"device": "cpu"}}, "CPU, live_memory"),
    ({"clock": ["cuda_event", "wall"], "live_memory": {"device": "cpu"}}, "CUDA and CPU, live_memory"),
    ({"clock": ["wall"]}, "CUDA; CPU with live_memory"),  # the meta does not say: both named
    (None, "CUDA; CPU with live_memory"),
])
def test_the_peaks_line_names_where_they_were_read(meta, named) -> None:
    from layerprof.render.footer import allocated_where

    assert allocated_where(meta) == named


def test_peak_log_answers_any_start() -> None:
    reader = FakeAllocator()
    log = PeakLog(reader, "cpu")
    marks = []
    for size in (500, -400, 50, 200, -300):
        mark, _ = log.boundary()
        marks.append(mark)
        reader.malloc(size) if size > 0 else reader.free(-size)
    log.boundary()
    # Allocated after each step: 500, 100, 150, 350, 50. The peak since a boundary is the most allocated from that
    # boundary on, including what was allocated at it: since the 2nd, 500 (held until the free that followed).
    assert [log.peak_since(mark) for mark in marks] == [500, 500, 350, 350, 350]
    assert len(log.peaks) <= 2  # only the decreasing run is kept


def test_real_cuda_forward_delta(cuda: torch.device) -> None:
    layer = nn.Linear(256, 1024, device=cuda)
    x = torch.randn(64, 256, device=cuda)
    with torch.no_grad():
        layer(x)  # warm up cuBLAS, whose workspace would otherwise show in the first call
        with LayerProf(layer, metrics=("memory",)) as prof:
            y = layer(x)
    # The output, 64*1024 float32 = 262144 B, a multiple of the allocator's 512-byte blocks.
    assert prof.tree.cuda_forward_delta_bytes == 64 * 1024 * 4
    assert prof.tree.cuda_forward_peak_bytes >= prof.tree.cuda_forward_delta_bytes
    del y
    model = nn.Sequential(nn.Linear(256, 1024), nn.ReLU(), nn.Linear(1024, 8)).to(cuda)
    with LayerProf(model, metrics=("memory",)) as prof:
        model(x).sum().backward()
    for record in prof.records.values():
        assert record.cuda_backward_peak_bytes is not None and record.cuda_backward_peak_bytes >= 0
        for child in record.children:
            assert child.cuda_forward_peak_bytes <= record.cuda_forward_peak_bytes
    gc.collect()


@pytest.mark.parametrize("metrics", [("memory",), ("live_memory",)])
def test_a_lazy_module_with_buffers_is_measured(metrics: tuple[str, ...]) -> None:
    # A LazyBatchNorm2d not yet run made the memory meters raise as the block began: its running statistics were
    # read for their version while still uninitialized buffers.
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.LazyBatchNorm2d(), nn.ReLU())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (one step with a meter that slows it)
        with LayerProf(model, metrics=metrics) as prof:
            model(torch.randn(2, 3, 8, 8)).sum().backward()
    assert prof.records["1"].calls == 1 and prof.records["1"].saved_bytes is not None
    assert model[1].running_mean.shape == (4,)  # (made by its first call, its lazy hook gone with it)


def test_live_memory_on_the_meta_device_says_its_readings_mean_nothing() -> None:
    # A model and input on meta (memory estimated without allocating): live_memory read 0 B peaks "(CPU)" and said
    # nothing. The saved bytes, counted from sizes, hold: 64 * 256 * 4 = 65,536 B saved by the first Linear.
    with torch.device("meta"):
        model = nn.Sequential(nn.Linear(256, 1024), nn.ReLU(), nn.Linear(1024, 8))
    with pytest.warns(RuntimeWarning, match="live_memory ran on a model and an input on the meta device"):
        with LayerProf(model, metrics=("live_memory",)) as prof:
            model(torch.randn(64, 256, device="meta")).sum().backward()
    assert prof.records["0"].saved_bytes == 64 * 256 * 4


class _FastWeights(nn.Module):
    """A weight made in the forward (a hypernetwork's, MAML's fast weights), used directly or put in a Linear's
    parameter table by ``torch.func.functional_call``."""

    def __init__(self, functional: bool) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.functional = functional
        self.w = nn.Parameter(torch.randn(256, 256))
        self.lin = nn.Linear(256, 256, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        fast = self.w * 2.0
        if self.functional:
            return torch.func.functional_call(self.lin, {"weight": fast}, (x,))
        return torch.nn.functional.linear(x, fast)


def test_a_weight_made_in_the_forward_is_saved_however_it_is_passed() -> None:
    """A tensor made in the step and put in a module's parameter table (functional_call) is an activation, not a
    parameter: the second reading found it counted 0 once parameters put on a module as its call began (FSDP2's
    gathered ones, leaf nn.Parameters) were taken as weights."""
    x = torch.randn(8, 256, requires_grad=True)
    figures = []
    for functional in (False, True):
        model = _FastWeights(functional)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with LayerProf(model, metrics=("memory",)) as prof:
                model(x).sum().backward()
        root = prof.records[""]
        figures.append((root.saved_bytes, root.checkpoint_freed_bytes))
    # x (8 x 256 x 4 = 8,192 B) and the fast weight (256 x 256 x 4 = 262,144 B), saved by the matmul
    assert figures[0] == figures[1] == (270_336, 262_144)


@pytest.mark.parametrize("mode", [torch.no_grad, torch.inference_mode])
def test_a_module_returning_its_input_makes_no_activation_without_grad(mode: Any) -> None:
    """Under no_grad a call's inputs are still what tells a returned input from a new tensor (the second reading:
    an Identity read 8,192 bytes of activation under no_grad once the inputs of such calls were dropped)."""
    model = nn.Sequential(nn.Identity(), nn.ReLU(inplace=True), nn.Flatten(), nn.Linear(2048, 128))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with mode(), LayerProf(model, metrics=("memory",)) as prof:
            model(torch.randn(1, 2048))
    assert prof.records["0"].activation_bytes == 0 and prof.records["1"].activation_bytes == 0
    assert prof.records[""].activation_bytes == 128 * 4  # the Linear's output alone
