"""Lightning runs as users meet them: an exception or an interrupt mid-run or at an epoch's end, a graceful stop,
fit twice, validate alone, max_steps with accumulation, and the root's times when training_step never calls the
LightningModule or calls it under DDP. Real Trainers on CPU, a few batches each."""
from __future__ import annotations

import os
import signal
import socket
import time
from pathlib import Path
from unittest import mock

import pytest
import torch
from torch import nn

import layerprof
from layerprof import LayerProf
from layerprof.collect.profiler import _PROFILED

from .conftest import hook_state

pl = pytest.importorskip("lightning.pytorch")
from layerprof.integrations.lightning import LayerProfProfiler  # noqa: E402


class Net(pl.LightningModule):
    """``training_step`` calls ``self.net(x)`` (the LightningModule itself is never called), or ``self(x)``; it
    raises ``error`` at batch ``fail_at``, or asks the trainer to stop after batch ``stop_at``."""

    def __init__(self, call_self: bool = False) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
        self.call_self = call_self
        self.fail_at: int | None = None
        self.error: type[BaseException] = ValueError
        self.stop_at: int | None = None
        self.fail_on_train_end = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def training_step(self, batch, batch_idx):
        if batch_idx == self.fail_at:
            raise self.error("bad batch")
        if batch_idx == self.stop_at:
            self.trainer.should_stop = True
        x, y = batch
        return nn.functional.mse_loss(self(x) if self.call_self else self.net(x), y)

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val", nn.functional.mse_loss(self.net(x), y))

    def on_train_end(self) -> None:
        if self.fail_on_train_end:
            raise RuntimeError("failed after training")

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


class Failing(torch.utils.data.Dataset):
    """Item ``fail_at`` raises IndexError, as a dataset with a bad index does."""

    def __init__(self, items: int, fail_at: int | None = None) -> None:
        generator = torch.Generator().manual_seed(1)
        self.x, self.y = torch.randn(items, 8, generator=generator), torch.randn(items, 1, generator=generator)
        self.fail_at = fail_at

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, index: int):
        if index == self.fail_at:
            raise IndexError(f"item {index} is missing")
        return self.x[index], self.y[index]


def _loader(batches: int, fail_at_item: int | None = None) -> torch.utils.data.DataLoader:
    return torch.utils.data.DataLoader(Failing(4 * batches, fail_at_item), batch_size=4)  # no shuffle


def _trainer(tmp_path: Path, profiler: LayerProfProfiler | None, **options) -> pl.Trainer:
    options = {"max_epochs": 1, "limit_val_batches": 0, **options}
    return pl.Trainer(profiler=profiler, default_root_dir=tmp_path, logger=False, enable_checkpointing=False,
                      enable_progress_bar=False, enable_model_summary=False, accelerator="cpu", **options)


def _hooks(module: nn.Module) -> dict:
    # Every hook dict of every module (not the attributes: a fit sets Lightning's own on the LightningModule).
    return {name: state[:-1] for name, state in hook_state(module).items()}


def _clean(module: nn.Module, before: dict) -> None:
    assert _hooks(module) == before  # every hook off
    assert not _PROFILED


# -- an exception in the middle ------------------------------------------------------------------------------------
def test_an_exception_in_training_step_writes_a_partial_profile_and_frees_the_model(tmp_path: Path) -> None:
    module = Net()
    before = _hooks(module)
    module.fail_at = 3
    profiler = LayerProfProfiler()
    with pytest.raises(ValueError, match="bad batch"):
        _trainer(tmp_path, profiler).fit(module, _loader(6))
    _clean(module, before)
    saved = layerprof.load(tmp_path / "layerprof-rank0.json")  # batches 0, 1, 2 completed; batch 3 is dropped
    assert saved.meta["steps"] == 3 and saved.meta["partial"] == "ValueError raised in a training batch"
    assert saved.records["net.0"].calls == 1
    text = (tmp_path / "layerprof-rank0.txt").read_text()
    assert text.startswith("Partial profile (3 steps recorded): ValueError raised in a training batch.\nStep:")
    # A user retries with a fresh profiler: the model is free, and this run is whole.
    module.fail_at = None
    again = LayerProfProfiler(dirpath=tmp_path / "again")
    _trainer(tmp_path, again).fit(module, _loader(4))
    assert again.profile_result.meta["steps"] == 4 and "partial" not in again.profile_result.meta
    _clean(module, before)


