"""The CUDA path on real models: CUDA event clocks, the CUDA memory meter, the FLOPs of CUDA kernels (cuDNN
convolutions, fused attention), plans verified with ``max_memory_allocated``, the CLI with ``--device cuda``.

Skipped where there is no CUDA device (CI has none). On a GPU machine: ``bash benchmarks/gpu_check.sh``."""
from __future__ import annotations

import gc
import time
from typing import Any, Callable, Iterator

import pytest
import torch
from torch import nn

from layerprof import LayerProf, schedule, verify_plan
from layerprof.cli import main

from .checkpoint_zoo import ZOO
from .conftest import hook_state
from .invariants import check_profile, check_truth, count_calls, parameter_modules_have_backward
from .models import scalar_loss
from .zoo_checks import same_step

MODELS = ("resnet50", "bert", "gpt2", "t5")


@pytest.fixture
def deterministic(cuda: torch.device) -> Iterator[torch.device]:
    """cuDNN's deterministic algorithms, so that two plain steps are bitwise the same (restored afterwards)."""
    before = torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark
    torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = True, False
    yield cuda
    torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = before


def _built(name: str, device: torch.device | str) -> tuple[nn.Module, Callable[[], Any]]:
    """A zoo model on ``device`` (tiny scale, training mode) and its repeatable training step."""
    pytest.importorskip("torchvision" if name in ("resnet50", "densenet121") else "transformers")
    torch.manual_seed(0)
    model, inputs = ZOO[name].build("tiny")
    model = model.to(device).train()
    inputs = {key: value.to(device) for key, value in inputs.items()}

    def step() -> tuple[torch.Tensor, list[Any]]:
        model.zero_grad(set_to_none=True)
        torch.manual_seed(1)
        loss = scalar_loss(model(inputs["x"]) if set(inputs) == {"x"} else model(**inputs))
        loss.backward()
        return loss.detach(), [None if p.grad is None else p.grad.clone() for p in model.parameters()]

    return model, step


def _largest_difference(a: Any, b: Any) -> float:
    (loss_a, grads_a), (loss_b, grads_b) = a, b
    pairs = [(loss_a, loss_b), *((p, q) for p, q in zip(grads_a, grads_b) if p is not None)]
    return max(float((p.double() - q.double()).abs().max()) for p, q in pairs)


def _same_as_plain(profiled: Any, plain: Any, twin: Any) -> None:
    """Bitwise the plain step where two plain steps are bitwise the same; else no further from it than they are
    from each other (a kernel with atomics)."""
    if same_step(plain, twin):
        assert same_step(plain, profiled)
    else:
        assert _largest_difference(plain, profiled) <= 2 * _largest_difference(plain, twin)


@pytest.mark.parametrize("name", MODELS)
def test_a_cuda_training_step_is_true(deterministic: torch.device, name: str) -> None:
    model, step = _built(name, deterministic)
    step()  # cuBLAS and cuDNN make their handles and workspaces in the first step
    plain, twin = step(), step()
    before_hooks, before_repr = hook_state(model), repr(model)
    with count_calls(model) as reference, LayerProf(model, metrics=("flops", "memory", "shapes")) as prof:
        torch.cuda.synchronize()
        start = time.perf_counter()
        profiled = step()
        torch.cuda.synchronize()
        wall_ms = (time.perf_counter() - start) * 1e3
    _same_as_plain(profiled, plain, twin)
    assert hook_state(model) == before_hooks and repr(model) == before_repr
    assert prof.profile.meta["clock"] == ["cuda_event", "wall"]  # events for CUDA calls; the CPU clock is kept
    check_profile(prof, model, backward_wall_ms=wall_ms)
    check_truth(prof, model, backward_wall_ms=wall_ms)
    parameter_modules_have_backward(prof, model)
    assert prof.tree.total_ms <= wall_ms
    for record_name, record in prof.records.items():
        assert record.calls == reference[record_name], record_name
    assert prof.unknown_ops() == {}
    root = prof.tree
    assert root.cuda_forward_peak_bytes > 0 and root.cuda_backward_peak_bytes > 0
    for record in prof.records.values():
        for child in record.children if record.calls else ():
            if child.calls and child.cuda_forward_peak_bytes is not None:
                assert child.cuda_forward_peak_bytes <= record.cuda_forward_peak_bytes, child.name


