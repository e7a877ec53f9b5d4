"""Distributed runs and the trainer integrations as users meet them: bugs found by a sweep of real use, each with
the smallest run that showed it. Real Trainers on CPU, tiny models."""
from __future__ import annotations

import os
from pathlib import Path
from unittest import mock

import pytest
import torch

from layerprof import LayerProf
from layerprof.collect.profiler import _PROFILED

from .conftest import hook_state

transformers = pytest.importorskip("transformers")
pytest.importorskip("accelerate")
from layerprof.integrations.transformers import LayerProfCallback  # noqa: E402


def _bert() -> torch.nn.Module:
    torch.manual_seed(0)
    config = transformers.BertConfig(vocab_size=100, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                     intermediate_size=32, max_position_embeddings=16)
    return transformers.BertForSequenceClassification(config)


def _tokens() -> list[dict]:
    generator = torch.Generator().manual_seed(0)
    return [{"input_ids": torch.randint(0, 100, (8,), generator=generator), "labels": torch.tensor(i % 2)}
            for i in range(8)]


def _hf_trainer(model, folder: Path, callback: LayerProfCallback, **options):
    args = transformers.TrainingArguments(output_dir=str(folder), use_cpu=True, save_strategy="no", disable_tqdm=True,
                                          report_to=[], per_device_train_batch_size=2, max_steps=2, **options)
    return transformers.Trainer(model=model, args=args, train_dataset=_tokens(), callbacks=[callback])


def test_a_trainer_that_compiles_its_model_is_refused_before_the_first_step(tmp_path: Path) -> None:
    # The Trainer hands its callbacks the eager model but trains torch.compile(model): dynamo traced layerprof's
    # hooks (8 recompilations, a minute on this BERT) and the profile counted compilation as forward time
    # (15 s for the model), without an error.
    model = _bert()
    before = {name: state[:-1] for name, state in hook_state(model).items()}
    callback = LayerProfCallback()
    with pytest.raises(ValueError, match=r"cannot profile a Trainer that compiles its model \(TrainingArguments\("
                                         r"torch_compile=True\).*Profile with torch_compile=False"):
        _hf_trainer(model, tmp_path, callback, torch_compile=True).train()
    assert {name: state[:-1] for name, state in hook_state(model).items()} == before
    assert not _PROFILED
    assert callback.profile is None and not list(tmp_path.glob("layerprof*"))


# -- the ddp_comm meter under a trainer's DDP ----------------------------------------------------------------------
@pytest.fixture
def one_rank_group():
    """A one-process gloo group, so that DistributedDataParallel (and Lightning's DDP strategy) runs in-process."""
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_gloo_available() or dist.is_initialized():
        pytest.skip("needs torch.distributed with gloo and no group already formed")
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        with mock.patch.dict(os.environ):  # Lightning sets MASTER_ADDR/PORT for its DDP strategy
            yield
    finally:
        dist.destroy_process_group()


def test_lightning_ddp_comm_times_the_strategys_ddp_wrapper(tmp_path: Path, one_rank_group: None) -> None:
    # The strategy trains DistributedDataParallel(LightningModule) and hands the profiler the LightningModule: the
    # meter found no DDP model and recorded nothing, with a note saying the model was not DDP.
    pl = pytest.importorskip("lightning.pytorch")
    from lightning.pytorch.strategies import DDPStrategy

    from layerprof.integrations.lightning import LayerProfProfiler

    class Regressor(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))

        def training_step(self, batch, batch_idx):
            x, y = batch
            return torch.nn.functional.mse_loss(self.net(x), y)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.01)

    torch.manual_seed(0)
    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(12, 8), torch.randn(12, 1)),
                                       batch_size=4)
    profiler = LayerProfProfiler(dirpath=tmp_path, metrics=("ddp_comm",))
    trainer = pl.Trainer(max_epochs=1, profiler=profiler, strategy=DDPStrategy(), accelerator="cpu", devices=1,
                         logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False)
    trainer.fit(Regressor(), data)
    comm = profiler.profile_result.meta["ddp_comm"]
    assert "note" not in comm
    assert comm["steps"] == 3 and comm["buckets"] == 1.0  # 3 batches, one all-reduce bucket each (81 parameters)
    assert all(step["comm_ms"] is not None for step in comm["per_step"])


def test_ddp_comm_told_of_a_wrapper_that_does_not_wrap_the_model_notes_it(one_rank_group: None) -> None:
    from layerprof.distributed.comm import time_ddp_wrapper

    wrapped, other = torch.nn.Linear(4, 4), torch.nn.Linear(4, 4)
    ddp = torch.nn.parallel.DistributedDataParallel(wrapped)
    prof = LayerProf(other, metrics=("ddp_comm",))
    time_ddp_wrapper(prof.metrics, ddp)
    with pytest.warns(RuntimeWarning, match=r"ddp_comm: not a DistributedDataParallel model \(Linear\)"):
        prof.start()
    other(torch.randn(2, 4)).sum().backward()
    prof.stop()
    assert prof.profile.meta["ddp_comm"] == {
        "note": "not a DistributedDataParallel model (Linear): no communication to time"}


# -- gathered profiles of ranks whose models differ ----------------------------------------------------------------
def test_a_module_of_different_classes_on_two_ranks_shows_both() -> None:
    # Rank 0 built Sequential(Linear, ReLU), rank 1 Sequential(Linear, Tanh, Linear): row "1" compared a ReLU with a
    # Tanh and called it "ReLU" in the table, the rows and the CSV.
    from layerprof.distributed.gather import GatheredProfile

    def row(name: str, kind: str, forward: float) -> dict:
        return {"name": name, "type": kind, "forward_ms": forward, "backward_ms": forward}

    rank0 = {"": row("", "Sequential", 3.0), "0": row("0", "Linear", 1.0), "1": row("1", "ReLU", 0.5)}
    rank1 = {"": row("", "Sequential", 4.0), "0": row("0", "Linear", 1.0), "1": row("1", "Tanh", 0.5),
             "2": row("2", "Linear", 1.0)}
    gathered = GatheredProfile([{"rank": 1, "rows": rank1, "meta": {}}, {"rank": 0, "rows": rank0, "meta": {}}])
    assert {name: module.type for name, module in gathered.modules.items()} == {
        "": "Sequential", "0": "Linear", "1": "ReLU | Tanh", "2": "Linear"}
    assert gathered.modules["1"].ranks == [0, 1] and gathered.modules["2"].ranks == [1]
    assert "  1      ReLU | Tanh" in gathered.table()


def test_the_gathered_table_says_which_ranks_ended_early() -> None:
    # A rank that raised and kept its completed steps (prof.stop(partial=...)) was compared with the others
    # without a word: its means are over fewer steps, and its last step is missing.
    from layerprof.distributed.gather import GatheredProfile

    rows = {"": {"name": "", "type": "Net", "forward_ms": 1.0, "backward_ms": 2.0}}
    gathered = GatheredProfile([{"rank": 0, "rows": rows, "meta": {"steps": 5}},
                                {"rank": 1, "rows": rows, "meta": {"steps": 2, "partial": "ValueError: bad batch"}}])
    lines = gathered.table().splitlines()
    assert lines[2] == "Rank 1: Partial profile (2 steps recorded): ValueError: bad batch"
    assert sum(line.startswith("Rank ") for line in lines) == 1