class _InPlaceGate(nn.Module):
    """The everyday backward error: sigmoid's saved output changed in place (from batch ``fail_at`` on)."""

    def __init__(self) -> None:
        super().__init__()
        self.fail_at: int | None = None
        self.batch = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate = torch.sigmoid(x)
        return gate.mul_(2) if self.batch == self.fail_at else gate * 2


class _GateNet(Net):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(8, 16), _InPlaceGate(), nn.Linear(16, 1))

    def training_step(self, batch, batch_idx):
        self.net[1].batch = batch_idx
        return super().training_step(batch, batch_idx)


def test_an_error_in_a_batchs_backward_names_its_module_and_writes_a_partial_profile(tmp_path: Path) -> None:
    # As the exception leaving a `with` block is noted: the profiler is told of it in the action it leaves, reads
    # which module's backward raised it before the hooks come off, and writes the batches before it.
    module = _GateNet()
    before = _hooks(module)
    module.net[1].fail_at = 2
    with pytest.raises(RuntimeError, match="modified by an inplace operation") as info:
        _trainer(tmp_path, LayerProfProfiler()).fit(module, _loader(4))
    assert [n for n in getattr(info.value, "__notes__", []) if n.startswith("layerprof")] == [
        "layerprof: raised inside module 'net.1' (_InPlaceGate), during its backward"]
    _clean(module, before)
    saved = layerprof.load(tmp_path / "layerprof-rank0.json")
    assert saved.meta["steps"] == 2 and saved.meta["partial"] == "RuntimeError raised in a training batch"


def test_a_keyboard_interrupt_in_a_batch(tmp_path: Path) -> None:
    module = Net()
    before = _hooks(module)
    module.fail_at, module.error = 2, KeyboardInterrupt
    handler = signal.getsignal(signal.SIGINT)
    try:
        with pytest.raises(SystemExit):  # Lightning's graceful shutdown on Ctrl+C ends with sys.exit(1)
            _trainer(tmp_path, LayerProfProfiler()).fit(module, _loader(6))
    finally:
        signal.signal(signal.SIGINT, handler)  # Lightning ignores SIGINT from then on
    _clean(module, before)
    saved = layerprof.load(tmp_path / "layerprof-rank0.json")
    assert saved.meta["steps"] == 2 and saved.meta["partial"] == "KeyboardInterrupt raised in a training batch"


def test_an_exception_between_batches(tmp_path: Path) -> None:
    module = Net()
    before = _hooks(module)
    with pytest.raises(IndexError, match="item 13"):  # batch 3 (items 12-15) cannot be loaded
        _trainer(tmp_path, LayerProfProfiler()).fit(module, _loader(6, fail_at_item=13))
    _clean(module, before)
    saved = layerprof.load(tmp_path / "layerprof-rank0.json")
    assert saved.meta["steps"] == 3
    assert saved.meta["partial"] == "IndexError raised in the training epoch, between batches"


def test_an_exception_before_any_batch_writes_nothing(tmp_path: Path) -> None:
    module = Net()
    before = _hooks(module)
    module.fail_at = 0
    profiler = LayerProfProfiler()
    with pytest.raises(ValueError):
        _trainer(tmp_path, profiler).fit(module, _loader(2))
    _clean(module, before)
    assert profiler.profile_result is None and not list(tmp_path.glob("layerprof*"))


class FailsAtEpochEnd(pl.Callback):
    """Raises in ``on_train_epoch_end`` of epoch 0, as a callback computing epoch metrics might."""

    def on_train_epoch_end(self, trainer, pl_module) -> None:
        raise RuntimeError("epoch-end metric failed")


@pytest.mark.parametrize("where, batches", [("on_train_epoch_end", 4), ("on_train_end", 8)])
def test_an_exception_outside_the_epochs_batches_writes_a_partial_profile(tmp_path: Path, where: str,
                                                                           batches: int) -> None:
    # Outside the run_training_epoch action, which no action of the profiler sees: Lightning tells the callback the
    # profiler added (on_exception). Epoch 0's end hooks: 4 batches done; on_train_end: 2 epochs of 4 batches.
    module = Net()
    before = _hooks(module)
    module.fail_on_train_end = where == "on_train_end"
    profiler = LayerProfProfiler(dirpath=tmp_path / "prof")
    callbacks = [FailsAtEpochEnd()] if where == "on_train_epoch_end" else []
    with pytest.raises(RuntimeError):
        _trainer(tmp_path, profiler, max_epochs=2, callbacks=callbacks).fit(module, _loader(4))
    assert LayerProf.running_on(module) is None
    _clean(module, before)
    assert sorted(path.name for path in (tmp_path / "prof").iterdir()) == ["layerprof-rank0.json",
                                                                          "layerprof-rank0.txt"]
    saved = layerprof.load(tmp_path / "prof" / "layerprof-rank0.json")
    assert saved.meta["steps"] == batches and saved.records["net.0"].calls == 1
    assert saved.meta["partial"] == "RuntimeError raised outside the training epoch's batches"
    assert [(p.meta["steps"], p.meta["partial"]) for p in profiler.profiles] == [(batches, saved.meta["partial"])]