# In training (dropout on) CUDA runs the memory-efficient attention kernel, whose backward recomputes the scores:
# one matmul more than the math path the CPU takes with dropout (2 bmm forward, 4 backward), 2 * b * h * s_q *
# s_k * d_qk FLOPs a call. BERT and GPT-2 (batch 2, 4 heads of 8, 16 tokens): 2*2*4*16*16*8 = 32,768 a layer.
# T5's cross-attention (heads of d_kv 16; its self-attention adds a learned bias and takes the math path on both
# devices): 2*2*4*16*16*16 = 65,536.
FUSED_ATTENTION = {"resnet50": ("", 0), "bert": (".attention.self", 32768), "gpt2": (".attn", 32768),
                   "t5": (".EncDecAttention", 65536)}


@pytest.mark.parametrize("name", MODELS)
def test_cuda_kernels_count_the_flops_of_their_cpu_twins(cuda: torch.device, name: str) -> None:
    """cuDNN's convolutions and the fused attention kernels price as the CPU's kernels do, forward and backward,
    but for the work the fused backward does more (the scores recomputed)."""
    figures = {}
    for device in ("cpu", cuda):
        model, step = _built(name, device)
        with LayerProf(model, metrics=("flops",)) as prof:
            step()
        assert prof.unknown_ops() == {}
        figures[str(device)] = {key: (record.flops_forward, record.flops_backward)
                                for key, record in prof.records.items()}
    suffix, recompute = FUSED_ATTENTION[name]
    assert figures["cpu"][""][0] > 0 and figures["cpu"].keys() == figures[str(cuda)].keys()
    for key, (forward, backward) in figures["cpu"].items():
        fused = sum(1 for other in figures["cpu"] if other.endswith(suffix) and suffix
                    and (not key or other.startswith(key + ".") or other == key))
        expected = backward + fused * recompute if fused and backward is not None else backward
        assert figures[str(cuda)][key] == (forward, expected), key


@pytest.mark.parametrize("name", MODELS)
def test_a_half_plan_on_cuda_measures_as_predicted(deterministic: torch.device, name: str) -> None:
    model, step = _built(name, deterministic)
    step()
    plain, twin = step(), step()
    with LayerProf(model, metrics=("memory", "shapes")) as prof:
        step()
    plan = prof.checkpoint_plan(0.5, allow_side_effects=ZOO[name].allow_side_effects)
    assert plan.feasible and plan.modules
    before_hooks, before_repr = hook_state(model), repr(model)
    result = verify_plan(plan, model, step, repeats=3)
    assert result.measured_saved_bytes == result.predicted_saved_bytes == plan.saved_bytes_after
    assert result.meets_budget and result.cuda_peak_bytes is not None
    with plan.applied(model):
        _same_as_plain(step(), plain, twin)
    assert hook_state(model) == before_hooks and repr(model) == before_repr


def _profiled_at_batch_16(name: str, cuda: torch.device) -> tuple[nn.Module, Callable[[], None], LayerProf]:
    """A zoo transformer at the benchmark's size and batch 16 (activations fill the memory) on ``cuda``, its plain
    training step, and a profile of one step with the memory figures a plan needs.

    The earlier tests' garbage is collected first: ``max_memory_allocated`` counts every tensor alive. On an H100
    (2026-11-26) the profiled step's peak was 9.9 MB above the plain steps' after it in this file's run, so every
    predicted peak was that much high, and equal to the byte in a fresh process; an earlier test's model in a
    reference cycle, collected in between, is the likely cause (not confirmed on a GPU)."""
    pytest.importorskip("transformers")
    gc.collect()
    torch.cuda.empty_cache()
    torch.manual_seed(0)
    model, inputs = ZOO[name].build("bench")
    inputs = {key: value.repeat(8, 1).to(cuda) for key, value in inputs.items()}
    model = model.to(cuda).train()

    def step() -> None:
        model.zero_grad(set_to_none=True)
        scalar_loss(model(**inputs)).backward()

    step()
    with LayerProf(model, metrics=("memory", "shapes")) as prof:
        step()
    return model, step, prof


