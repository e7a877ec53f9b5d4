"""Trainer runs as users write them, beyond the plain fit: a summary printed from a callback while training, a
model the Trainer is handed compiled. Real Lightning and Hugging Face Trainers on CPU, a few tiny batches each."""
from __future__ import annotations

import warnings
from pathlib import Path

import pytest
import torch
from torch import nn

import layerprof
from layerprof.collect.profiler import _PROFILED

from .conftest import hook_state


def _hooks(module: nn.Module) -> dict:
    return {name: state[:-1] for name, state in hook_state(module).items()}


def _clean(module: nn.Module, before: dict) -> None:
    assert _hooks(module) == before  # every hook off
    assert not _PROFILED


# -- Lightning -------------------------------------------------------------------------------------------------------
def _lightning():
    return pytest.importorskip("lightning.pytorch")


def _net():
    pl = _lightning()

    class Net(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            torch.manual_seed(0)
            self.net = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))

        def training_step(self, batch, batch_idx):
            x, y = batch
            return nn.functional.mse_loss(self.net(x), y)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.01)

    return Net()


def _loader(batches: int) -> torch.utils.data.DataLoader:
    generator = torch.Generator().manual_seed(1)
    data = torch.utils.data.TensorDataset(torch.randn(4 * batches, 8, generator=generator),
                                          torch.randn(4 * batches, 1, generator=generator))
    return torch.utils.data.DataLoader(data, batch_size=4)


def _trainer(tmp_path: Path, profiler, **options):
    pl = _lightning()
    options = {"max_epochs": 1, "limit_val_batches": 0, **options}
    return pl.Trainer(profiler=profiler, default_root_dir=tmp_path, logger=False, enable_checkpointing=False,
                      enable_progress_bar=False, enable_model_summary=False, accelerator="cpu", **options)


def test_a_summary_printed_at_each_epochs_end_leaves_the_run_one_profile(tmp_path: Path) -> None:
    # summary() in a callback ended the run's profile at the first epoch's end: the next batch began a second one,
    # so 3 epochs of 3 batches under schedule(wait=1, active=4, repeat=1) gave two 2-batch profiles, two file pairs
    # and a warning that the run had 'resumed after 6'. It now leaves the running profile alone and says so.
    pl = _lightning()
    from layerprof.integrations.lightning import LayerProfProfiler

    summaries: list[str] = []

    class PrintsTheSummary(pl.Callback):
        def on_train_epoch_end(self, trainer, pl_module) -> None:
            summaries.append(trainer.profiler.summary())

        def on_train_end(self, trainer, pl_module) -> None:
            summaries.append(trainer.profiler.summary())  # training is over: this run's

    module = _net()
    before = _hooks(module)
    profiler = LayerProfProfiler(schedule=layerprof.schedule(wait=1, active=4, repeat=1))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _trainer(tmp_path, profiler, max_epochs=3, callbacks=[PrintsTheSummary()]).fit(module, _loader(3))
    assert [(p.meta["steps"], p.meta["schedule"]["first"]) for p in profiler.profiles] == [(4, 0)]
    assert sorted(path.name for path in tmp_path.glob("layerprof*")) == ["layerprof-rank0.json", "layerprof-rank0.txt"]
    assert summaries[:3] == ["", "", ""]  # no run had ended: the last finished run's summary is none
    assert summaries[3] == profiler.summary() and summaries[3].startswith("Step: forward")
    told = [str(w.message) for w in caught if "summary()" in str(w.message)]
    assert len(told) == 3 and "still training" in told[0] and "after trainer.fit" in told[0]
    assert not [w for w in caught if "resumed" in str(w.message)]
    _clean(module, before)


# -- the Hugging Face Trainer ----------------------------------------------------------------------------------------
def _transformers():
    pytest.importorskip("accelerate")
    return pytest.importorskip("transformers")


class _Tokens(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 16

    def __getitem__(self, index: int) -> dict:
        ids = torch.randint(0, 100, (8,), generator=torch.Generator().manual_seed(index))
        return {"input_ids": ids, "labels": torch.tensor(index % 2)}


def _bert():
    transformers = _transformers()
    torch.manual_seed(0)
    config = transformers.BertConfig(vocab_size=100, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                     intermediate_size=32, max_position_embeddings=16)
    return transformers.BertForSequenceClassification(config)


def _hf_trainer(model, folder: Path, callbacks: list, **options):
    transformers = _transformers()
    settings = {"per_device_train_batch_size": 2, "max_steps": 2, "report_to": [], "save_strategy": "no", **options}
    args = transformers.TrainingArguments(output_dir=str(folder), use_cpu=True, disable_tqdm=True, logging_steps=100,
                                          **settings)
    return transformers.Trainer(model=model, args=args, train_dataset=_Tokens(), callbacks=callbacks)


def test_a_trainer_handed_a_compiled_model_is_refused_as_training_begins_saying_what_to_hand_it(
        tmp_path: Path) -> None:
    # Trainer(model=torch.compile(model)) was refused at the first step with LayerProf's own advice,
    # 'Profile the eager module instead: LayerProf(compiled._orig_mod)', which a Trainer's user cannot follow.
    from layerprof.collect.compiled import RefusedModel
    from layerprof.integrations.transformers import LayerProfCallback

    model = _bert()
    before = _hooks(model)
    callback = LayerProfCallback()
    trainer = _hf_trainer(torch.compile(model, backend="eager"), tmp_path, [callback])
    began: list[int] = []
    trainer.add_callback(type("Steps", (_transformers().TrainerCallback,), {
        "on_step_begin": lambda self, args, state, control, **kwargs: began.append(state.global_step)}))
    with pytest.raises(RefusedModel, match=r"LayerProfCallback cannot profile a Trainer handed a torch\.compile'd "
                                           r"model \(BertForSequenceClassification\).*Trainer\(model=model\)"):
        trainer.train()
    assert began == []  # refused as training begins, before its first step
    _clean(model, before)
    assert callback.profile is None and not list(tmp_path.glob("layerprof*"))