@pytest.fixture
def untold(monkeypatch: pytest.MonkeyPatch) -> None:
    """Lightning tells the profiler of no exception outside the epoch's batches, as in a worker it started itself
    (ddp_spawn, ddp_fork), whose exception goes to the launching process and no callback."""
    from layerprof.integrations import lightning

    monkeypatch.setattr(lightning._EndOnException, "on_exception", lambda self, trainer, module, exception: None)


def test_an_exception_never_reported_gives_way_to_the_next_profiler(tmp_path: Path, untold: None) -> None:
    # on_train_end raises after the epoch; no action of the profiler sees it, and nothing tells it.
    module = Net()
    before = _hooks(module)
    module.fail_on_train_end = True
    first = LayerProfProfiler(dirpath=tmp_path / "first")
    with pytest.raises(RuntimeError, match="failed after training"):
        _trainer(tmp_path, first).fit(module, _loader(3))
    assert LayerProf.running_on(module) is not None  # still on (its hooks are off between batches)
    module.fail_on_train_end = False
    second = LayerProfProfiler(dirpath=tmp_path / "second")
    _trainer(tmp_path, second).fit(module, _loader(2))  # the first, whose trainer stopped, gives way
    assert first.profile_result.meta["steps"] == 3
    assert first.profile_result.meta["partial"] == "the trainer stopped without ending the profile"
    assert (tmp_path / "first" / "layerprof-rank0.json").exists()
    assert second.profile_result.meta["steps"] == 2
    _clean(module, before)


def test_the_same_profiler_after_a_run_that_was_never_reported_to_have_raised(tmp_path: Path, untold: None) -> None:
    module = Net()
    before = _hooks(module)
    module.fail_on_train_end = True
    profiler = LayerProfProfiler()
    with pytest.raises(RuntimeError, match="failed after training"):
        _trainer(tmp_path, profiler).fit(module, _loader(3))
    module.fail_on_train_end = False
    _trainer(tmp_path, profiler).fit(module, _loader(2))  # the earlier run's profile ends before this one starts
    assert [(p.meta["steps"], p.meta.get("partial")) for p in profiler.profiles] == [
        (3, "the trainer stopped without ending the profile"), (2, None)]
    _clean(module, before)


def test_a_graceful_stop_is_a_whole_profile(tmp_path: Path) -> None:
    module = Net()
    before = _hooks(module)
    module.stop_at = 2
    profiler = LayerProfProfiler()
    _trainer(tmp_path, profiler).fit(module, _loader(6))
    assert profiler.profile_result.meta["steps"] == 3 and "partial" not in profiler.profile_result.meta
    _clean(module, before)


# -- a second run ----------------------------------------------------------------------------------------------------
def test_fit_twice_with_one_profiler_profiles_both(tmp_path: Path) -> None:
    module = Net()
    before = _hooks(module)
    profiler = LayerProfProfiler()
    trainer = _trainer(tmp_path, profiler, max_epochs=1)
    trainer.fit(module, _loader(3))
    _trainer(tmp_path, profiler).fit(module, _loader(2))
    assert [p.meta["steps"] for p in profiler.profiles] == [3, 2]
    assert profiler.profile_result is profiler.profiles[1]
    assert layerprof.load(tmp_path / "layerprof-rank0.json").meta["steps"] == 3
    assert layerprof.load(tmp_path / "layerprof-rank0-2.json").meta["steps"] == 2
    _clean(module, before)


def test_validate_alone_profiles_nothing(tmp_path: Path) -> None:
    module = Net()
    before = _hooks(module)
    profiler = LayerProfProfiler()
    _trainer(tmp_path, profiler, limit_val_batches=2).validate(module, _loader(2), verbose=False)
    assert profiler.profile_result is None and profiler.summary() == ""
    assert not list(tmp_path.glob("layerprof*"))
    _clean(module, before)