@pytest.mark.parametrize("name", ("gpt2", "bert"))
def test_the_step_peak_with_a_plan_is_as_predicted_on_cuda(cuda: torch.device, name: str) -> None:
    """``plan.predicted_peak_bytes`` against ``max_memory_allocated`` of a plain step with the plan, at the
    benchmark's size and batch 16; and the fall from today's peak, predicted against measured. The allocator rounds
    blocks to 512 bytes and libraries keep workspaces, both in the profiled step too once warm. On an H100
    (2026-11-26, this test) BERT's predicted peaks were 1.0, 1.4 and 1.8 % high, and its falls 25.0, 36.8 and 65.3 MB
    predicted against 26.5, 38.9 and 67.4 measured; GPT-2's falls 37.7 and 80.2 MB against 37.7 and 82.3, its peaks
    9.9 MB high (the profiled step's peak was, see ``_profiled_at_batch_16``)."""
    model, step, prof = _profiled_at_batch_16(name, cuda)
    assert prof.profile.meta["memory"]["device"].startswith("cuda")
    for budget in (0.75, 0.5, 0.25):
        plan = prof.checkpoint_plan(budget)
        result = verify_plan(plan, model, step, repeats=1)
        assert result.peak_bytes is not None and plan.predicted_peak_bytes is not None
        before, after = result.peak_bytes
        print(f"\n{name} {budget:.0%}: peak {before} -> {after} B measured, {plan.profiled_peak_bytes} -> "
              f"{plan.predicted_peak_bytes} predicted ({plan.predicted_peak_phase} {plan.predicted_peak_at})")
        # Today's peak is the plain step's: the profiler's hooks hold no tensor longer than the step does.
        assert abs(plan.profiled_peak_bytes - before) <= 0.01 * before, (budget, plan.profiled_peak_bytes, before)
        assert abs(after - plan.predicted_peak_bytes) <= 0.05 * after, (budget, after, plan.predicted_peak_bytes)
        predicted_fall = plan.profiled_peak_bytes - plan.predicted_peak_bytes
        assert abs((before - after) - predicted_fall) <= max(0.1 * predicted_fall, 0.02 * before), (
            budget, before - after, predicted_fall)


def test_autocast_on_cuda_counts_the_same_flops_and_changes_no_bit(deterministic: torch.device) -> None:
    model, step = _built("gpt2", deterministic)

    def mixed() -> Any:
        with torch.autocast("cuda", dtype=torch.bfloat16):
            return step()

    mixed()
    plain, twin = mixed(), mixed()
    with LayerProf(model, metrics=("flops", "shapes")) as prof:
        profiled = mixed()
    _same_as_plain(profiled, plain, twin)
    check_profile(prof, model)
    with LayerProf(model, metrics=("flops",)) as full:
        step()
    assert {k: r.flops_forward for k, r in prof.records.items()} == {k: r.flops_forward for k, r in full.records.items()}


def test_the_event_pool_stops_growing_in_a_long_run(cuda: torch.device) -> None:
    """A steady run records into the events of the steps before it: the pool grows in the first profiled step
    only."""
    model, step = _built("bert", cuda)
    prof = LayerProf(model, schedule=schedule(wait=1, active=1))
    sizes = []
    with prof:
        for _ in range(8):
            step()
            prof.step()
            sizes.append(sum(clock.pool_size for clock in prof._tracker.cuda_clocks.values()))
    assert sizes[1] > 0 and sizes[1] == sizes[-1], sizes
    check_truth(prof, model)
    assert prof.tree.steps == 4