def test_max_steps_with_gradient_accumulation(tmp_path: Path) -> None:
    # max_steps counts optimizer steps: 2 steps of 3 accumulated batches are 6 batches, each one layerprof step.
    module = Net()
    before = _hooks(module)
    profiler = LayerProfProfiler()
    trainer = _trainer(tmp_path, profiler, max_steps=2, accumulate_grad_batches=3)
    trainer.fit(module, _loader(10))
    assert trainer.global_step == 2
    assert profiler.profile_result.meta["steps"] == 6 and "partial" not in profiler.profile_result.meta
    _clean(module, before)


def test_the_readme_schedule_records_five_batches(tmp_path: Path) -> None:
    # README: schedule(wait=1, warmup=1, active=5, repeat=1) over 10 batches: batch 0 waits, batch 1 warms up,
    # batches 2-6 are recorded, and with repeat=1 batches 7-9 are not (repeat=0 would start a second cycle and
    # record batch 9 too: 6 batches).
    for repeat, recorded in ((1, 5), (0, 6)):
        profiler = LayerProfProfiler(dirpath=tmp_path,
                                     schedule=layerprof.schedule(wait=1, warmup=1, active=5, repeat=repeat))
        _trainer(tmp_path, profiler, accumulate_grad_batches=2).fit(Net(call_self=True), _loader(10))
        assert profiler.profile_result.meta["steps"] == recorded


# -- the root's times ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("call_self", [False, True], ids=["self.net(x)", "self(x)"])
def test_the_root_carries_the_training_step(tmp_path: Path, call_self: bool) -> None:
    module = Net(call_self=call_self)
    profiler = LayerProfProfiler()
    _trainer(tmp_path, profiler).fit(module, _loader(4))
    profile = profiler.profile_result
    root, net = profile.tree, profile.records["net"]
    # One call per batch either way: a self(x) inside training_step folds into the step's call.
    assert root.calls == 1 and net.calls == 1
    # The root spans the training step (net, then the loss) and the backward pass (the loss's gradient, then net's).
    assert root.forward_ms > net.forward_ms > 0 and root.backward_ms > net.backward_ms > 0
    assert root.self_forward_ms > 0 and root.self_backward_ms > 0
    header = profiler.summary().splitlines()[0]
    assert "—" not in header and header.startswith("Step: forward ")


class Lbfgs(Net):
    """An optimizer that evaluates its closure, so training_step, three times a batch."""

    def configure_optimizers(self):
        return torch.optim.LBFGS(self.parameters(), lr=0.1, max_iter=3)


@pytest.mark.parametrize("call_self", [False, True], ids=["self.net(x)", "self(x)"])
def test_an_optimizer_that_reruns_the_closure_counts_one_root_call_per_batch(tmp_path: Path, call_self: bool) -> None:
    """LBFGS runs training_step three times a batch: a ``self(x)`` in the second and third runs, outside the
    step's call, counted as root calls (3 a batch where the docs say one). Its modules count every run's call, and
    the root holds them (a child never above its parent)."""
    module = Lbfgs(call_self=call_self)
    profiler = LayerProfProfiler()
    _trainer(tmp_path, profiler).fit(module, _loader(4))
    profile = profiler.profile_result
    root, net = profile.tree, profile.records["net"]
    assert profile.meta["steps"] == 4
    assert root.calls == 1  # (was 3 with self(x))
    assert net.calls == 3 and profile.records["net.0"].calls == 3  # max_iter=3: the closure ran three times
    assert root.forward_ms >= net.forward_ms > 0 and root.backward_ms >= net.backward_ms > 0


class BatchClock(pl.Callback):
    """The wall time of each training batch, from on_train_batch_start to on_train_batch_end (around the action)."""

    def __init__(self) -> None:
        self.ms: list[float] = []

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self._start = time.perf_counter()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self.ms.append((time.perf_counter() - self._start) * 1e3)


@pytest.mark.parametrize("call_self", [False, True], ids=["self.net(x)", "self(x)"])
def test_under_ddp_the_root_counts_one_call_per_batch(tmp_path: Path, call_self: bool) -> None:
    # DDP runs training_step through a call of the LightningModule itself (Lightning's forward redirection), so a
    # self(x) in it is a call of the root inside a call of the root: both fold into the step's call.
    if torch.distributed.is_initialized():
        pytest.skip("a process group is already set up in this process")
    module = Net(call_self=call_self)
    before = _hooks(module)
    profiler, clock = LayerProfProfiler(), BatchClock()
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    # Lightning leaves the process group (and the environment it set) to the process: both go after the run, or a
    # later test here that forks DDP workers hangs. It sets torch's thread count for its processes too (the cores
    # over the processes): put back, or later tests in this process run on other threads than the suite's one.
    threads = torch.get_num_threads()
    with mock.patch.dict(os.environ, {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}):
        try:
            _trainer(tmp_path, profiler, strategy="ddp", devices=1, callbacks=[clock]).fit(module, _loader(4))
        finally:
            torch.set_num_threads(threads)
            if torch.distributed.is_initialized():
                torch.distributed.destroy_process_group()
    profile = profiler.profile_result
    root, net = profile.tree, profile.records["net"]
    assert profile.meta["steps"] == 4 and "partial" not in profile.meta
    assert root.calls == 1 and net.calls == 1 and profile.records["net.0"].calls == 1
    # Not lost: the root spans net's forward and backward; not doubled: within the batch (forward, backward, step).
    assert root.forward_ms > net.forward_ms > 0 and root.backward_ms > net.backward_ms > 0
    assert root.forward_ms + root.backward_ms < sum(clock.ms) / len(clock.ms)
    _clean(module, before)


def test_training_is_bitwise_the_same_with_the_profiler(tmp_path: Path) -> None:
    weights = []
    for profiler in (None, LayerProfProfiler()):
        module = Net()
        _trainer(tmp_path, profiler).fit(module, _loader(4))
        weights.append({k: v.clone() for k, v in module.state_dict().items()})
    assert weights[0].keys() == weights[1].keys()
    assert all(torch.equal(weights[0][k], weights[1][k]) for k in weights[0])


class Manual(Net):
    def __init__(self) -> None:
        super().__init__()
        self.automatic_optimization = False

    def training_step(self, batch, batch_idx):
        optimizer = self.optimizers()
        x, y = batch
        loss = nn.functional.mse_loss(self.net(x), y)
        optimizer.zero_grad()
        self.manual_backward(loss)
        optimizer.step()


def test_manual_optimization_the_root_forward_is_the_whole_training_step(tmp_path: Path) -> None:
    module = Manual()
    before = _hooks(module)
    profiler = LayerProfProfiler()
    _trainer(tmp_path, profiler).fit(module, _loader(4))
    root, net = profiler.profile_result.tree, profiler.profile_result.records["net"]
    # training_step runs net's forward, then its backward, then the optimizer: all inside the root's forward.
    assert root.calls == 1 and root.forward_ms > net.forward_ms + net.backward_ms
    assert root.backward_ms == pytest.approx(net.backward_ms)  # the span of its modules' backward
    _clean(module, before)


class Cancelling(Net):
    def training_step(self, batch, batch_idx):
        if batch_idx == 2:  # the user frees the model by hand in the middle of the run
            LayerProf.running_on(self).cancel()
        return super().training_step(batch, batch_idx)


def test_a_profiler_cancelled_by_hand_mid_run(tmp_path: Path) -> None:
    module = Cancelling()
    before = _hooks(module)
    profiler = LayerProfProfiler()
    _trainer(tmp_path, profiler).fit(module, _loader(4))  # training goes on, unprofiled
    assert profiler.profile_result is None and not list(tmp_path.glob("layerprof*"))
    _clean(module, before)


def test_a_retry_from_an_except_block_is_a_whole_profile(tmp_path: Path) -> None:
    # The retry runs while the first error is being handled: that error is not the retry's.
    module = Net()
    before = _hooks(module)
    module.fail_at = 1
    retry = LayerProfProfiler(dirpath=tmp_path / "retry")
    try:
        _trainer(tmp_path, LayerProfProfiler()).fit(module, _loader(3))
    except ValueError:
        module.fail_at = None
        _trainer(tmp_path, retry).fit(module, _loader(3))
    assert retry.profile_result.meta["steps"] == 3 and "partial" not in retry.profile_result.meta
    assert retry.profile_result.tree.calls == 1
    _clean(module, before)


def test_the_profiler_pickles_after_a_run(tmp_path: Path) -> None:
    # ddp_spawn pickles the trainer's profiler to start each run's workers.
    import pickle

    profiler = LayerProfProfiler()
    _trainer(tmp_path, profiler).fit(Net(), _loader(2))
    copy = pickle.loads(pickle.dumps(profiler))
    assert copy.profiles[0].meta["steps"] == 2