def test_a_fresh_block_records_into_the_events_of_the_block_before(cuda: torch.device,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """One-shot use: a fresh ``with LayerProf`` on a model profiled before makes one CUDA event at most (its
    clock's origin, kept by the clock, takes one from the pool) and takes the stamps of its step from the process's
    pool (fuller where earlier tests left events in it: then it makes none)."""
    from layerprof.collect import clock as clock_module

    model, step = _built("bert", cuda)
    step()
    with LayerProf(model):
        step()
    made = [0]
    event_type = torch.cuda.Event

    def counted(*args: Any, **kwargs: Any) -> Any:
        made[0] += 1
        return event_type(*args, **kwargs)

    monkeypatch.setattr(torch.cuda, "Event", counted)
    free = clock_module._POOLS[torch.cuda.current_device() if cuda.index is None else cuda.index]
    before = len(free)
    with LayerProf(model) as prof:
        step()
    assert before > 0 and made[0] <= 1 and len(free) == before - 1 + made[0], (made, before, len(free))
    check_truth(prof, model)


def test_sync_clock_on_a_real_model(cuda: torch.device) -> None:
    model, step = _built("resnet50", cuda)
    step()
    with LayerProf(model, sync=True) as prof:
        torch.cuda.synchronize()
        start = time.perf_counter()
        step()
        wall_ms = (time.perf_counter() - start) * 1e3
    assert prof.profile.meta["clock"] == ["cuda_sync", "wall"]
    check_profile(prof, model, backward_wall_ms=wall_ms)
    check_truth(prof, model, backward_wall_ms=wall_ms)


def test_the_command_on_cuda(cuda: torch.device, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("torchvision")
    assert main(["torchvision.models:resnet18", "--input", "2,3,64,64", "--device", "cuda", "--steps", "2"]) == 0
    out = capsys.readouterr().out
    assert "ResNet" in out and "layer4" in out


def test_the_current_stream_is_made_again_only_when_it_changes() -> None:
    """Without a GPU: the clock's stream lookup follows every change of the raw stream (a ``torch.cuda.stream``
    block, autograd's device thread) and makes a Stream object only then."""
    from layerprof.collect.clock import CurrentStream

    raws = iter([7, 7, 9, 9, 7, 0, 0])
    made: list[int] = []

    def make(index: int) -> str:
        made.append(index)
        return f"stream {len(made)}"

    current = CurrentStream(3, raw=lambda index: next(raws), make=make)
    assert [current() for _ in range(7)] == ["stream 1", "stream 1", "stream 2", "stream 2", "stream 3",
                                             "stream 4", "stream 4"]
    assert made == [3, 3, 3, 3]  # four changes of the raw stream (None -> 7 -> 9 -> 7 -> 0), each on device 3


def test_a_saved_cuda_profile_holds_the_gpus_roofs_and_gates_against_a_second_run(
        cuda: torch.device, tmp_path: Any, capsys: pytest.CaptureFixture[str]) -> None:
    """``to_json`` measures the GPU's roofs where the profile was made (a file read on another machine has no
    others), the file reads back to the same roofline, and two runs on this GPU pass the gate's like-for-like check
    (exit 0 or 1, never 4: same device type, dtype; threads are compared on CPU only)."""
    import layerprof

    model, step = _built("resnet50", cuda)
    step()
    paths = []
    for run in range(2):
        with LayerProf(model, metrics=("flops",), schedule=schedule(active=3)) as prof:
            for _ in range(3):
                step()
                prof.step()
        path = tmp_path / f"run{run}.json"
        prof.profile.to_json(path)
        paths.append(path)
    saved = layerprof.load(paths[0])
    assert saved.meta["peaks"] == layerprof.peaks(cuda)  # measured once per process, for this GPU
    assert saved.meta["peaks"]["device"].startswith("cuda") and saved.meta["peaks"]["flops"] > 1e12
    live = {row["name"]: row["bound"] for row in layerprof.load(paths[1]).roofline()}
    assert live and set(live.values()) <= {"compute", "memory", "overhead"}
    assert "Measured otherwise" not in str(layerprof.compare(saved, layerprof.load(paths[1])))
    capsys.readouterr()
    assert main(["compare", str(paths[0]), str(paths[1]), "--fail-if-slower", "50"]) in (0, 1)
    assert "measured otherwise" not in capsys.readouterr().err.lower()


def test_the_records_hold_the_hosts_forward_beside_the_events_and_plans_price_from_both(cuda: torch.device) -> None:
    """Every CUDA-timed forward has the host's time beside the events' (``host_forward_ms``); a plan's first read
    measures the hooks' host cost on the GPU (``meta["hook_ms"]``) and prices each module from the two
    (``less_hooks``): between the lower of the two times less the hooks inside and the higher of them."""
    from layerprof.plan.candidates import _forward_ms, candidates, descendant_calls, skipped_tail_ms
    from layerprof.record.records import preorder

    model, step = _built("resnet50", cuda)
    step()
    with LayerProf(model, metrics=("memory", "shapes"), warmup=1) as prof:
        for _ in range(3):
            step()
            prof.step()
    timed = [record for record in prof.records.values() if record.calls]
    assert timed and all(record.host_forward_ms is not None and record.host_forward_ms > 0 for record in timed)
    plan = prof.checkpoint_plan(0.5)
    hook_ms = prof.profile.meta["hook_ms"]
    assert plan.hook_ms == hook_ms and 0.0 < hook_ms < 1.0, hook_ms  # ms a module call
    records = preorder(prof.tree)
    index = {id(record): i for i, record in enumerate(records)}
    below = descendant_calls(records, [-1 if r.parent is None else index[id(r.parent)] for r in records])
    checked = 0
    for record, priced, inside in zip(records, candidates(prof.tree, hook_ms=hook_ms), below):
        tail = skipped_tail_ms(record)
        events, host = _forward_ms(record) - tail, record.host_forward_ms_median - tail
        if priced.excluded is None and events > 0.1:
            assert min(events, host) - hook_ms * inside - 1e-9 <= priced.recompute_ms <= max(events, host) + 1e-9
            checked += 1
    assert checked >= 3
